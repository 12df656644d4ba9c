// Package platformsim simulates the CDN platform's management API for tests,
// demos and `--simulate`: the OAuth2 token endpoint, the accounts service
// (organizations, properties, environments), the config service's TLS
// certificates (tlscerts.go), the metrics service (six
// datasets with deterministic, realistic data, late data and request
// validation) and the RTLD service with log delivery (rtld*.go, delivery*.go;
// the records are the requests the metrics count, log*.go),
// with optional faults (429, 5xx, latency; values that are not numbers and
// malformed rows in data answers; a clock ahead of or behind the client's),
// and the rate limits of spec section 8. Every answer carries Date (spec
// section 1) on the simulated clock. The API's limits come from the
// simulator's own table (limits.go), not from the client.
//
// Quick use:
//
//	srv, err := platformsim.New(platformsim.Config{Seed: 1})
//	base, err := srv.Start("127.0.0.1:0") // auth_url = api_url = base
//	defer srv.Close()
//
// or mount srv.Handler() in an httptest.Server (then call srv.Close when done
// to stop background work).
//
// For tests: Config.Now drives a simulated clock (token expiry, late data,
// which buckets exist) and Config.ClockOffset / SetClockOffset skew it;
// SetFaults, FailNext and RevokeTokens inject failures;
// Stats reports requests by route and status and every data request; Rows is
// the ground truth of the data endpoint; Environments, Properties and
// Organization describe the world.
//
// Data semantics the spec leaves open (see model.go and metrics.go):
// buckets are those whose start lies in [start, end) and has already come;
// without time_granularity the coarsest granularity whose longest range holds
// the range and whose bucket fits in it is used; dimensions left out are
// aggregated (counts summed, ratios and rates recomputed from the sums,
// percentiles averaged weighted by traffic); per-second rates divide by the
// whole bucket (without the time dimension: by every bucket of the range that
// has started), also for the bucket in progress; buckets older than the
// dataset's retention are left out; the bucket in progress is returned with
// the traffic so far, and every bucket keeps growing for Config.LateData after
// its end, then never changes.
package platformsim

// The RTLD service (rtld*.go, delivery*.go) is built on these unexported
// parts of the Server:
//
//   - routeRTLD(r chi.Router) in rtld.go is called once from New while the
//     router is built; r is the root router, so register full paths
//     ("/rtld/v1/..."). Wrap handlers with s.requireScope(scopeRTLD), which
//     checks the bearer token (401 Error object otherwise), applies the
//     rate limits of spec section 8 when Config.RateLimits is set, and the
//     configured faults; stats are recorded for every route automatically.
//   - writeError(w, status, code, title, description, details...) writes the
//     spec's Error object; ErrorDetail is its details[] item. writeJSON(w,
//     status, v) writes any other body.
//   - s.environment(id) (Environment, bool) finds an environment by ID
//     (environments can be added and removed at run time, see
//     AddEnvironment); s.w() is the current immutable snapshot of the world.
//   - s.spawn(func(ctx context.Context)) runs a background goroutine owned by
//     the Server: ctx is cancelled by Close, which waits for it to return.
//     spawn may be called from routeRTLD (i.e. during New) or later from a
//     handler; it returns false once the Server is closing.
//   - s.now() is the simulated clock (Config.Now).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
)

// Demo credentials: the client every default Server knows. The secret is not
// a secret: it is documented so the demo works with no set-up.
const (
	DemoClientID     = "edgepipe-demo"
	DemoClientSecret = "edgepipe-demo-secret"
)

// Scopes the simulated services require (platform notes).
const (
	ScopeMetrics  = "app.metrics"
	ScopeAccounts = "app.accounts"
	ScopeRTLD     = "app.rtld"
)

const scopeRTLD = ScopeRTLD

// Client is an API client the token endpoint accepts.
type Client struct {
	ID     string
	Secret string
	// Scopes granted to the client; a broader scope grants the ones beneath
	// it (`app` grants `app.metrics`).
	Scopes []string
}

