package rtld

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/edgepipe/edgepipe/internal/platform"
)

// Profile registration: the receiver owns one http_post access-log profile
// per environment, found by name.
//
// The password is write-only on the platform, so it cannot be compared. The
// Registrar therefore updates (PUT) each environment's profile once when it
// starts, whatever the profile looks like, so that a rotated
// EDGEPIPE_RTLD_PASSWORD takes effect at the next restart; after that it
// writes only when a comparable setting drifted. Every
// replica does the same with the same settings, so replicas agree.

// DefaultProfileName is the profile name the receiver owns by default.
const DefaultProfileName = "edgepipe"

// DefaultRegisterInterval is how often profiles are re-checked by default.
const DefaultRegisterInterval = 5 * time.Minute

// profilesPath is the profile collection of the RTLD service.
const profilesPath = "/accesslogs/profiles"

// listPageSize is the limit used to walk RTLD lists.
const listPageSize = 100

// maxListPages bounds a list walk against a server that never ends it.
const maxListPages = 1000

// ProfileAPI is the RTLD service as the Registrar needs it;
// (*platform.Service).Do from platform.Client.RTLD() satisfies it.
type ProfileAPI interface {
	Do(ctx context.Context, method, path string, query url.Values, in, out any) error
}

// RegistrationResult is what one check of one environment's profile did.
type RegistrationResult string

// Registration results, as reported to a RegistrationObserver.
const (
	// RegistrationCreated: no profile of that name existed; it was created.
	RegistrationCreated RegistrationResult = "created"
	// RegistrationUpdated: the profile was written without known drift (the
	// first check after start), to set the password.
	RegistrationUpdated RegistrationResult = "updated"
	// RegistrationRepaired: the profile had drifted (edited, disabled, a
	// field added to the platform) and was written back.
	RegistrationRepaired RegistrationResult = "repaired"
	// RegistrationUnchanged: the profile matched; nothing was written.
	RegistrationUnchanged RegistrationResult = "unchanged"
	// RegistrationFailed: the check or the write failed; it is retried.
	RegistrationFailed RegistrationResult = "error"
)

// RegistrationObserver is told the result of every check of every
// environment, for self-metrics. Implementations must be safe for concurrent
// use and must not block.
type RegistrationObserver interface {
	ObserveRegistration(environmentID string, result RegistrationResult)
}

// RegistrarConfig configures a Registrar. EnvironmentIDs, PublicURL,
// Username and Password are required.
type RegistrarConfig struct {
	// EnvironmentIDs are the environments to register a profile in.
	EnvironmentIDs []string
	// ProfileName is the name of the profile the receiver owns in each
	// environment (default DefaultProfileName, at most 36 characters).
	ProfileName string
	// PublicURL is the https base URL the platform reaches the receiver at;
	// each profile's destination_endpoint is PublicURL + /ingest/<env>.
	PublicURL string
	// Username and Password are the http_basic credentials written into
	// every profile (never logged).
	Username string
	Password string
	// Fields are the log-field codes to request; empty means every field
	// the platform's fields API lists (re-read at every check, so fields
	// the platform adds are picked up).
	Fields []string
	// Description is written on create (default
	// DefaultProfileDescription); a description edited later is kept.
	Description string
	// DownsamplingPercent, when set, is the profile's downsampling_percent
	// (one of DownsamplingPercents). Unset keeps the one the profile has:
	// sampling is the operator's cost decision, never reverted as drift.
	DownsamplingPercent *float64
	// Interval between checks of Run (default DefaultRegisterInterval).
	Interval time.Duration
	// Logger receives creates, repairs and failures (default: discard).
	Logger *slog.Logger
	// Observer, when set, is told the result of every check.
	Observer RegistrationObserver
}

// DownsamplingPercents are the values the platform accepts for a profile's
// downsampling_percent (spec 2.9).
var DownsamplingPercents = []float64{0.1, 1, 25, 50, 75}

// String renders the configuration without the password.
func (c RegistrarConfig) String() string {
	pw := "<empty>"
	if c.Password != "" {
		pw = "<redacted>"
	}
	return fmt.Sprintf("rtld.RegistrarConfig{EnvironmentIDs:%q ProfileName:%q PublicURL:%q Username:%q Password:%s Fields:%d Interval:%s}",
		c.EnvironmentIDs, c.ProfileName, c.PublicURL, c.Username, pw, len(c.Fields), c.Interval)
}

