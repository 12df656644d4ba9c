package platformsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// This file serves the RTLD endpoints (/rtld/v1/...); the log delivery
// engine they configure is in delivery*.go.
//
// Endpoints (scope app.rtld). The spec leaves the create and update
// operations unstated; the simulator uses the REST convention:
//
//	GET    /rtld/v1/accesslogs/fields?limit=&offset=
//	GET    /rtld/v1/cloud-regions?limit=&offset=
//	GET    /rtld/v1/accesslogs/profiles?environment_id=&limit=&offset=
//	POST   /rtld/v1/accesslogs/profiles                      create (201, Location)
//	GET    /rtld/v1/accesslogs/profiles/{id}?environment_id=
//	PUT    /rtld/v1/accesslogs/profiles/{id}                 full replacement (200)
//	DELETE /rtld/v1/accesslogs/profiles/{id}?environment_id= (204)
//
// Create and update bodies carry environment_id; PUT replaces the whole
// profile, so an http_basic password (write-only, never returned) must be
// sent again with every update. Validation failures answer 400 with the
// Error object; each details[].source names the offending part of the
// request: a body path ("delivery_method.destination_endpoint"), an element
// ("fields[3]") or a query parameter ("limit").

// rtldState is the RTLD part of a Server.
type rtldState struct {
	store  *profileStore
	engine *deliveryEngine
}

// cloudRegions are the object-storage regions GET /rtld/v1/cloud-regions
// lists.
var cloudRegions = []struct {
	Code string `json:"code"`
	Name string `json:"name"`
}{
	{"us-east-1", "US East (N. Virginia)"},
	{"us-east-2", "US East (Ohio)"},
	{"us-west-1", "US West (N. California)"},
	{"us-west-2", "US West (Oregon)"},
	{"ca-central-1", "Canada (Central)"},
	{"eu-central-1", "Europe (Frankfurt)"},
	{"eu-west-1", "Europe (Ireland)"},
	{"eu-west-2", "Europe (London)"},
	{"eu-west-3", "Europe (Paris)"},
	{"eu-north-1", "Europe (Stockholm)"},
	{"ap-northeast-1", "Asia Pacific (Tokyo)"},
	{"ap-southeast-1", "Asia Pacific (Singapore)"},
	{"ap-southeast-2", "Asia Pacific (Sydney)"},
	{"ap-south-1", "Asia Pacific (Mumbai)"},
	{"sa-east-1", "South America (Sao Paulo)"},
}

// routeRTLD registers the RTLD routes on the root router and starts the
// delivery engine.
func (s *Server) routeRTLD(r chi.Router) {
	st := &rtldState{store: newProfileStore(s.now)}
	st.engine = newDeliveryEngine(s.cfg.Delivery, s.cfg.Seed, s.now, s.deliveryTargets, s.deliveryTarget, s.logPlan, s.spawn)
	s.rtld = st
	s.spawn(st.engine.run)

	r.Group(func(r chi.Router) {
		r.Use(s.requireScope(scopeRTLD))
		r.Get("/rtld/v1/accesslogs/fields", s.handleLogFields)
		r.Get("/rtld/v1/cloud-regions", s.handleCloudRegions)
		r.Get("/rtld/v1/accesslogs/profiles", s.handleListProfiles)
		r.Post("/rtld/v1/accesslogs/profiles", s.handleCreateProfile)
		r.Get("/rtld/v1/accesslogs/profiles/{id}", s.handleGetProfile)
		r.Put("/rtld/v1/accesslogs/profiles/{id}", s.handleUpdateProfile)
		r.Delete("/rtld/v1/accesslogs/profiles/{id}", s.handleDeleteProfile)
	})
}

func writeFailure(w http.ResponseWriter, f *rtldError) {
	details := make([]ErrorDetail, len(f.Details))
	for i, d := range f.Details {
		details[i] = detail(d.Source, d.Description)
	}
	writeError(w, f.Status, f.Code, f.Title, f.Description, details...)
}

