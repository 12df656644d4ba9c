package reconcile

import (
	"context"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

// fakeAPI answers requests_edge_total per environment and bucket start.
type fakeAPI struct {
	mu       sync.Mutex
	requests map[string]map[int64]float64
	err      error
	queries  []metricsapi.Query
}

func (f *fakeAPI) Dataset(context.Context, string) (*metricsapi.Dataset, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &metricsapi.Dataset{Name: dataset}, f.err
}

func (f *fakeAPI) Data(_ context.Context, q metricsapi.Query) (*metricsapi.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queries = append(f.queries, q)
	if f.err != nil {
		return nil, f.err
	}
	res := &metricsapi.Result{Metrics: []string{metric}}
	for _, env := range q.Environments {
		for start, n := range f.requests[env] {
			if at := time.Unix(start, 0); !at.Before(q.Start) && at.Before(q.End) {
				res.Rows = append(res.Rows, metricsapi.Row{Time: at.UTC(), Environment: env, Values: []float64{n}})
			}
		}
	}
	return res, nil
}

// caughtUpSpool is a spool whose reconcile reader has nothing pending.
type caughtUpSpool struct{}

func (caughtUpSpool) Stats() spool.Stats {
	return spool.Stats{Readers: map[string]spool.Lag{SpoolReaderName: {}}}
}
func (caughtUpSpool) OldestPending(string) (time.Time, bool) { return time.Time{}, false }

type idleReader struct{}

func (idleReader) Next(ctx context.Context, _ int, _ int64) ([]spool.Entry, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (idleReader) Commit(spool.Position) error { return nil }
func (idleReader) Committed() spool.Position   { return spool.Position{} }

// world is a Reconciler with a fake API on a clock the test moves.
type world struct {
	t     *testing.T
	r     *Reconciler
	api   *fakeAPI
	reg   *prometheus.Registry
	wall  time.Time
	clock *PlatformTime
}

// t0 is a bucket start.
var t0 = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)

func newWorld(t *testing.T, envs ...string) *world {
	t.Helper()
	return newWorldWith(t, nil, envs...)
}

// newWorldWith is newWorld with the Metrics API api (nil: a fakeAPI, w.api).
func newWorldWith(t *testing.T, api MetricsAPI, envs ...string) *world {
	t.Helper()
	w := &world{t: t, api: &fakeAPI{requests: map[string]map[int64]float64{}}, reg: prometheus.NewRegistry(), wall: time.Unix(1_000_000, 0)}
	if api == nil {
		api = w.api
	}
	w.clock = NewPlatformTime(func() time.Time { return w.wall })
	w.clock.ObserveDate(t0, 0)
	r, err := New(Config{EnvironmentIDs: envs, Delay: 10 * time.Minute, Interval: time.Second, GiveUpAfter: time.Hour,
		Dir: t.TempDir(), Metrics: api, Clock: w.clock, ProfileName: "edgepipe", Registerer: w.reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	w.r = r
	return w
}

// at moves the platform's time to t0 + d.
func (w *world) at(d time.Duration) {
	now, _ := w.clock.Now()
	w.wall = w.wall.Add(t0.Add(d).Sub(now))
}

// steady records profile checks of env in state s every minute over
// [from, to).
func (w *world) steady(env string, s ProfileState, from, to time.Duration) {
	for d := from; d < to; d += time.Minute {
		w.r.store.observe(env, s, t0.Add(d), t0.Add(d+time.Second))
	}
}

// count adds n records to env's bucket at t0 + d.
func (w *world) count(env string, d time.Duration, n int) {
	secs := make([]int64, n)
	for i := range secs {
		secs[i] = t0.Add(d).Unix() + int64(i%300)
	}
	w.r.store.mu.Lock()
	next := w.r.store.next
	w.r.store.mu.Unlock()
	w.r.store.countBatch(next, batch(env, "ag", int64(next), secs...), w.wall)
}

func (w *world) tick() { w.r.tick(context.Background(), caughtUpSpool{}, idleReader{}) }

func (w *world) metric(name string, labels ...string) float64 {
	w.t.Helper()
	var c prometheus.Collector
	switch name {
	case "buckets":
		c = w.r.metrics.buckets.WithLabelValues(labels...)
	case "api":
		c = w.r.metrics.api.WithLabelValues(labels...)
	case "records":
		c = w.r.metrics.records.WithLabelValues(labels...)
	case "skipped":
		c = w.r.metrics.skipped.WithLabelValues(labels...)
	}
	return testutil.ToFloat64(c)
}

var full = ProfileState{Delivering: true, Percent: 100}

func TestTickComparesSettledBuckets(t *testing.T) {
	w := newWorld(t, "env-a")
	w.steady("env-a", full, -2*time.Minute, 40*time.Minute)
	w.api.requests["env-a"] = map[int64]float64{
		t0.Unix(): 100, t0.Add(5 * time.Minute).Unix(): 80, t0.Add(10 * time.Minute).Unix(): 0, // no traffic: no row
	}
	delete(w.api.requests["env-a"], t0.Add(10*time.Minute).Unix())
	w.count("env-a", 0, 100)
	w.count("env-a", 5*time.Minute, 70) // 10 lost

	w.at(14 * time.Minute) // the first bucket is due at 15m
	w.tick()
	if n := w.metric("buckets", "env-a"); n != 0 {
		t.Fatalf("%v buckets compared before their time", n)
	}
	w.at(26 * time.Minute)
	w.tick()
	if got := []float64{w.metric("buckets", "env-a"), w.metric("api", "env-a"), w.metric("records", "env-a")}; got[0] != 3 || got[1] != 180 || got[2] != 170 {
		t.Fatalf("buckets, api, records = %v; want 3, 180, 170", got)
	}
	// Late records for a compared bucket are added.
	w.count("env-a", 5*time.Minute, 10)
	w.tick()
	if got := w.metric("records", "env-a"); got != 180 {
		t.Errorf("records %v after 10 late ones, want 180", got)
	}
	if got := w.metric("buckets", "env-a"); got != 3 {
		t.Errorf("buckets %v: a late record compared a bucket twice", got)
	}
}

func TestTickSampledShare(t *testing.T) {
	w := newWorld(t, "env-a")
	w.tick() // started at t0
	w.steady("env-a", ProfileState{Delivering: true, Percent: 25}, -2*time.Minute, 20*time.Minute)
	w.api.requests["env-a"] = map[int64]float64{t0.Unix(): 1003}
	w.count("env-a", 0, 250)
	w.at(16 * time.Minute)
	w.tick()
	if api, recs := w.metric("api", "env-a"), w.metric("records", "env-a"); api != 250 || recs != 250 {
		t.Errorf("api %v (floor(1003 × 25%%) = 250), records %v", api, recs)
	}
}

func TestTickWaitsAndGivesUp(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		nan    bool
		reason string
		wait   bool
	}{
		{"API down", &platform.Error{Status: http.StatusServiceUnavailable}, false, ReasonAPIError, true},
		{"a value that is not one", nil, true, ReasonAPIError, true},
		{"no app.metrics scope", &platform.Error{Status: http.StatusUnauthorized, Code: "invalid_scope"}, false, ReasonForbidden, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, "env-a")
			w.tick() // started at t0
			w.steady("env-a", full, -2*time.Minute, 3*time.Hour)
			w.api.err = tc.err
			w.api.requests["env-a"] = map[int64]float64{t0.Unix(): 10}
			if tc.nan {
				w.api.requests["env-a"][t0.Unix()] = math.NaN()
			}
			w.at(16 * time.Minute)
			w.tick()
			if got := w.metric("skipped", "env-a", tc.reason); (got == 0) != tc.wait {
				t.Fatalf("skipped[%s] = %v at once; wait %v", tc.reason, got, tc.wait)
			}
			if !tc.wait {
				return
			}
			w.at(16*time.Minute + time.Hour)
			w.tick()
			if got := w.metric("skipped", "env-a", tc.reason); got != 1 {
				t.Fatalf("skipped[%s] = %v after waiting GiveUpAfter, want 1", tc.reason, got)
			}
			w.r.store.mu.Lock()
			b := w.r.store.envs["env-a"].buckets[t0.Unix()]
			w.r.store.mu.Unlock()
			if b == nil || b.Decision != skipped {
				t.Fatalf("the bucket of t0: %+v, want skipped", b)
			}
			if got := w.metric("buckets", "env-a"); tc.err != nil && got != 0 {
				t.Fatalf("%v buckets compared with the API down", got)
			}
		})
	}
}

