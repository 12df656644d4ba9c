package schedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule/fakeclock"
)

var (
	t0        = time.Date(2026, 11, 23, 10, 2, 0, 0, time.UTC)
	countries = []string{"us", "de"}
)

func quietLogger() *slog.Logger {
	return slog.New(slog.DiscardHandler)
}

func value(env, country string, t time.Time) float64 {
	return float64(len(env)*100+len(country)) + float64(t.Unix()%997)
}

type harness struct {
	api   *fakeAPI
	clock *fakeclock.Clock
	envs  *staticEnvs
	pub   *counter
	obs   *recordingObserver
	s     *Scheduler
	ds    *metricsapi.Dataset
}

func newHarness(t *testing.T, mod func(*Config), envs ...string) *harness {
	t.Helper()
	h := &harness{
		api:   newFakeAPI(),
		clock: fakeclock.New(t0),
		envs:  &staticEnvs{envs: envs},
		pub:   newCounter(),
		obs:   &recordingObserver{},
	}
	h.api.fill(envs, countries, t0.Add(-48*time.Hour), t0.Add(48*time.Hour), value)
	cfg := Config{
		DatasetSource: h.api,
		Environments:  h.envs,
		Fetcher:       h.api,
		Publishers:    []NamedPublisher{{Name: "counter", Publisher: h.pub}},
		Observer:      h.obs,
		Clock:         h.clock,
		Logger:        quietLogger(),
		Tracker:       NewTracker(FirstStart),
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	ds := testDataset
	h.ds = &ds
	return h
}

// setEnvs sets the served environments without running discovery.
func (h *harness) setEnvs(envs ...string) {
	h.s.mu.Lock()
	h.s.envs = envs
	h.s.mu.Unlock()
}

func (h *harness) poll(t *testing.T) PollReport {
	t.Helper()
	r := h.s.Poll(context.Background(), h.ds)
	if r.Err != nil {
		t.Fatalf("poll at %s: %v", h.clock.Now(), r.Err)
	}
	return r
}

// checkExact asserts that the publisher's sums equal the API's truth over
// [from, to) and that no bucket was published as new twice.
func (h *harness) checkExact(t *testing.T, from, to time.Time) {
	t.Helper()
	sums, seen, _ := h.pub.snapshot()
	truth := h.api.truth(from, to)
	if !slices.Equal(sortedKeys(sums), sortedKeys(truth)) {
		t.Fatalf("series published %v, want %v", sortedKeys(sums), sortedKeys(truth))
	}
	for k, v := range truth {
		if sums[k] != v {
			t.Errorf("series %s: counted %v, API truth over [%s, %s) is %v", k, sums[k], from.Format("15:04"), to.Format("15:04"), v)
		}
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("bucket %s published as new %d times", k, n)
		}
	}
	// Every bucket of the range was published.
	d := h.api.g.Duration()
	want := 0
	for tt := from; tt.Before(to); tt = tt.Add(d) {
		want += len(truth) // one per series
	}
	if len(seen) != want {
		t.Errorf("%d buckets published, want %d", len(seen), want)
	}
}

func TestDefaultSettleWindow(t *testing.T) {
	for _, tc := range []struct {
		g    metricsapi.Granularity
		set  time.Duration
		want time.Duration
	}{
		{metricsapi.FiveMinutes, 0, 30 * time.Minute},
		{metricsapi.Hour, 0, 3 * time.Hour},
		{metricsapi.Day, 0, 72 * time.Hour},
		{metricsapi.FiveMinutes, 12 * time.Minute, 15 * time.Minute}, // rounded up to buckets
	} {
		s, err := New(Config{Granularity: tc.g, SettleWindow: tc.set, DatasetSource: newFakeAPI(), Environments: &staticEnvs{}, Fetcher: newFakeAPI()})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.SettleWindow(); got != tc.want {
			t.Errorf("%s settle %v: got %v, want %v", tc.g, tc.set, got, tc.want)
		}
	}
}