// LogValue renders the configuration for slog without the password.
func (c RegistrarConfig) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Registrar creates, checks and repairs the receiver's profile in every
// configured environment. Call Run (or Reconcile on a schedule of your own);
// it is safe for concurrent use.
type Registrar struct {
	api ProfileAPI
	cfg RegistrarConfig
	log *slog.Logger

	mu      sync.Mutex
	written map[string]bool // environments written since start
}

// DefaultProfileDescription is the description written on create.
const DefaultProfileDescription = "Managed by edgepipe rtld-receiver: edits are reverted."

// maxProfileNameRunes is the platform's limit on profile names.
const maxProfileNameRunes = 36

// withDefaults returns c with every unset field set to its default.
func (c RegistrarConfig) withDefaults() RegistrarConfig {
	if c.ProfileName == "" {
		c.ProfileName = DefaultProfileName
	}
	if c.Description == "" {
		c.Description = DefaultProfileDescription
	}
	if c.Interval == 0 {
		c.Interval = DefaultRegisterInterval
	}
	return c
}

// validate reports every setting of c (with defaults applied) that cannot
// work.
func (c RegistrarConfig) validate() error {
	var errs []error
	if n := utf8.RuneCountInString(c.ProfileName); n > maxProfileNameRunes {
		errs = append(errs, fmt.Errorf("profile name %q is %d characters, the platform allows %d", c.ProfileName, n, maxProfileNameRunes))
	}
	if !slices.ContainsFunc(c.EnvironmentIDs, func(e string) bool { return strings.TrimSpace(e) != "" }) {
		errs = append(errs, errors.New("no environment IDs to register a profile in"))
	}
	if u, err := url.Parse(strings.TrimSpace(c.PublicURL)); err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		errs = append(errs, fmt.Errorf("public URL %q: the platform delivers only to https://host[/path] URLs", c.PublicURL))
	}
	if c.Username == "" || c.Password == "" {
		errs = append(errs, errors.New("EDGEPIPE_RTLD_USERNAME and EDGEPIPE_RTLD_PASSWORD are required to register profiles"))
	}
	if strings.Contains(c.Username, ":") {
		errs = append(errs, errors.New("the RTLD username must not contain a colon (HTTP basic auth)"))
	}
	if p := c.DownsamplingPercent; p != nil && !slices.Contains(DownsamplingPercents, *p) {
		errs = append(errs, fmt.Errorf("downsampling percent %v: the platform accepts %v", *p, DownsamplingPercents))
	}
	errs = append(errs, positive("Interval", c.Interval))
	return errors.Join(errs...)
}

// NewRegistrar validates cfg and returns a Registrar that talks to api.
func NewRegistrar(api ProfileAPI, cfg RegistrarConfig) (*Registrar, error) {
	if api == nil {
		return nil, errors.New("rtld registrar: no RTLD API")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("rtld registrar: %w", err)
	}
	envs := make([]string, 0, len(cfg.EnvironmentIDs))
	for _, e := range cfg.EnvironmentIDs {
		if e = strings.TrimSpace(e); e != "" && !slices.Contains(envs, e) {
			envs = append(envs, e)
		}
	}
	cfg.EnvironmentIDs = envs
	u, err := url.Parse(strings.TrimSpace(cfg.PublicURL))
	if err != nil { // validate parsed it
		return nil, fmt.Errorf("rtld registrar: public URL: %w", err)
	}
	cfg.PublicURL = strings.TrimRight(u.String(), "/")
	cfg.Fields = slices.Clone(cfg.Fields)
	if p := cfg.DownsamplingPercent; p != nil {
		v := *p
		cfg.DownsamplingPercent = &v
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registrar{api: api, cfg: cfg, log: log, written: map[string]bool{}}, nil
}

// Destination returns the destination_endpoint of an environment's profile.
func (r *Registrar) Destination(environmentID string) string {
	return r.cfg.PublicURL + EndpointPath(environmentID)
}

// Run checks every environment at once and then every Interval until ctx
// ends; failed checks are retried sooner (from 2s, doubling up to Interval).
// It returns nil when ctx ends.
func (r *Registrar) Run(ctx context.Context) error {
	retry := 2 * time.Second
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		wait := r.cfg.Interval
		if err := r.Reconcile(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.log.Warn("rtld profile registration failed; retrying", "retry_in", min(retry, wait), "err", err)
			wait = min(retry, wait)
			retry = min(2*retry, r.cfg.Interval)
		} else {
			retry = 2 * time.Second
		}
		timer.Reset(wait)
	}
}