// rtldCollection is the RTLD collection envelope (spec 2.1).
type rtldCollection struct {
	ID         string          `json:"@id"`
	Type       string          `json:"@type"`
	Links      map[string]href `json:"@links"`
	Items      any             `json:"items"`
	TotalItems int             `json:"total_items"`
}

type href struct {
	Href string `json:"href"`
}

// page parses limit (≥1, default 50) and offset (≥0, default 0).
func rtldPage(q url.Values) (limit, offset int, f *rtldError) {
	limit, offset = limits.DefaultRTLDLimit, 0
	var details []rtldDetail
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < limits.MinRTLDLimit {
			details = append(details, rtldDetail{"limit", fmt.Sprintf("must be an integer of at least %d (got %q)", limits.MinRTLDLimit, v)})
		}
		limit = n
	}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			details = append(details, rtldDetail{"offset", fmt.Sprintf("must be an integer of at least 0 (got %q)", v)})
		}
		offset = n
	}
	if details != nil {
		return 0, 0, badRequest("invalid pagination parameters", details...)
	}
	return limit, offset, nil
}

// paginate builds the collection envelope of items[offset:offset+limit].
func paginate[T any](r *http.Request, items []T, limit, offset int) rtldCollection {
	total := len(items)
	lo := min(offset, total)
	hi := lo + min(limit, total-lo) // no overflow for huge limits
	link := func(off int) href {
		q := r.URL.Query()
		q.Set("limit", strconv.Itoa(limit))
		q.Set("offset", strconv.Itoa(off))
		return href{r.URL.Path + "?" + q.Encode()}
	}
	links := map[string]href{"first": link(0)}
	last := 0
	if total > 0 {
		last = (total - 1) / limit * limit
	}
	links["last"] = link(last)
	if offset < total && limit < total-offset {
		links["next"] = link(offset + limit)
	}
	sel := items[lo:hi]
	if sel == nil {
		sel = []T{}
	}
	return rtldCollection{ID: r.URL.RequestURI(), Type: "Collection", Links: links, Items: sel, TotalItems: total}
}

func (s *Server) handleLogFields(w http.ResponseWriter, r *http.Request) {
	limit, offset, f := rtldPage(r.URL.Query())
	if f != nil {
		writeFailure(w, f)
		return
	}
	writeJSON(w, http.StatusOK, paginate(r, accesslog.Fields(), limit, offset))
}

func (s *Server) handleCloudRegions(w http.ResponseWriter, r *http.Request) {
	limit, offset, f := rtldPage(r.URL.Query())
	if f != nil {
		writeFailure(w, f)
		return
	}
	writeJSON(w, http.StatusOK, paginate(r, cloudRegions, limit, offset))
}

// queryEnvironment reads the required environment_id query parameter.
func (s *Server) queryEnvironment(q url.Values) (string, *rtldError) {
	env := q.Get("environment_id")
	switch {
	case env == "":
		return "", badRequest("environment_id is required", rtldDetail{"environment_id", "query parameter is required"})
	case !isUUID(env):
		return "", badRequest("environment_id must be a UUID", rtldDetail{"environment_id", fmt.Sprintf("%q is not a UUID", env)})
	}
	if _, ok := s.environment(env); !ok {
		return "", badRequest("unknown environment", rtldDetail{"environment_id", fmt.Sprintf("unknown environment %q", env)})
	}
	return env, nil
}

func (s *Server) handleListProfiles(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, offset, f := rtldPage(q)
	if f == nil {
		var env string
		env, f = s.queryEnvironment(q)
		if f == nil {
			ps := s.rtld.store.list(env)
			views := make([]profileView, len(ps))
			for i, p := range ps {
				views[i] = p.view()
			}
			writeJSON(w, http.StatusOK, paginate(r, views, limit, offset))
			return
		}
	}
	writeFailure(w, f)
}