// Faults are injected into API requests (not into the token endpoint), after
// authentication; the data faults (BadValues, MalformedRowRate) into the
// rows of data answers. The random source is seeded from Config.Seed.
type Faults struct {
	// Rate429 is the share of API requests answered 429 with Retry-After.
	Rate429 float64
	// RetryAfter is the Retry-After of a 429, rounded up to whole seconds
	// (default DefaultRetryAfter).
	RetryAfter time.Duration
	// Rate5xx is the share of API requests answered 500 or 503.
	Rate5xx float64
	// Latency delays every API response.
	Latency time.Duration
	// BadValues, when set, replaces a share (BadValueRate) of the metric
	// values of data rows by something that is not a value, as a
	// misbehaving platform would send.
	BadValues BadValue
	// BadValueRate is the share of metric values BadValues replaces
	// (default DefaultBadValueRate when BadValues is set; 1 replaces every
	// one).
	BadValueRate float64
	// MalformedRowRate is the share of data rows replaced by a malformed
	// row (in turn: one value too few, one value too many, an object
	// instead of an array). The row's bucket is missing from that answer.
	MalformedRowRate float64
}

// Defaults of Faults.
const (
	DefaultRetryAfter   = time.Second
	DefaultBadValueRate = 0.1
)

// withDefaults returns f with every unset field set to its default.
func (f Faults) withDefaults() Faults {
	if f.RetryAfter == 0 {
		f.RetryAfter = DefaultRetryAfter
	}
	if f.BadValues != "" && f.BadValueRate == 0 {
		f.BadValueRate = DefaultBadValueRate
	}
	return f
}

// validate reports every setting of f (with defaults applied) that cannot
// work.
func (f Faults) validate() error {
	var errs []error
	for _, r := range []struct {
		name string
		v    float64
	}{{"Rate429", f.Rate429}, {"Rate5xx", f.Rate5xx}, {"BadValueRate", f.BadValueRate}, {"MalformedRowRate", f.MalformedRowRate}} {
		if !(r.v >= 0 && r.v <= 1) {
			errs = append(errs, fmt.Errorf("%s %v: want a share from 0 to 1", r.name, r.v))
		}
	}
	if f.RetryAfter < 0 || f.Latency < 0 {
		errs = append(errs, fmt.Errorf("RetryAfter %s and Latency %s: must not be negative", f.RetryAfter, f.Latency))
	}
	switch f.BadValues {
	case "", BadNull, BadNaN, BadInfinity, BadNegative, BadText:
	default:
		errs = append(errs, fmt.Errorf("unknown BadValues %q", f.BadValues))
	}
	return errors.Join(errs...)
}

// BadValue is a kind of metric value that is not a value.
type BadValue string

// The kinds of BadValue.
const (
	BadNull     BadValue = "null"     // JSON null
	BadNaN      BadValue = "nan"      // the string "NaN"
	BadInfinity BadValue = "infinity" // the string "Infinity"
	BadNegative BadValue = "negative" // -12345, in counts (*_total) only
	BadText     BadValue = "text"     // the string "n/a"
)

// literal is how the kind is written into a row.
func (b BadValue) literal() string {
	switch b {
	case BadNull:
		return "null"
	case BadNaN:
		return `"NaN"`
	case BadInfinity:
		return `"Infinity"`
	case BadNegative:
		return "-12345"
	}
	return `"n/a"`
}

// NumberStyle says how data rows render numeric values.
type NumberStyle int

const (
	// NumbersMixed (the default) renders numbers as JSON numbers, except in
	// about one row in seven (chosen by a hash of the row) where every
	// numeric value is a numeric string, as the schema allows.
	NumbersMixed NumberStyle = iota
	// NumbersOnly renders every numeric value as a JSON number.
	NumbersOnly
	// NumbersAsStrings renders every numeric value as a string.
	NumbersAsStrings
)