// Reconcile checks every environment once, creating or repairing its
// profile. It returns the failures of all environments joined.
func (r *Registrar) Reconcile(ctx context.Context) error {
	var fields []string
	var errs []error
	if len(r.cfg.Fields) > 0 {
		fields = r.cfg.Fields
	} else {
		var err error
		if fields, err = r.listFields(ctx); err != nil {
			for _, env := range r.cfg.EnvironmentIDs {
				r.observe(env, RegistrationFailed)
			}
			return fmt.Errorf("rtld registrar: %w", err)
		}
	}
	for _, env := range r.cfg.EnvironmentIDs {
		res, err := r.reconcile(ctx, env, fields)
		r.observe(env, res)
		if err != nil {
			errs = append(errs, fmt.Errorf("rtld registrar: environment %s: %w", env, err))
		}
	}
	return errors.Join(errs...)
}

func (r *Registrar) observe(env string, res RegistrationResult) {
	if r.cfg.Observer != nil {
		r.cfg.Observer.ObserveRegistration(env, res)
	}
}

// rtldCollection is one page of an RTLD list.
type rtldCollection[T any] struct {
	Items      []T  `json:"items"`
	TotalItems *int `json:"total_items"`
}

// listAllRTLD walks an RTLD list with limit/offset until total_items items
// arrived or a page comes back empty or short.
func listAllRTLD[T any](ctx context.Context, api ProfileAPI, path string, query url.Values) ([]T, error) {
	var out []T
	for n := 0; n < maxListPages; n++ {
		q := url.Values{}
		for k, v := range query {
			q[k] = v
		}
		q.Set("limit", strconv.Itoa(listPageSize))
		q.Set("offset", strconv.Itoa(len(out)))
		var page rtldCollection[T]
		if err := api.Do(ctx, http.MethodGet, path, q, nil, &page); err != nil {
			return nil, err
		}
		out = append(out, page.Items...)
		if len(page.Items) < listPageSize || (page.TotalItems != nil && len(out) >= *page.TotalItems) {
			return out, nil
		}
	}
	return nil, fmt.Errorf("list %s: more than %d pages", path, maxListPages)
}

// listFields returns every field code the platform lists, in its order.
func (r *Registrar) listFields(ctx context.Context) ([]string, error) {
	items, err := listAllRTLD[struct {
		Code string `json:"code"`
	}](ctx, r.api, "/accesslogs/fields", nil)
	if err != nil {
		return nil, fmt.Errorf("list log fields: %w", err)
	}
	codes := make([]string, 0, len(items))
	for _, it := range items {
		if it.Code != "" && !slices.Contains(codes, it.Code) {
			codes = append(codes, it.Code)
		}
	}
	if len(codes) == 0 {
		return nil, errors.New("list log fields: the platform lists no fields")
	}
	return codes, nil
}

// remoteProfile is a profile as the platform returns it.
type remoteProfile struct {
	ID                    int64    `json:"id"`
	EnvironmentID         string   `json:"environment_id"`
	ProfileName           string   `json:"profile_name"`
	Description           string   `json:"description"`
	Enabled               bool     `json:"enabled"`
	DownsamplingPercent   *float64 `json:"downsampling_percent"`
	Fields                []string `json:"fields"`
	CustomCookies         []string `json:"custom_cookies"`
	CustomRequestHeaders  []string `json:"custom_request_headers"`
	CustomResponseHeaders []string `json:"custom_response_headers"`
	Filters               *struct {
		StatusCodes []string `json:"status_codes"`
		HostNames   *struct {
			Names []string `json:"names"`
		} `json:"host_names"`
	} `json:"filters"`
	DeliveryMethod struct {
		Type                string `json:"type"`
		DestinationEndpoint string `json:"destination_endpoint"`
		LogFormat           string `json:"log_format"`
		Authentication      *struct {
			Type     string `json:"type"`
			Username string `json:"username"`
		} `json:"authentication"`
	} `json:"delivery_method"`
}

