package platformsim

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
)

// This file serves the config service's TLS certificate endpoints (spec 2.6,
// 4.2; scope app.config):
//
//	GET /config/v0.1/tls-certs?environment_id=&page=&page_size=
//	GET /config/v0.1/tls-certs/{cert_id}
//
// The list is the paginated envelope of spec 2.1, ordered by certificate ID;
// environment_id is required (400 without it, 404 for an environment the
// world does not have). With Config.RateLimits both count against the config
// service's 2,000 GET per 5 minutes.
//
// Every environment's certificates are a pure function of the seed, the
// environment's ID and the anchor (the start of the UTC day on the simulated
// clock when the Server was created; expiry dates are relative to it, so a
// simulator started on another day keeps certificates that expire "in days"):
//
//   - an uploaded certificate (generated false) for the environment's
//     hostname (from its default domain name, so a rename keeps it),
//     expiring in 1 to 14 months;
//   - for about 60 % of environments a generated one (a 90-day certificate
//     from a public authority) for www.<hostname>, expiring in 1 to 89 days;
//   - for about 5 % a generated one whose activation failed (status
//     "failed", activation_error set).
//
// The first environment of the world as created always has a generated
// certificate expiring in 9 days, and the second one whose activation
// failed, so a default world shows every case. AddTLSCertificates adds more
// (generated) certificates to an environment, for lists longer than a page.

const configBase = "/config/v0.1"

// ScopeConfig is the config service's scope (spec 5.2).
const ScopeConfig = "app.config"

// Statuses of the simulated certificates (spec section 3: free strings).
const (
	CertificateActive = "active"
	CertificateFailed = "failed"
)

// TLSCertificate is a TLS certificate of the simulated world (spec 2.6).
type TLSCertificate struct {
	ID               string
	EnvironmentID    string
	PrimaryCert      string
	IntermediateCert string
	Status           string
	Serial           string
	CommonName       string
	ActivationError  string
	Expiration       time.Time
	CreatedAt        time.Time
	UpdatedAt        time.Time
	Generated        bool
	AlternativeNames []string
}

// certState holds what the certificates derive from and those added later.
type certState struct {
	anchor  time.Time // start of the UTC day the Server was created
	expires string    // ID of the environment with a certificate expiring in 9 days
	fails   string    // ID of the environment with a failed activation

	mu    sync.Mutex
	added map[string][]TLSCertificate // by environment ID
	n     int                         // certificates added so far
}

func newCertState(now time.Time, w *world) *certState {
	cs := &certState{anchor: now.UTC().Truncate(24 * time.Hour), added: map[string][]TLSCertificate{}}
	if len(w.envs) > 0 {
		cs.expires = w.envs[0].ID
	}
	if len(w.envs) > 1 {
		cs.fails = w.envs[1].ID
	}
	return cs
}

func (s *Server) routeConfig(r chi.Router) {
	r.Group(func(r chi.Router) {
		r.Use(s.requireScope(ScopeConfig))
		r.Get(configBase+"/tls-certs", s.handleTLSCertificates)
		r.Get(configBase+"/tls-certs/{id}", s.handleTLSCertificate)
	})
}

// TLSCertificates returns the certificates of an environment as the list
// endpoint serves them (ordered by ID); false for an unknown environment.
func (s *Server) TLSCertificates(environmentID string) ([]TLSCertificate, bool) {
	env, ok := s.environment(environmentID)
	if !ok {
		return nil, false
	}
	return s.certificatesOf(env), true
}

// AddTLSCertificates adds n generated certificates to an environment, as
// the "Generate TLS certificates" operation does for n eligible hostnames,
// each expiring in 60 to 89 days. They are derived from the seed and the
// number of certificates added so far.
func (s *Server) AddTLSCertificates(environmentID string, n int) ([]TLSCertificate, error) {
	env, ok := s.environment(environmentID)
	if !ok {
		return nil, fmt.Errorf("platformsim: unknown environment %q", environmentID)
	}
	host := s.hostname(env)
	cs := s.certs
	cs.mu.Lock()
	defer cs.mu.Unlock()
	out := make([]TLSCertificate, 0, n)
	for range n {
		cs.n++
		h := s.hash.s("tls-added").i(int64(cs.n))
		name := fmt.Sprintf("h%d.%s", cs.n, host)
		c := s.newCertificate(h, env.ID, name, true, time.Duration(60+h.s("days").u()*29)*24*time.Hour)
		out = append(out, c)
	}
	cs.added[env.ID] = append(cs.added[env.ID], out...)
	return out, nil
}

// hostname is the environment's public hostname, from its default domain
// name (<slug>-<name>.example-edge.link gives <slug>-<name>.example.com): a
// certificate's names are fixed when it is issued, so renaming the
// environment does not change them.
func (s *Server) hostname(env Environment) string {
	first, _, _ := strings.Cut(env.DefaultDomainName, ".")
	if first == "" {
		first = env.ID
	}
	return first + ".example.com"
}