func TestTickAfterRestartWaitsForResends(t *testing.T) {
	w := newWorld(t, "env-a")
	w.steady("env-a", full, -2*time.Minute, 3*time.Hour)
	w.api.requests["env-a"] = map[int64]float64{t0.Unix(): 10, t0.Add(5 * time.Minute).Unix(): 10}
	w.count("env-a", 0, 10)
	// The receiver starts (first tick) long after both buckets ended: the
	// platform resends what it could not deliver while it was down, so they
	// wait Delay from the start.
	w.at(time.Hour)
	w.tick()
	if got := w.metric("buckets", "env-a"); got != 0 {
		t.Fatalf("%v buckets compared at once after the start", got)
	}
	w.count("env-a", 5*time.Minute, 10) // resent meanwhile
	w.at(time.Hour + 10*time.Minute)
	w.tick()
	if got, recs := w.metric("buckets", "env-a"), w.metric("records", "env-a"); got < 2 || recs != w.metric("api", "env-a") {
		t.Fatalf("%v buckets, records %v of %v", got, recs, w.metric("api", "env-a"))
	}
}

func TestConfigValidate(t *testing.T) {
	base := Config{EnvironmentIDs: []string{"e"}, Dir: "/x", Metrics: &fakeAPI{}, Clock: NewPlatformTime(nil), ProfileName: "p", Replica: "rx-0"}
	for _, tc := range []struct {
		name string
		mut  func(*Config)
		want string
	}{
		{"valid", func(*Config) {}, ""},
		{"no environments", func(c *Config) { c.EnvironmentIDs = nil }, "no environments"},
		{"a leader with spool counts", func(c *Config) { c.Leader = "rx-1" }, "needs ClickHouse counts"},
		{"ClickHouse counts without ClickHouse", func(c *Config) { c.Counts = CountsClickHouse }, "need ClickHouse"},
		{"unknown counts", func(c *Config) { c.Counts = "kafka" }, `counts "kafka"`},
		{"negative delay", func(c *Config) { c.Delay = -time.Second }, "delay -1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.mut(&c)
			err := c.withDefaults().validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