// profileWrite is a create or update body.
type profileWrite struct {
	EnvironmentID         string        `json:"environment_id"`
	ProfileName           string        `json:"profile_name"`
	Description           string        `json:"description,omitempty"`
	Enabled               bool          `json:"enabled"`
	DownsamplingPercent   *float64      `json:"downsampling_percent,omitempty"`
	Fields                []string      `json:"fields"`
	CustomCookies         []string      `json:"custom_cookies,omitempty"`
	CustomRequestHeaders  []string      `json:"custom_request_headers,omitempty"`
	CustomResponseHeaders []string      `json:"custom_response_headers,omitempty"`
	DeliveryMethod        deliveryWrite `json:"delivery_method"`
}

type deliveryWrite struct {
	Type                string    `json:"type"`
	DestinationEndpoint string    `json:"destination_endpoint"`
	Authentication      authWrite `json:"authentication"`
	LogFormat           string    `json:"log_format"`
}

type authWrite struct {
	Type     string `json:"type"`
	Username string `json:"username"`
	Password string `json:"password"`
}

// desired is the profile the receiver wants in env. Custom headers and
// cookies and an edited description of an existing profile are kept: they
// only add data. So is its downsampling_percent, unless one is configured:
// the operator's cost decision, which the reconciliation accounts for.
// Filters are not: they drop records the Metrics API counts.
func (r *Registrar) desired(env string, fields []string, have *remoteProfile) profileWrite {
	w := profileWrite{
		EnvironmentID: env,
		ProfileName:   r.cfg.ProfileName,
		Description:   r.cfg.Description,
		Enabled:       true,
		Fields:        fields,
		DeliveryMethod: deliveryWrite{
			Type:                "http_post",
			DestinationEndpoint: r.Destination(env),
			Authentication:      authWrite{Type: "http_basic", Username: r.cfg.Username, Password: r.cfg.Password},
			LogFormat:           "json",
		},
	}
	w.DownsamplingPercent = r.cfg.DownsamplingPercent
	if have != nil {
		if w.DownsamplingPercent == nil {
			w.DownsamplingPercent = have.DownsamplingPercent
		}
		if have.Description != "" {
			w.Description = have.Description
		}
		w.CustomCookies = have.CustomCookies
		w.CustomRequestHeaders = have.CustomRequestHeaders
		w.CustomResponseHeaders = have.CustomResponseHeaders
	}
	return w
}

// drift lists how have differs from want in what the platform shows.
func drift(have *remoteProfile, want profileWrite) []string {
	var d []string
	if !have.Enabled {
		d = append(d, "disabled")
	}
	dm := have.DeliveryMethod
	if dm.Type != want.DeliveryMethod.Type {
		d = append(d, "delivery type "+strconv.Quote(dm.Type))
	}
	if dm.DestinationEndpoint != want.DeliveryMethod.DestinationEndpoint {
		d = append(d, "destination "+strconv.Quote(dm.DestinationEndpoint))
	}
	if dm.LogFormat != want.DeliveryMethod.LogFormat {
		d = append(d, "log format "+strconv.Quote(dm.LogFormat))
	}
	if dm.Authentication == nil || dm.Authentication.Type != "http_basic" || dm.Authentication.Username != want.DeliveryMethod.Authentication.Username {
		d = append(d, "authentication")
	}
	a, b := slices.Clone(have.Fields), slices.Clone(want.Fields)
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) {
		d = append(d, fmt.Sprintf("fields (%d, want %d)", len(have.Fields), len(want.Fields)))
	}
	if want := want.DownsamplingPercent; want != nil && (have.DownsamplingPercent == nil || *have.DownsamplingPercent != *want) {
		d = append(d, fmt.Sprintf("downsampling %s (want %v%%)", percentString(have.DownsamplingPercent), *want))
	}
	if f := have.Filters; f != nil && (len(f.StatusCodes) > 0 || (f.HostNames != nil && len(f.HostNames.Names) > 0)) {
		d = append(d, "filters")
	}
	return d
}