// certificatesOf derives env's certificates and appends those added.
func (s *Server) certificatesOf(env Environment) []TLSCertificate {
	h := s.hash.s("tls").s(env.ID)
	host := s.hostname(env)
	cs := s.certs
	day := 24 * time.Hour
	out := []TLSCertificate{
		s.newCertificate(h.s("uploaded"), env.ID, host, false, time.Duration(30+h.s("months").u()*400)*day),
	}
	switch {
	case env.ID == cs.expires:
		out = append(out, s.newCertificate(h.s("generated"), env.ID, "www."+host, true, 9*day))
	case h.s("has-generated").u() < 0.6:
		out = append(out, s.newCertificate(h.s("generated"), env.ID, "www."+host, true, time.Duration(1+h.s("days").u()*88)*day))
	}
	if env.ID == cs.fails || h.s("has-failed").u() < 0.05 {
		c := s.newCertificate(h.s("failed"), env.ID, "static."+host, true, 90*day)
		c.Status = CertificateFailed
		c.ActivationError = "domain control not shown: no CNAME record _acme_challenge.static." + host + " found"
		out = append(out, c)
	}
	cs.mu.Lock()
	out = append(out, cs.added[env.ID]...)
	cs.mu.Unlock()
	for i := range out {
		out[i].AlternativeNames = slices.Clone(out[i].AlternativeNames)
	}
	slices.SortFunc(out, func(a, b TLSCertificate) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// newCertificate derives one certificate for host from h, expiring left
// after the anchor plus a fraction of a day (so expiry times are not round).
// A generated certificate lives 90 days, an uploaded one a year more than it
// has left.
func (s *Server) newCertificate(h hasher, envID, host string, generated bool, left time.Duration) TLSCertificate {
	exp := s.certs.anchor.Add(left).Add(time.Duration(h.s("second").u()*86400) * time.Second)
	life := 90 * 24 * time.Hour
	if !generated {
		life = left + 365*24*time.Hour
	}
	created := exp.Add(-life)
	var serial [16]byte
	for i := range serial {
		serial[i] = byte(h.s("serial").i(int64(i)).u() * 256)
	}
	return TLSCertificate{
		ID:               uuidFrom(h.s("id")),
		EnvironmentID:    envID,
		PrimaryCert:      pem("CERTIFICATE", host, serial[:]),
		IntermediateCert: pem("CERTIFICATE", "Example Edge Intermediate CA", nil),
		Status:           CertificateActive,
		Serial:           strings.ToUpper(hex.EncodeToString(serial[:])),
		CommonName:       host,
		Expiration:       exp,
		CreatedAt:        created,
		UpdatedAt:        created,
		Generated:        generated,
		AlternativeNames: []string{host},
	}
}

// pem renders a PEM block. Its content is a placeholder naming the
// certificate, not a parseable certificate: the simulator serves the
// fields of spec 2.6, and nothing in edgepipe reads the PEM.
func pem(kind, subject string, serial []byte) string {
	body := base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("edgepipe simulator placeholder: %s %x", subject, serial)))
	var b strings.Builder
	b.WriteString("-----BEGIN " + kind + "-----\n")
	for len(body) > 64 {
		b.WriteString(body[:64] + "\n")
		body = body[64:]
	}
	b.WriteString(body + "\n-----END " + kind + "-----\n")
	return b.String()
}

func certJSON(c TLSCertificate) map[string]any {
	return map[string]any{
		"@type":             "TLSCertificate",
		"@id":               configBase + "/tls-certs/" + c.ID,
		"@links":            map[string]any{"environment": map[string]string{"href": accountsBase + "/environments/" + c.EnvironmentID}},
		"id":                c.ID,
		"environment_id":    c.EnvironmentID,
		"primary_cert":      c.PrimaryCert,
		"intermediate_cert": c.IntermediateCert,
		"status":            c.Status,
		"serial":            c.Serial,
		"common_name":       c.CommonName,
		"activation_error":  c.ActivationError,
		"expiration":        ts(c.Expiration),
		"created_at":        ts(c.CreatedAt),
		"updated_at":        ts(c.UpdatedAt),
		"generated":         c.Generated,
		"alternative_names": c.AlternativeNames,
	}
}

func (s *Server) handleTLSCertificates(w http.ResponseWriter, r *http.Request) {
	handleList(w, r, configBase+"/tls-certs", "environment_id", "environment", func(id string) ([]any, bool) {
		certs, ok := s.TLSCertificates(id)
		if !ok {
			return nil, false
		}
		items := make([]any, len(certs))
		for i, c := range certs {
			items[i] = certJSON(c)
		}
		return items, true
	})
}

func (s *Server) handleTLSCertificate(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	for _, env := range s.w().envs {
		for _, c := range s.certificatesOf(env) {
			if c.ID == id {
				writeJSON(w, http.StatusOK, certJSON(c))
				return
			}
		}
	}
	notFound(w, "TLS certificate", id)
}