// readProfileBody reads and validates a create or update body.
func (s *Server) readProfileBody(w http.ResponseWriter, r *http.Request) (rtldProfile, *rtldError) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return rtldProfile{}, &rtldError{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
				Title: "Unsupported Media Type", Description: fmt.Sprintf("Content-Type must be application/json (got %q)", ct)}
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxProfileBodySize))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return rtldProfile{}, &rtldError{Status: http.StatusRequestEntityTooLarge, Code: "payload_too_large",
				Title: "Payload Too Large", Description: fmt.Sprintf("request body exceeds %d bytes", maxProfileBodySize)}
		}
		return rtldProfile{}, badRequest("reading request body: "+err.Error(), rtldDetail{"body", err.Error()})
	}
	return decodeProfile(body, func(id string) bool { _, ok := s.environment(id); return ok })
}

func (s *Server) handleCreateProfile(w http.ResponseWriter, r *http.Request) {
	p, f := s.readProfileBody(w, r)
	if f == nil {
		p, f = s.rtld.store.create(p)
	}
	if f != nil {
		writeFailure(w, f)
		return
	}
	w.Header().Set("Location", profilePath(p.ID)+"?environment_id="+url.QueryEscape(p.EnvironmentID))
	writeJSON(w, http.StatusCreated, p.view())
}

// pathID parses the {id} path segment; an ID that is not an integer names no
// profile.
func pathID(r *http.Request) (int64, *rtldError) {
	raw := chi.URLParam(r, "id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return 0, badRequest("profile id must be an integer", rtldDetail{"id", fmt.Sprintf("%q is not an integer", raw)})
	}
	return id, nil
}

// profileRef parses the profile a request names: the {id} path segment and
// the environment_id query parameter.
func (s *Server) profileRef(r *http.Request) (env string, id int64, f *rtldError) {
	if id, f = pathID(r); f == nil {
		env, f = s.queryEnvironment(r.URL.Query())
	}
	return env, id, f
}

func (s *Server) handleGetProfile(w http.ResponseWriter, r *http.Request) {
	env, id, f := s.profileRef(r)
	if f != nil {
		writeFailure(w, f)
		return
	}
	p, ok := s.rtld.store.get(env, id)
	if !ok {
		writeFailure(w, rtldNotFound(fmt.Sprintf("no profile %d in environment %s", id, env)))
		return
	}
	writeJSON(w, http.StatusOK, p.view())
}

func (s *Server) handleUpdateProfile(w http.ResponseWriter, r *http.Request) {
	id, f := pathID(r)
	var p rtldProfile
	if f == nil {
		p, f = s.readProfileBody(w, r)
	}
	if f == nil {
		p, f = s.rtld.store.update(id, p)
	}
	if f != nil {
		writeFailure(w, f)
		return
	}
	writeJSON(w, http.StatusOK, p.view())
}