// Config configures a Server. The zero value is a usable default world.
type Config struct {
	// Seed makes the world and all data deterministic.
	Seed int64
	// Now is the simulated clock; nil means time.Now.
	Now func() time.Time
	// ClockOffset is added to Now: the platform's clock runs this much
	// ahead of (negative: behind) the client's. It moves everything the
	// clock decides (which buckets exist, late data, token expiry) and the
	// Date header of every answer. See also SetClockOffset.
	ClockOffset time.Duration
	// TokenLifetime of issued access tokens (default DefaultTokenLifetime).
	TokenLifetime time.Duration
	// LateData is how long after a bucket ends its values keep changing
	// (default DefaultLateData). Negative means no late data at all.
	LateData time.Duration
	// Properties is the number of properties of the demo organization
	// (default DefaultProperties).
	Properties int
	// Environments is the total number of environments, spread over the
	// properties as evenly as possible, the first ones getting one more
	// (default DefaultEnvironments: 9+8+8).
	Environments int
	// TrafficScale multiplies the traffic of every environment (default 1:
	// about 1,100 edge requests per second in all for the default world).
	// It scales the one traffic model that the Metrics API counts and the
	// access logs record, so both stay consistent; below 1 it keeps the log
	// volume of a demo deliverable on a laptop.
	TrafficScale float64
	// Clients the token endpoint accepts (default: DemoClient with every
	// scope the simulator serves).
	Clients []Client
	// Faults injected from the start; see also SetFaults.
	Faults Faults
	// Numbers selects how numeric values are rendered in data rows.
	Numbers NumberStyle
	// RateLimits enforces the per-client rate limits of spec section 8
	// (accounts and config: 2,000 GET and 600 other requests per 5 minutes
	// each, on the simulated clock); exceeding one answers 429 with
	// Retry-After. The metrics and RTLD services have no documented limit
	// and get none.
	RateLimits bool
	// Logger, when set, logs every request at debug level (method, route,
	// status, duration) and rejected data requests at info level.
	Logger *slog.Logger
	// Delivery configures the RTLD log delivery engine (rtld.go).
	Delivery DeliveryConfig
}

// Server is the simulated platform. Create it with New; it serves with
// Handler or Start and must be Closed.
type Server struct {
	cfg      Config
	hash     hasher
	worldp   atomic.Pointer[world] // replaced, never modified, on changes
	offset   atomic.Int64          // clock offset, nanoseconds
	datasets []*datasetDesc
	dsByName map[string]*datasetDesc
	handler  http.Handler
	rtld     *rtldState // RTLD profiles and delivery engine (rtld.go)
	certs    *certState // TLS certificates (tlscerts.go)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex // guards everything below
	closing  bool
	faults   Faults
	failNext []int // statuses the next API requests answer
	rng      *rand.Rand
	tokens   map[string]token
	windows  map[string][]time.Time // rate-limit windows by client and class
	added    int                    // environments added by AddEnvironment
	stats    statsState
	httpSrv  *http.Server
	url      string
}

// Defaults of Config.
const (
	DefaultTokenLifetime = 300 * time.Second
	DefaultLateData      = 10 * time.Minute
	DefaultProperties    = 3
	DefaultEnvironments  = 25
	DefaultTrafficScale  = 1.0
	// MaxTrafficScale bounds Config.TrafficScale.
	MaxTrafficScale = 1000.0
)

// withDefaults returns c with every unset field set to its default (and a
// negative LateData as none).
func (c Config) withDefaults() Config {
	if c.TokenLifetime == 0 {
		c.TokenLifetime = DefaultTokenLifetime
	}
	if c.LateData == 0 {
		c.LateData = DefaultLateData
	} else if c.LateData < 0 {
		c.LateData = 0
	}
	if c.Properties == 0 {
		c.Properties = DefaultProperties
	}
	if c.Environments == 0 {
		c.Environments = DefaultEnvironments
	}
	if c.TrafficScale == 0 {
		c.TrafficScale = DefaultTrafficScale
	}
	if len(c.Clients) == 0 {
		c.Clients = []Client{DemoClient()}
	}
	c.Faults = c.Faults.withDefaults()
	c.Delivery = c.Delivery.withDefaults()
	return c
}

