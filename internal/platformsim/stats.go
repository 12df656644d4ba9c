package platformsim

import (
	"net/http"
	"sort"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// Stats is what the Server observed, for tests to assert on.
type Stats struct {
	// Requests counts requests by route ("POST /metrics/v1/datasets/{name}/data",
	// "GET /accounts/v0.1/environments", "POST /connect/token"; unmatched
	// paths count under "METHOD <unmatched>") and status code.
	Requests map[string]map[int]int
	// Data lists every data request that reached validation, in arrival
	// order (rejected ones too, with Status 400); the newest 50,000 at most.
	Data []DataRequest
}

// DataRequest describes one POST …/datasets/{name}/data.
type DataRequest struct {
	Dataset string
	// Environments are the environment_id filter values.
	Environments []string
	// Start and End are the date_range (zero when missing or invalid).
	Start, End time.Time
	// Granularity is the one used: sent or picked by the default rule.
	Granularity metricsapi.Granularity
	// GranularitySent is time_granularity as the client sent it.
	GranularitySent string
	Dimensions      []string
	Metrics         []string
	Filters         map[string][]string
	// Status is the HTTP status answered; Rows the number of rows.
	Status int
	Rows   int
	// BadValues and MalformedRows count the data faults injected into the
	// answer (Faults.BadValues, Faults.MalformedRowRate).
	BadValues, MalformedRows int
	// At is the simulated time of the request.
	At time.Time
}

type statsState struct {
	requests map[string]map[int]int
	data     []DataRequest
}

// Stats returns a copy of what the Server observed since New or ResetStats.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Stats{Requests: map[string]map[int]int{}, Data: append([]DataRequest(nil), s.stats.data...)}
	for k, m := range s.stats.requests {
		c := map[int]int{}
		for st, n := range m {
			c[st] = n
		}
		out.Requests[k] = c
	}
	return out
}

// ResetStats forgets everything Stats reports.
func (s *Server) ResetStats() {
	s.mu.Lock()
	s.stats = statsState{}
	s.mu.Unlock()
}

// Count returns the number of requests to route (as in Stats.Requests) with
// any status when status is 0.
func (st Stats) Count(route string, status int) int {
	n := 0
	for code, c := range st.Requests[route] {
		if status == 0 || code == status {
			n += c
		}
	}
	return n
}

// Routes lists the routes seen, sorted.
func (st Stats) Routes() []string {
	out := make([]string, 0, len(st.Requests))
	for k := range st.Requests {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// record is the middleware that counts requests by route and status.
func (s *Server) record(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		began := time.Now()
		// Date: the time the request was processed (spec section 1), on
		// the platform's clock.
		w.Header().Set("Date", s.now().Format(http.TimeFormat))
		next.ServeHTTP(sw, r)
		pattern := "<unmatched>"
		if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
			pattern = rc.RoutePattern()
		}
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		key := r.Method + " " + pattern
		s.mu.Lock()
		if s.stats.requests == nil {
			s.stats.requests = map[string]map[int]int{}
		}
		m := s.stats.requests[key]
		if m == nil {
			m = map[int]int{}
			s.stats.requests[key] = m
		}
		m[sw.status]++
		s.mu.Unlock()
		if s.cfg.Logger != nil {
			s.cfg.Logger.Debug("request", "method", r.Method, "route", pattern, "path", r.URL.Path,
				"status", sw.status, "duration", time.Since(began))
		}
	})
}

// maxDataRecords bounds Stats.Data so a long-running simulator does not grow
// without limit; the oldest records are dropped first.
const maxDataRecords = 50000

func (s *Server) recordData(d DataRequest) {
	s.mu.Lock()
	if len(s.stats.data) >= maxDataRecords {
		s.stats.data = append(s.stats.data[:0], s.stats.data[maxDataRecords/2:]...)
	}
	s.stats.data = append(s.stats.data, d)
	s.mu.Unlock()
	if d.Status != http.StatusOK && s.cfg.Logger != nil {
		s.cfg.Logger.Info("data request rejected", "dataset", d.Dataset, "status", d.Status)
	}
}
