package platformsim

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// DemoOrganizationID is the ID of the one organization the simulator serves.
// It does not depend on the seed, so docs and scripts can name it; the IDs of
// properties and environments are derived from the seed.
const DemoOrganizationID = "7c1e5a0d-3b94-4f26-8d1a-5e0b9c2f4a61"

// Organization is an organization of the simulated world (spec 2.7).
type Organization struct {
	ID                  string
	PartnerID           string
	Name                string
	PCIDNSDomainName    string
	NonPCIDNSDomainName string
	CreatedAt           time.Time
	UpdatedAt           time.Time
}

// Property is a property of the simulated world (spec 2.7).
type Property struct {
	ID             string
	OrganizationID string
	Slug           string
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

// Environment is an environment of the simulated world (spec 2.7).
type Environment struct {
	ID                       string
	PropertyID               string
	LegacyAccountNumber      string
	Name                     string
	DefaultDomainName        string
	DNSDomainName            string
	CanMembersDeploy         bool
	OnlyMaintainersCanDeploy bool
	HTTPRequestLogging       bool
	PCICompliance            bool
	CreatedAt                time.Time
	UpdatedAt                time.Time
	// Origins are the origin_name values the environment's traffic uses.
	Origins []string
}

// world is the simulated account tree plus the traffic model of every
// environment. It is built once from the seed and never changes.
type world struct {
	org        Organization
	properties []Property
	envs       []Environment
	envByID    map[string]int
	propByID   map[string]int
	models     []envModel
}

// envModel holds the traffic parameters of one environment.
type envModel struct {
	peakRPS    float64   // edge requests per second at the daily peak
	phase      float64   // hours added to every country's local time
	hitBase    float64   // cache hit ratio of 2xx responses
	staleFrac  float64   // share of requests served stale
	errBase    float64   // 5xx share outside bursts
	prefetch   float64   // share of requests that are prefetches
	avgBytes   float64   // mean 2xx response size
	latency    float64   // factor on edge latency
	originMs   float64   // origin TTFB median
	weekendDip float64   // traffic lost on Saturdays and Sundays
	countryW   []float64 // per country, normalised
	originW    []float64 // per origin, normalised
}

var (
	propertySlugs = []string{"storefront", "api-gateway", "media-cdn", "docs-site", "checkout", "mobile-backend", "marketing", "status-page"}
	envNames      = []string{"production", "staging", "development", "eu-production", "us-production", "apac-production", "canary", "qa", "preview", "load-test", "sandbox", "hotfix"}
	originNames   = []string{"origin-primary", "origin-backup", "s3-assets", "image-service", "api-backend"}
)

// uuidFrom formats 16 bytes of the hash as an RFC 4122 version-4 UUID.
func uuidFrom(h hasher) string {
	a := mix64(uint64(h.i(11)))
	b := mix64(uint64(h.i(12)))
	a = (a &^ (0xf << 12)) | (0x4 << 12)         // version 4
	b = (b &^ (0x3 << 62)) | (uint64(0x2) << 62) // variant 10
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", a>>32, (a>>16)&0xffff, a&0xffff, b>>48, b&0xffffffffffff)
}

func buildWorld(seed int64, properties, environments int) *world {
	root := seedHash(seed).s("world")
	base := time.Date(2024, 3, 4, 9, 30, 0, 0, time.UTC)
	w := &world{
		org: Organization{
			ID:                  DemoOrganizationID,
			PartnerID:           uuidFrom(root.s("partner")),
			Name:                "Edgepipe Demo",
			PCIDNSDomainName:    "edgepipe-demo.pci.example-edge.net",
			NonPCIDNSDomainName: "edgepipe-demo.example-edge.net",
			CreatedAt:           base,
			UpdatedAt:           base.Add(400 * 24 * time.Hour),
		},
		envByID:  map[string]int{},
		propByID: map[string]int{},
	}
	if properties < 1 {
		properties = 1
	}
	if environments < properties {
		environments = properties
	}
	acct := 1000 + int(root.s("acct").u()*8000)
	for p := 0; p < properties; p++ {
		ph := root.s("property").i(int64(p))
		slug := propertySlugs[p%len(propertySlugs)]
		if p >= len(propertySlugs) {
			slug = fmt.Sprintf("%s-%d", slug, p/len(propertySlugs)+1)
		}
		created := base.Add(time.Duration(p*17+3) * 24 * time.Hour)
		prop := Property{
			ID:             uuidFrom(ph),
			OrganizationID: w.org.ID,
			Slug:           slug,
			CreatedAt:      created,
			UpdatedAt:      created.Add(time.Duration(30+p) * 24 * time.Hour),
		}
		w.propByID[prop.ID] = len(w.properties)
		w.properties = append(w.properties, prop)
		n := environments / properties
		if p < environments%properties {
			n++
		}
		for e := 0; e < n; e++ {
			eh := ph.s("environment").i(int64(e))
			name := envNames[e%len(envNames)]
			if e >= len(envNames) {
				name = fmt.Sprintf("%s-%d", name, e/len(envNames)+1)
			}
			acct++
			ec := created.Add(time.Duration(e*5+1) * 24 * time.Hour)
			env := Environment{
				ID:                       uuidFrom(eh),
				PropertyID:               prop.ID,
				LegacyAccountNumber:      strconv.Itoa(acct),
				Name:                     name,
				DefaultDomainName:        fmt.Sprintf("%s-%s.example-edge.link", slug, strings.ReplaceAll(name, "_", "-")),
				DNSDomainName:            fmt.Sprintf("%s-%s.edge.example-edge.net", slug, strings.ReplaceAll(name, "_", "-")),
				CanMembersDeploy:         e != 0,
				OnlyMaintainersCanDeploy: e == 0,
				HTTPRequestLogging:       eh.s("logging").u() < 0.3,
				PCICompliance:            slug == "checkout",
				CreatedAt:                ec,
				UpdatedAt:                ec.Add(time.Duration(eh.s("upd").u()*200) * 24 * time.Hour),
			}
			m := newEnvModel(eh, name)
			no := 2 + int(eh.s("norigins").u()*3) // 2..4
			off := int(eh.s("origin-off").u() * float64(len(originNames)))
			for k := 0; k < no; k++ {
				env.Origins = append(env.Origins, originNames[(off+k)%len(originNames)])
				wgt := 1.0
				if k == 0 {
					wgt = 6
				}
				m.originW = append(m.originW, wgt*(0.5+eh.s("ow").i(int64(k)).u()))
			}
			normalise(m.originW)
			w.envByID[env.ID] = len(w.envs)
			w.envs = append(w.envs, env)
			w.models = append(w.models, m)
		}
	}
	return w
}

func newEnvModel(h hasher, name string) envModel {
	var peak float64
	switch {
	case strings.Contains(name, "production"):
		peak = 40 * math.Exp(2.2*h.s("size").u()) // 40..360 rps
		if name == "production" {
			peak *= 2.5
		}
	case name == "staging" || name == "canary" || name == "load-test":
		peak = 1 + 8*h.s("size").u()
	default:
		peak = 0.05 + 0.6*h.s("size").u() // tiny: many empty buckets
	}
	m := envModel{
		peakRPS:    peak,
		phase:      (h.s("phase").u() - 0.5) * 4,
		hitBase:    0.82 + 0.15*h.s("hit").u(),
		staleFrac:  0.003 + 0.02*h.s("stale").u(),
		errBase:    0.0003 + 0.002*h.s("err").u(),
		prefetch:   0.01 + 0.03*h.s("prefetch").u(),
		avgBytes:   12000 + 60000*h.s("bytes").u(),
		latency:    0.8 + 0.5*h.s("lat").u(),
		originMs:   60 + 180*h.s("origin-ms").u(),
		weekendDip: 0.25 * h.s("weekend").u(),
	}
	m.countryW = make([]float64, len(countries))
	for i, c := range countries {
		m.countryW[i] = c.weight * math.Exp(0.3*h.s("cw").i(int64(i)).z())
	}
	normalise(m.countryW)
	return m
}

func normalise(w []float64) {
	var s float64
	for _, x := range w {
		s += x
	}
	if s == 0 {
		return
	}
	for i := range w {
		w[i] /= s
	}
}

// country is one value of the country_code dimension with its traffic share,
// UTC offset (for the daily curve) and distance factor (for latency).
type country struct {
	code    string
	weight  float64
	tz      float64
	latency float64 // edge TTFB median in ms
}

var countries = []country{
	{"us", 0.30, -5, 18}, {"de", 0.09, 1, 22}, {"gb", 0.08, 0, 20}, {"fr", 0.06, 1, 24},
	{"jp", 0.07, 9, 30}, {"br", 0.05, -3, 45}, {"in", 0.06, 5.5, 60}, {"ca", 0.04, -5, 22},
	{"au", 0.03, 10, 40}, {"nl", 0.03, 1, 20}, {"es", 0.03, 1, 28}, {"it", 0.03, 1, 28},
	{"sg", 0.015, 8, 35}, {"za", 0.01, 2, 70}, {"-", 0.02, 0, 50},
}

// clone returns a copy of w that can be changed without affecting readers of w.
func (w *world) clone() *world {
	c := &world{
		org:        w.org,
		properties: append([]Property(nil), w.properties...),
		envs:       append([]Environment(nil), w.envs...),
		models:     append([]envModel(nil), w.models...),
	}
	c.reindex()
	return c
}

func (w *world) reindex() {
	w.envByID = make(map[string]int, len(w.envs))
	for i, e := range w.envs {
		w.envByID[e.ID] = i
	}
	w.propByID = make(map[string]int, len(w.properties))
	for i, p := range w.properties {
		w.propByID[p.ID] = i
	}
}

var envNameRe = regexp.MustCompile(`^[a-z0-9_-]+$`)

// changeWorld applies f to a copy of the world and publishes the copy.
func (s *Server) changeWorld(f func(w *world) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.w().clone()
	if err := f(c); err != nil {
		return err
	}
	c.reindex()
	s.worldp.Store(c)
	return nil
}

// AddEnvironment creates an environment named name in property propertyID,
// with an ID and traffic derived from the seed and the number of
// environments added so far, as the console would. The accounts API lists it
// and the metrics API serves data for it from then on.
func (s *Server) AddEnvironment(propertyID, name string) (Environment, error) {
	if !envNameRe.MatchString(name) {
		return Environment{}, fmt.Errorf("platformsim: environment name %q may hold only lowercase letters, digits, dashes and underscores", name)
	}
	var env Environment
	err := s.changeWorld(func(w *world) error {
		pi, ok := w.propByID[propertyID]
		if !ok {
			return fmt.Errorf("platformsim: unknown property %q", propertyID)
		}
		prop := w.properties[pi]
		s.added++
		h := seedHash(s.cfg.Seed).s("world").s("added").i(int64(s.added))
		now := s.now()
		env = Environment{
			ID:                  uuidFrom(h),
			PropertyID:          prop.ID,
			LegacyAccountNumber: strconv.Itoa(20000 + s.added),
			Name:                name,
			DefaultDomainName:   fmt.Sprintf("%s-%s.example-edge.link", prop.Slug, strings.ReplaceAll(name, "_", "-")),
			DNSDomainName:       fmt.Sprintf("%s-%s.edge.example-edge.net", prop.Slug, strings.ReplaceAll(name, "_", "-")),
			CanMembersDeploy:    true,
			CreatedAt:           now.Truncate(time.Second),
			UpdatedAt:           now.Truncate(time.Second),
		}
		m := newEnvModel(h, name)
		env.Origins = []string{originNames[0], originNames[2]}
		m.originW = []float64{0.8, 0.2}
		// Keep environments grouped by property.
		at := len(w.envs)
		for i := len(w.envs) - 1; i >= 0; i-- {
			if w.envs[i].PropertyID == prop.ID {
				at = i + 1
				break
			}
		}
		w.envs = append(w.envs[:at], append([]Environment{env}, w.envs[at:]...)...)
		w.models = append(w.models[:at], append([]envModel{m}, w.models[at:]...)...)
		return nil
	})
	return env, err
}

// RemoveEnvironment deletes an environment, as DELETE
// /accounts/v0.1/environments/{id} does: it disappears from the accounts API
// and data requests naming it are rejected as unknown.
func (s *Server) RemoveEnvironment(id string) (Environment, bool) {
	var env Environment
	err := s.changeWorld(func(w *world) error {
		i, ok := w.envByID[id]
		if !ok {
			return errors.New("unknown environment")
		}
		env = w.envs[i]
		w.envs = append(w.envs[:i], w.envs[i+1:]...)
		w.models = append(w.models[:i], w.models[i+1:]...)
		return nil
	})
	return env, err == nil
}