func TestPollPublishesEachBucketOnceThenRevisions(t *testing.T) {
	h := newHarness(t, nil, "env-a", "env-b")
	h.setEnvs("env-a", "env-b")

	r := h.poll(t)
	wantFrom, wantTo := time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC), time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	if !r.From.Equal(wantFrom) || !r.To.Equal(wantTo) {
		t.Fatalf("first poll asked [%s, %s), want [%s, %s)", r.From, r.To, wantFrom, wantTo)
	}
	if r.New != 6*2*2 || r.Revisions != 0 || r.Requests != 1 {
		t.Fatalf("first poll: new %d revisions %d requests %d, want 24, 0, 1", r.New, r.Revisions, r.Requests)
	}
	if !r.NewestBucketEnd.Equal(wantTo) {
		t.Errorf("newest bucket end %s, want %s", r.NewestBucketEnd, wantTo)
	}

	// Same time again: nothing changed, nothing published.
	if r := h.poll(t); r.New != 0 || r.Revisions != 0 || r.Rows != 24 {
		t.Fatalf("re-poll: new %d revisions %d rows %d, want 0, 0, 24", r.New, r.Revisions, r.Rows)
	}

	// Late data revises a bucket inside the settle window; a new bucket ends.
	h.clock.Advance(4 * time.Minute) // 10:06
	rev := time.Date(2026, 11, 23, 9, 45, 0, 0, time.UTC)
	h.api.set("env-a", "us", rev, value("env-a", "us", rev)+7)
	r = h.poll(t)
	if r.New != 4 || r.Revisions != 1 {
		t.Fatalf("poll at 10:06: new %d revisions %d, want 4, 1", r.New, r.Revisions)
	}
	if _, _, revs := h.pub.snapshot(); revs != 1 {
		t.Fatalf("publisher saw %d revisions, want 1", revs)
	}
	h.checkExact(t, wantFrom, time.Date(2026, 11, 23, 10, 5, 0, 0, time.UTC))
	if hwm, _ := h.s.Tracker().HighWaterMark("edge_errors", "env-a"); !hwm.Equal(time.Date(2026, 11, 23, 10, 5, 0, 0, time.UTC)) {
		t.Errorf("HWM %s, want 10:05", hwm)
	}
	// Buckets older than the settle window are forgotten.
	if n := h.s.Tracker().Buckets("edge_errors"); n != 6*2*2 {
		t.Errorf("tracker holds %d buckets, want %d (6 per series)", n, 24)
	}
}

func TestFailedPollsLeaveNoGap(t *testing.T) {
	h := newHarness(t, nil, "env-a", "env-b")
	h.setEnvs("env-a", "env-b")
	h.poll(t) // [9:30, 10:00)
	h.api.mu.Lock()
	h.api.failNext = 12
	h.api.mu.Unlock()
	for range 12 { // an hour of failures
		h.clock.Advance(5 * time.Minute)
		if r := h.s.Poll(context.Background(), h.ds); r.Err == nil {
			t.Fatal("poll succeeded, want the injected failure")
		}
	}
	if hwm, _ := h.s.Tracker().HighWaterMark("edge_errors", "env-b"); !hwm.Equal(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)) {
		t.Fatalf("HWM moved to %s during failures", hwm)
	}
	h.clock.Advance(5 * time.Minute) // 11:07
	r := h.poll(t)
	if !r.From.Equal(time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC)) {
		t.Errorf("recovery poll from %s, want 09:30 (HWM 10:00 minus settle)", r.From)
	}
	h.checkExact(t, time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC), time.Date(2026, 11, 23, 11, 5, 0, 0, time.UTC))
}

func TestPollOverrunningABoundarySkipsNothing(t *testing.T) {
	h := newHarness(t, nil, "env-a")
	h.setEnvs("env-a")
	h.clock.Set(time.Date(2026, 11, 23, 10, 4, 59, 0, time.UTC))
	h.api.mu.Lock()
	h.api.block = make(chan struct{})
	h.api.entered = make(chan struct{}, 1)
	h.api.mu.Unlock()
	done := make(chan PollReport)
	go func() { done <- h.s.Poll(context.Background(), h.ds) }()
	<-h.api.entered
	// The poll hangs across two boundaries, and a bucket it asked for is
	// revised meanwhile.
	h.clock.Set(time.Date(2026, 11, 23, 10, 11, 30, 0, time.UTC))
	rev := time.Date(2026, 11, 23, 9, 55, 0, 0, time.UTC)
	h.api.set("env-a", "de", rev, 12345)
	h.api.mu.Lock()
	close(h.api.block)
	h.api.block = nil
	h.api.mu.Unlock()
	r := <-done
	if r.Err != nil || !r.To.Equal(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)) {
		t.Fatalf("overrunning poll: err %v, to %s (want 10:00: the range is fixed at its start)", r.Err, r.To)
	}
	h.clock.Set(time.Date(2026, 11, 23, 10, 12, 0, 0, time.UTC))
	h.poll(t)
	h.checkExact(t, time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC), time.Date(2026, 11, 23, 10, 10, 0, 0, time.UTC))
}