// percentString renders a downsampling_percent ("none" when unset).
func percentString(p *float64) string {
	if p == nil {
		return "none"
	}
	return strconv.FormatFloat(*p, 'g', -1, 64) + "%"
}

// find lists env's profiles and returns the one named ProfileName (the
// lowest ID if the platform holds several), deleting any others of that name
// so the platform never delivers twice.
func (r *Registrar) find(ctx context.Context, env string) (*remoteProfile, error) {
	all, err := listAllRTLD[remoteProfile](ctx, r.api, profilesPath, url.Values{"environment_id": {env}})
	if err != nil {
		return nil, fmt.Errorf("list profiles: %w", err)
	}
	var mine []remoteProfile
	for _, p := range all {
		if p.ProfileName == r.cfg.ProfileName {
			mine = append(mine, p)
		}
	}
	if len(mine) == 0 {
		return nil, nil
	}
	slices.SortFunc(mine, func(a, b remoteProfile) int { return int(a.ID - b.ID) })
	for _, extra := range mine[1:] {
		r.log.Warn("rtld: deleting a duplicate of the receiver's profile", "environment_id", env, "profile_id", extra.ID)
		err := r.api.Do(ctx, http.MethodDelete, profilesPath+"/"+strconv.FormatInt(extra.ID, 10), url.Values{"environment_id": {env}}, nil, nil)
		if err != nil && !platform.IsNotFound(err) {
			return nil, fmt.Errorf("delete duplicate profile %d: %w", extra.ID, err)
		}
	}
	return &mine[0], nil
}

func (r *Registrar) reconcile(ctx context.Context, env string, fields []string) (RegistrationResult, error) {
	have, err := r.find(ctx, env)
	if err != nil {
		return RegistrationFailed, err
	}
	if have == nil {
		want := r.desired(env, fields, nil)
		var created remoteProfile
		err := r.api.Do(ctx, http.MethodPost, profilesPath, nil, want, &created)
		if err == nil {
			r.markWritten(env)
			r.log.Info("rtld: created the receiver's profile", "environment_id", env, "profile_id", created.ID,
				"profile_name", r.cfg.ProfileName, "destination", want.DeliveryMethod.DestinationEndpoint, "fields", len(fields))
			return RegistrationCreated, nil
		}
		if platform.StatusCode(err) != http.StatusBadRequest {
			return RegistrationFailed, fmt.Errorf("create profile: %w", err)
		}
		// Another replica may have created it since we listed (the name is
		// taken): find it and bring it in line instead.
		createErr := err
		if have, err = r.find(ctx, env); err != nil {
			return RegistrationFailed, fmt.Errorf("create profile: %w (then: %w)", createErr, err)
		}
		if have == nil {
			return RegistrationFailed, fmt.Errorf("create profile: %w", createErr)
		}
		r.log.Info("rtld: profile created concurrently by another replica; checking it", "environment_id", env, "profile_id", have.ID)
	}
	want := r.desired(env, fields, have)
	d := drift(have, want)
	first := !r.wasWritten(env)
	if len(d) == 0 && !first {
		return RegistrationUnchanged, nil
	}
	path := profilesPath + "/" + strconv.FormatInt(have.ID, 10)
	if err := r.api.Do(ctx, http.MethodPut, path, nil, want, nil); err != nil {
		if platform.IsNotFound(err) {
			// Deleted between list and update: the next check creates it.
			r.forgetWritten(env)
		}
		return RegistrationFailed, fmt.Errorf("update profile %d: %w", have.ID, err)
	}
	r.markWritten(env)
	if len(d) > 0 {
		r.log.Warn("rtld: repaired the receiver's profile", "environment_id", env, "profile_id", have.ID, "drift", d)
		return RegistrationRepaired, nil
	}
	r.log.Info("rtld: updated the receiver's profile (credentials refreshed)", "environment_id", env, "profile_id", have.ID)
	return RegistrationUpdated, nil
}

func (r *Registrar) wasWritten(env string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.written[env]
}

func (r *Registrar) markWritten(env string) {
	r.mu.Lock()
	r.written[env] = true
	r.mu.Unlock()
}

func (r *Registrar) forgetWritten(env string) {
	r.mu.Lock()
	delete(r.written, env)
	r.mu.Unlock()
}