// validate reports every setting of c (with defaults applied) that cannot
// work.
func (c Config) validate() error {
	var errs []error
	if c.TokenLifetime < 0 {
		errs = append(errs, fmt.Errorf("TokenLifetime %s: must be positive", c.TokenLifetime))
	}
	if c.Properties < 0 || c.Environments < 0 {
		errs = append(errs, fmt.Errorf("%d properties and %d environments: must be positive", c.Properties, c.Environments))
	}
	if !(c.TrafficScale > 0 && c.TrafficScale <= MaxTrafficScale) {
		errs = append(errs, fmt.Errorf("TrafficScale %v: want more than 0 and at most %v", c.TrafficScale, MaxTrafficScale))
	}
	for _, cl := range c.Clients {
		if cl.ID == "" || cl.Secret == "" {
			errs = append(errs, fmt.Errorf("client %q: ID and secret are required", cl.ID))
		}
	}
	if err := c.Faults.validate(); err != nil {
		errs = append(errs, fmt.Errorf("faults: %w", err))
	}
	if err := c.Delivery.validate(); err != nil {
		errs = append(errs, fmt.Errorf("delivery: %w", err))
	}
	return errors.Join(errs...)
}

// New builds a Server from cfg.
func New(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("platform simulator: invalid configuration: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:      cfg,
		hash:     seedHash(cfg.Seed),
		datasets: buildDatasets(),
		dsByName: map[string]*datasetDesc{},
		ctx:      ctx,
		cancel:   cancel,
		faults:   cfg.Faults,
		rng:      rand.New(rand.NewPCG(uint64(cfg.Seed), 0x5eed)),
		tokens:   map[string]token{},
	}
	s.worldp.Store(buildWorld(cfg.Seed, cfg.Properties, cfg.Environments))
	s.offset.Store(int64(cfg.ClockOffset))
	s.certs = newCertState(s.now(), s.w())
	for _, d := range s.datasets {
		s.dsByName[d.Name] = d
	}
	s.handler = s.routes()
	return s, nil
}

// w returns the current world.
func (s *Server) w() *world { return s.worldp.Load() }

func (s *Server) now() time.Time {
	off := time.Duration(s.offset.Load())
	if s.cfg.Now != nil {
		return s.cfg.Now().Add(off).UTC()
	}
	return time.Now().Add(off).UTC()
}

// Now returns the platform's current time: Config.Now (or the wall clock)
// plus the clock offset. Tests pass it to Rows as the time of asking.
func (s *Server) Now() time.Time { return s.now() }

// SetClockOffset sets how far the platform's clock runs ahead of (negative:
// behind) Config.Now from now on; a change is a jump of the platform's
// clock.
func (s *Server) SetClockOffset(d time.Duration) { s.offset.Store(int64(d)) }

func (s *Server) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(s.record)
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "Method Not Allowed",
			fmt.Sprintf("%s is not supported on %s.", r.Method, r.URL.Path))
	})
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "Not Found", fmt.Sprintf("No resource at %s.", r.URL.Path))
	})
	r.Post("/connect/token", s.handleToken)
	s.routeAccounts(r)
	s.routeMetrics(r)
	s.routeConfig(r)
	s.routeRTLD(r)
	return r
}

// Handler serves the token endpoint (/connect/token) and the API on one
// origin: in the simulator auth_url equals base_url.
func (s *Server) Handler() http.Handler { return s.handler }