type fakeResume struct {
	points map[string]time.Time
	asked  [][]string
	err    error
}

func (f *fakeResume) Resume(_ context.Context, _ *metricsapi.Dataset, _ metricsapi.Granularity, envs []string) (map[string]time.Time, error) {
	f.asked = append(f.asked, slices.Clone(envs))
	return f.points, f.err
}

func TestResumePointAndLaggingEnvironment(t *testing.T) {
	resume := &fakeResume{points: map[string]time.Time{"env-a": time.Date(2026, 11, 23, 8, 0, 0, 0, time.UTC)}}
	h := newHarness(t, func(c *Config) { c.Resume = resume }, "env-a", "env-b")
	h.setEnvs("env-a", "env-b")
	r := h.poll(t)
	if !r.From.Equal(time.Date(2026, 11, 23, 7, 30, 0, 0, time.UTC)) {
		t.Fatalf("from %s, want 07:30 (resume point 08:00 minus settle)", r.From)
	}
	_, seen, _ := h.pub.snapshot()
	old := bucketKey("env-b", "us", time.Date(2026, 11, 23, 8, 0, 0, 0, time.UTC))
	if seen[old] != 0 {
		t.Errorf("env-b's bucket 08:00 published although env-b starts at 09:30")
	}
	if seen[bucketKey("env-a", "us", time.Date(2026, 11, 23, 7, 30, 0, 0, time.UTC))] != 1 {
		t.Errorf("env-a's bucket 07:30 not published")
	}
	h.clock.Advance(5 * time.Minute)
	r = h.poll(t)
	if !r.From.Equal(time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC)) || r.New != 4 {
		t.Errorf("second poll from %s new %d, want 09:30 and 4", r.From, r.New)
	}
	if len(resume.asked) != 1 {
		t.Errorf("resume asked %d times, want once", len(resume.asked))
	}
	// A resume error falls back to the settle window, and is not retried.
	resume2 := &fakeResume{err: errors.New("clickhouse down")}
	h2 := newHarness(t, func(c *Config) { c.Resume = resume2 }, "env-a")
	h2.setEnvs("env-a")
	if r := h2.poll(t); !r.From.Equal(time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC)) {
		t.Errorf("from %s after resume error, want 09:30", r.From)
	}
}

type failingPublisher struct{ calls int }

func (f *failingPublisher) Publish(context.Context, *Batch) error {
	f.calls++
	return errors.New("sink down")
}

func TestPublisherErrorDoesNotStopOthers(t *testing.T) {
	bad := &failingPublisher{}
	h := newHarness(t, func(c *Config) {
		c.Publishers = append([]NamedPublisher{{Name: "bad", Publisher: bad}}, c.Publishers...)
	}, "env-a")
	h.setEnvs("env-a")
	h.poll(t)
	h.clock.Advance(5 * time.Minute)
	h.poll(t)
	if bad.calls != 2 || h.obs.pubErrs["bad"] != 2 {
		t.Fatalf("bad publisher called %d times, %d errors observed; want 2, 2", bad.calls, h.obs.pubErrs["bad"])
	}
	h.checkExact(t, time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC), time.Date(2026, 11, 23, 10, 5, 0, 0, time.UTC))
}

func TestRequestsPerPollSplitBy20(t *testing.T) {
	for _, n := range []int{1, 20, 21, 45} {
		envs := make([]string, n)
		for i := range envs {
			envs[i] = fmt.Sprintf("env-%03d", i)
		}
		h := newHarness(t, nil, envs...)
		h.setEnvs(envs...)
		r := h.poll(t)
		if want := (n + 19) / 20; r.Requests != want || len(h.api.queries) != 1 {
			t.Errorf("%d environments: %d requests in %d queries, want %d in 1", n, r.Requests, len(h.api.queries), want)
		}
	}
}