func (s *Server) handleDeleteProfile(w http.ResponseWriter, r *http.Request) {
	env, id, f := s.profileRef(r)
	if f != nil {
		writeFailure(w, f)
		return
	}
	if !s.rtld.store.remove(env, id) {
		writeFailure(w, rtldNotFound(fmt.Sprintf("no profile %d in environment %s", id, env)))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// deliveryTargetOf builds the delivery view of p, or false when the engine
// must not deliver to it (disabled, not http_post, unknown environment).
func (s *Server) deliveryTargetOf(p rtldProfile) (deliveryTarget, bool) {
	if !p.Enabled || p.Delivery.Type != deliveryHTTPPost {
		return deliveryTarget{}, false
	}
	w := s.w()
	i, ok := w.envByID[p.EnvironmentID]
	if !ok {
		return deliveryTarget{}, false
	}
	env := w.envs[i]
	origins, originW := env.Origins, w.models[i].originW
	if len(origins) == 0 {
		origins, originW = []string{"origin-primary"}, nil
	}
	return deliveryTarget{profile: p, ctx: recordContext{
		accountNumber: env.LegacyAccountNumber,
		environmentID: env.ID,
		hosts:         environmentHosts(env),
		origins:       origins,
		originW:       originW,
		filters:       p.Filters,
	}}, true
}

func (s *Server) deliveryTargets() []deliveryTarget {
	var out []deliveryTarget
	for _, p := range s.rtld.store.list("") {
		if tg, ok := s.deliveryTargetOf(p); ok {
			out = append(out, tg)
		}
	}
	return out
}

func (s *Server) deliveryTarget(id int64) (deliveryTarget, bool) {
	s.rtld.store.mu.Lock()
	p, ok := s.rtld.store.byID[id]
	var cp rtldProfile
	if ok {
		cp = p.clone()
	}
	s.rtld.store.mu.Unlock()
	if !ok {
		return deliveryTarget{}, false
	}
	return s.deliveryTargetOf(cp)
}

// environmentHosts are the host names of an environment's requests.
func environmentHosts(env Environment) []string {
	return []string{env.DefaultDomainName, "www." + env.DefaultDomainName, "static." + env.DefaultDomainName}
}

// EnvironmentHosts returns the host names an environment's log records
// carry (for tests that set a profile's host_names filter).
func (s *Server) EnvironmentHosts(id string) []string {
	env, ok := s.environment(id)
	if !ok {
		return nil
	}
	return environmentHosts(env)
}

// DeliverRecords queues the next n records of the profile's stream (the
// requests of its environment that the Metrics API counts, downsampled and
// filtered as the profile says, less those EnvironmentFaults drop) in
// batches of DeliveryConfig.BatchSize, spread over the environment's agents,
// whatever the clock: records beyond the present carry timestamps ahead of
// it. Without live delivery the stream first moves on to the present, so
// the records start from now. It returns once the batches are queued; use
// WaitDelivered to wait for their acknowledgement.
func (s *Server) DeliverRecords(ctx context.Context, profileID int64, n int) error {
	if s.ctx.Err() != nil {
		return errors.New("platformsim: deliver records: server closed")
	}
	tg, ok := s.deliveryTarget(profileID)
	if !ok {
		return fmt.Errorf("platformsim: deliver to profile %d: %w", profileID, errNoTarget)
	}
	if err := s.rtld.engine.deliverRecords(ctx, tg, n); err != nil {
		return fmt.Errorf("platformsim: deliver to profile %d: %w", profileID, err)
	}
	return nil
}

// DeliverRecordsToAll runs DeliverRecords with n for every enabled http_post
// profile and returns how many profiles that was.
func (s *Server) DeliverRecordsToAll(ctx context.Context, n int) (int, error) {
	if s.ctx.Err() != nil {
		return 0, errors.New("platformsim: deliver records: server closed")
	}
	targets := s.deliveryTargets()
	for _, tg := range targets {
		if err := s.rtld.engine.deliverRecords(ctx, tg, n); err != nil {
			return 0, fmt.Errorf("platformsim: deliver to profile %d: %w", tg.profile.ID, err)
		}
	}
	return len(targets), nil
}

// LogBuckets returns, bucket by bucket in time order, what the delivery
// engine did with the profile's stream (buckets older than
// DeliveryConfig.Retention and an hour are forgotten).
func (s *Server) LogBuckets(profileID int64) []LogBucket { return s.rtld.engine.logBuckets(profileID) }

// Delivered returns the delivery engine's counters.
func (s *Server) Delivered() DeliveryStats { return s.rtld.engine.snapshot() }

// GeneratedUUIDs returns the uuid of every record the engine has generated,
// in generation order (acknowledged or not), up to
// DeliveryConfig.MaxTrackedUUIDs.
func (s *Server) GeneratedUUIDs() []string { return s.rtld.engine.generatedUUIDs() }

// WaitDelivered blocks until every generated record has been acknowledged
// (or dropped after the retention), or ctx ends.
func (s *Server) WaitDelivered(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		st := s.Delivered()
		if st.Settled() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("platformsim: waiting for delivery (%d of %d records acknowledged, %d batches pending): %w",
				st.RecordsAcknowledged, st.RecordsGenerated, st.PendingBatches, ctx.Err())
		case <-t.C:
		}
	}
}

// SetDeliveryFaults replaces the faults injected into deliveries; a
// change takes effect with the next record or batch.
func (s *Server) SetDeliveryFaults(f DeliveryFaults) { s.rtld.engine.setFaults(f) }