// Start listens on addr (e.g. "127.0.0.1:0"), serves in a goroutine owned by
// the Server and returns the base URL ("http://127.0.0.1:PORT"), which is both
// the API's base_url and auth_url.
func (s *Server) Start(addr string) (string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("platformsim: listen on %s: %w", addr, err)
	}
	hs := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return s.ctx }}
	s.mu.Lock()
	if s.closing || s.httpSrv != nil {
		s.mu.Unlock()
		l.Close()
		return "", errors.New("platformsim: server already started or closed")
	}
	s.httpSrv = hs
	s.url = "http://" + l.Addr().String()
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = hs.Serve(l) // returns http.ErrServerClosed after Close
	}()
	return s.URL(), nil
}

// URL is the base URL after Start ("" before).
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url
}

// Close stops the HTTP server started by Start (if any) and every background
// goroutine, and waits for them. It is safe to call more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closing = true
	hs := s.httpSrv
	s.mu.Unlock()
	// Cancelling first ends background work and in-flight requests that
	// wait (injected latency) promptly; Shutdown then drains the rest.
	s.cancel()
	var err error
	if hs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = hs.Shutdown(ctx)
		cancel()
		if err != nil {
			err = hs.Close()
		}
	}
	s.wg.Wait()
	if err != nil {
		return fmt.Errorf("platformsim: close HTTP server: %w", err)
	}
	return nil
}

// spawn runs fn in a goroutine owned by the Server; fn's ctx ends at Close,
// which waits for fn to return. It reports false (and does not run fn) once
// the Server is closing.
func (s *Server) spawn(fn func(ctx context.Context)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn(s.ctx)
	}()
	return true
}

// SetFaults replaces the faults injected into API requests.
func (s *Server) SetFaults(f Faults) {
	s.mu.Lock()
	s.faults = f.withDefaults()
	s.mu.Unlock()
}

// FailNext makes the next n API requests (after authentication) answer
// status; a 429 carries Retry-After from Faults.RetryAfter.
func (s *Server) FailNext(n int, status int) {
	s.mu.Lock()
	for i := 0; i < n; i++ {
		s.failNext = append(s.failNext, status)
	}
	s.mu.Unlock()
}

// Environments returns every environment of the world, ordered by property.
func (s *Server) Environments() []Environment {
	w := s.w()
	out := make([]Environment, len(w.envs))
	copy(out, w.envs)
	for i := range out {
		out[i].Origins = append([]string(nil), out[i].Origins...)
	}
	return out
}

// EnvironmentIDs returns the IDs of Environments, in the same order.
func (s *Server) EnvironmentIDs() []string {
	w := s.w()
	out := make([]string, len(w.envs))
	for i, e := range w.envs {
		out[i] = e.ID
	}
	return out
}

// Properties returns every property of the demo organization.
func (s *Server) Properties() []Property {
	return append([]Property(nil), s.w().properties...)
}

// Organization returns the demo organization.
func (s *Server) Organization() Organization { return s.w().org }

// environment finds an environment by ID.
func (s *Server) environment(id string) (Environment, bool) {
	w := s.w()
	i, ok := w.envByID[id]
	if !ok {
		return Environment{}, false
	}
	return w.envs[i], true
}

// ErrorDetail is one entry of the Error object's details.
type ErrorDetail struct {
	Type        string `json:"@type"`
	Source      string `json:"source"`
	Description string `json:"description"`
}

// detail builds an ErrorDetail.
func detail(source, description string) ErrorDetail {
	return ErrorDetail{Type: "ErrorDetail", Source: source, Description: description}
}

type errorBody struct {
	Type        string        `json:"@type"`
	Code        string        `json:"code"`
	StatusCode  int           `json:"status_code"`
	Title       string        `json:"title"`
	Description string        `json:"description"`
	Details     []ErrorDetail `json:"details"`
}

// writeError writes the spec's Error object (section 7).
func writeError(w http.ResponseWriter, status int, code, title, description string, details ...ErrorDetail) {
	if details == nil {
		details = []ErrorDetail{}
	}
	writeJSON(w, status, errorBody{Type: "Error", Code: code, StatusCode: status, Title: title, Description: description, Details: details})
}

// writeJSON writes v as the JSON body with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