// TestRunLoopsRestartAndRediscover drives the real loops with the fake
// clock: alignment, a loop restart without double counting, environment
// changes, and graceful shutdown.
func TestRunLoopsRestartAndRediscover(t *testing.T) {
	h := newHarness(t, nil, "env-a", "env-b")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runDone := make(chan error)
	go func() { runDone <- h.s.Run(ctx) }()
	wait := func() {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		defer wcancel()
		if err := h.clock.BlockUntil(wctx, 2); err != nil {
			t.Fatalf("loops did not go back to sleep at %s", h.clock.Now())
		}
	}
	wait()
	if !h.s.Ready() {
		t.Fatal("not ready after the first discovery and poll")
	}
	if next, _ := h.clock.NextWake(); !next.Equal(time.Date(2026, 11, 23, 10, 3, 0, 0, time.UTC)) {
		t.Fatalf("next poll at %s, want aligned 10:03", next)
	}
	first := h.api.queries[0].Start
	for i := range 20 { // 10:03 … 10:22
		h.clock.Advance(time.Minute)
		wait()
		if i == 7 {
			rev := time.Date(2026, 11, 23, 9, 50, 0, 0, time.UTC)
			h.api.set("env-b", "de", rev, value("env-b", "de", rev)+100)
		}
		if i == 10 {
			if !h.s.RestartLoop(ctx, "edge_errors") {
				t.Fatal("no loop to restart")
			}
			wait()
		}
	}
	h.checkExact(t, first, time.Date(2026, 11, 23, 10, 20, 0, 0, time.UTC))
	if _, _, revs := h.pub.snapshot(); revs != 1 {
		t.Errorf("%d revisions published, want 1", revs)
	}

	// Environments change: env-a goes, env-c comes; the watcher hears it
	// at the next discovery (10:27) and env-a's state is dropped.
	h.envs.set("env-b", "env-c")
	h.api.fill([]string{"env-c"}, countries, t0.Add(-48*time.Hour), t0.Add(48*time.Hour), value)
	for range 6 {
		h.clock.Advance(time.Minute)
		wait()
	}
	h.pub.mu.Lock()
	last := h.pub.envs[len(h.pub.envs)-1]
	h.pub.mu.Unlock()
	if !slices.Equal(last, []string{"env-b", "env-c"}) {
		t.Fatalf("watcher last told %v, want [env-b env-c]", last)
	}
	if _, ok := h.s.Tracker().HighWaterMark("edge_errors", "env-a"); ok {
		t.Error("env-a still has a high-water mark after it vanished")
	}
	if hwm, ok := h.s.Tracker().HighWaterMark("edge_errors", "env-c"); !ok || !hwm.Equal(time.Date(2026, 11, 23, 10, 25, 0, 0, time.UTC)) {
		t.Errorf("env-c HWM %s %v, want 10:25", hwm, ok)
	}

	cancel()
	select {
	case err := <-runDone:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if n := h.clock.Sleepers(); n != 0 {
		t.Errorf("%d goroutines still sleeping after Run returned", n)
	}
}

func TestDescriptorChangeRestartsLoopWithoutDoubleCounting(t *testing.T) {
	h := newHarness(t, nil, "env-a")
	src := &mutableDatasets{ds: []metricsapi.Dataset{testDataset}}
	h.s.cfg.DatasetSource = src
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.s.Run(ctx)
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	h.clock.BlockUntil(wctx, 2)
	ds := testDataset
	ds.Description = "changed"
	ds.Metrics = append(slices.Clone(ds.Metrics), metricsapi.Metric{Name: "requests_new_total", Type: metricsapi.TypeNumber})
	src.set([]metricsapi.Dataset{ds})
	before := len(h.api.queries)
	h.clock.Advance(5 * time.Minute) // discovery at 10:07 restarts the loop
	h.clock.BlockUntil(wctx, 2)
	if len(h.api.queries) <= before {
		t.Fatal("no poll after the descriptor change")
	}
	h.checkExact(t, time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC), time.Date(2026, 11, 23, 10, 5, 0, 0, time.UTC))
}

type mutableDatasets struct {
	mu sync.Mutex
	ds []metricsapi.Dataset
}

func (m *mutableDatasets) Datasets(context.Context) ([]metricsapi.Dataset, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.ds), nil
}

func (m *mutableDatasets) set(ds []metricsapi.Dataset) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ds = ds
}
