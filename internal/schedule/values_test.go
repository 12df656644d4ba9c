package schedule

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule/fakeclock"
)

var nan = math.NaN()

func TestMergeValues(t *testing.T) {
	count := []bool{true, false}
	for _, tc := range []struct {
		name       string
		prev, next []float64
		want       []float64 // nil: unchanged
		decreases  int
	}{
		{"unchanged", []float64{10, 0.5}, []float64{10, 0.5}, nil, 0},
		{"both change", []float64{10, 0.5}, []float64{12, 0.4}, []float64{12, 0.4}, 0},
		{"no value keeps the last good one", []float64{10, 0.5}, []float64{nan, nan}, nil, 0},
		{"no count, a new ratio", []float64{10, 0.5}, []float64{nan, 0.7}, []float64{10, 0.7}, 0},
		{"a count that decreases is not applied", []float64{10, 0.5}, []float64{7, 0.5}, nil, 1},
		{"decrease kept, ratio moves", []float64{10, 0.5}, []float64{7, 0.6}, []float64{10, 0.6}, 1},
		{"a ratio may go down", []float64{10, 0.5}, []float64{10, 0.1}, []float64{10, 0.1}, 0},
		{"first value of a metric", []float64{nan, 0.5}, []float64{3, nan}, []float64{3, 0.5}, 0},
		{"still no value", []float64{nan, 0.5}, []float64{nan, 0.5}, nil, 0},
		{"a metric added later", []float64{10}, []float64{10, 0.5}, []float64{10, 0.5}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, dec := mergeValues(tc.prev, tc.next, count)
			if dec != tc.decreases {
				t.Errorf("decreases %d, want %d", dec, tc.decreases)
			}
			if (got == nil) != (tc.want == nil) || !slices.EqualFunc(got, tc.want, func(a, b float64) bool {
				return a == b || math.IsNaN(a) && math.IsNaN(b)
			}) {
				t.Errorf("merged %v, want %v", got, tc.want)
			}
		})
	}
}

// valueFetcher wraps fakeAPI so a test can make values of chosen polls
// "not values" (NaN, as the decoder hands them on), as a misbehaving
// platform would.
type valueFetcher struct {
	*fakeAPI
	spoil func(v float64) float64 // applied to every value while set
}

func (f *valueFetcher) Data(ctx context.Context, q metricsapi.Query) (*metricsapi.Result, error) {
	res, err := f.fakeAPI.Data(ctx, q)
	if err != nil || f.spoil == nil {
		return res, err
	}
	for i := range res.Rows {
		vals := slices.Clone(res.Rows[i].Values)
		for j := range vals {
			vals[j] = f.spoil(vals[j])
		}
		res.Rows[i].Values = vals
	}
	return res, nil
}

// TestValuesThatAreNotNeverCountTwice is the tracker's half of issue 11's
// first finding: a poll without values for buckets already published, then
// normal data, must not add those buckets again; a poll with lowered counts
// must not be applied (then the normal value again would add its difference
// twice); buckets first seen without values are published once they have
// them.
func TestValuesThatAreNotNeverCountTwice(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(float64) float64
	}{
		{"no value", func(float64) float64 { return nan }},
		{"lowered counts", func(v float64) float64 { return v / 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vf := &valueFetcher{}
			h := newHarness(t, func(c *Config) { c.Fetcher = vf }, "env-a", "env-b")
			vf.fakeAPI = h.api
			h.setEnvs("env-a", "env-b")
			h.poll(t) // [09:30, 10:00) published
			vf.spoil = tc.spoil
			var decreases int
			for range 2 { // two bad polls: re-polled buckets and a new one
				h.clock.Advance(5 * time.Minute)
				r := h.poll(t)
				decreases += r.Decreases
			}
			vf.spoil = nil
			h.clock.Advance(5 * time.Minute) // 10:17
			rev := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
			h.api.set("env-a", "us", rev, value("env-a", "us", rev)+5) // and a revision
			h.poll(t)
			h.checkExact(t, time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC), time.Date(2026, 11, 23, 10, 15, 0, 0, time.UTC))
			if tc.name == "lowered counts" && decreases == 0 {
				t.Error("no decrease reported")
			}
		})
	}
}

// skewedPlatform is a fakeAPI behind a clock of its own: it answers with
// rows of buckets that have started by its clock only (a future range is a
// 200 without rows, as the platform does), and reports its clock as the
// Date of every answer to the PlatformClock, as the platform client does.
type skewedPlatform struct {
	*fakeAPI
	local  *fakeclock.Clock
	offset time.Duration // platform clock − local clock
	pc     *PlatformClock
}

func (p *skewedPlatform) now() time.Time { return p.local.Now().Add(p.offset) }

func (p *skewedPlatform) Datasets(ctx context.Context) ([]metricsapi.Dataset, error) {
	p.pc.ObserveDate(p.now().Truncate(time.Second), 0)
	return p.fakeAPI.Datasets(ctx)
}

func (p *skewedPlatform) Data(ctx context.Context, q metricsapi.Query) (*metricsapi.Result, error) {
	now := p.now()
	if q.End.After(now) {
		q.End = p.g.Truncate(now).Add(p.g.Duration()) // the bucket in progress and nothing later
	}
	res, err := p.fakeAPI.Data(ctx, q)
	p.pc.ObserveDate(now.Truncate(time.Second), 0)
	return res, err
}

// TestPlatformClockSkipsNoBucket runs the scheduler's loops with the
// platform's clock 40 minutes behind, then ahead of, the local one, and
// each time catching up: with the PlatformClock every bucket is counted
// exactly once; with the local clock the platform-behind case loses buckets
// (the proof that the test can fail).
func TestPlatformClockSkipsNoBucket(t *testing.T) {
	for _, tc := range []struct {
		name        string
		offset      time.Duration
		localClock  bool
		wantSkipped bool
	}{
		{name: "platform behind", offset: -40 * time.Minute},
		{name: "platform ahead", offset: 40 * time.Minute},
		{name: "platform behind, local clock", offset: -40 * time.Minute, localClock: true, wantSkipped: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &recordingObserver{}
			local := fakeclock.New(t0)
			pc := NewPlatformClock(local)
			p := &skewedPlatform{fakeAPI: newFakeAPI(), local: local, offset: tc.offset, pc: pc}
			envs := []string{"env-a", "env-b"}
			p.fill(envs, countries, t0.Add(-48*time.Hour), t0.Add(48*time.Hour), value)
			pub := newCounter()
			var clock Clock = pc
			if tc.localClock {
				clock = local
			}
			s, err := New(Config{DatasetSource: p, Environments: &staticEnvs{envs: envs}, Fetcher: p,
				Publishers: []NamedPublisher{{Name: "counter", Publisher: pub}}, Observer: obs, Clock: clock, Logger: quietLogger(),
				Tracker: NewTracker(FirstStart)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			settle := func() {
				t.Helper()
				wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
				defer wcancel()
				if err := local.BlockUntil(wctx, 2); err != nil {
					t.Fatalf("loops did not settle at %s", local.Now())
				}
			}
			settle()
			firstFrom := metricsapi.FiveMinutes.Truncate(t0.Add(tc.offset)).Add(-30 * time.Minute)
			if tc.localClock {
				firstFrom = metricsapi.FiveMinutes.Truncate(t0).Add(-30 * time.Minute)
			}
			for range 120 { // two hours skewed, a poll a minute
				local.Advance(time.Minute)
				settle()
			}
			if got, ok := pc.Skew(); !ok || (got-tc.offset).Abs() > time.Second {
				t.Errorf("skew %v (known %v), want %v", got, ok, tc.offset)
			}
			p.offset = 0 // the platform's clock is corrected
			for range 90 {
				local.Advance(time.Minute)
				settle()
			}
			cancel()
			<-done
			end := metricsapi.FiveMinutes.Truncate(local.Now())
			sums, seen, _ := pub.snapshot()
			truth := p.truth(firstFrom, end)
			skipped := 0
			for k, v := range truth {
				if sums[k] != v {
					skipped++
					if !tc.wantSkipped {
						t.Errorf("series %s: counted %v, platform's sum %v", k, sums[k], v)
					}
				}
			}
			for k, n := range seen {
				if n != 1 {
					t.Errorf("bucket %s published as new %d times", k, n)
				}
			}
			if tc.wantSkipped != (skipped > 0) {
				t.Errorf("%d of %d series differ from the platform's sums; want skipped=%v", skipped, len(truth), tc.wantSkipped)
			}
		})
	}
}

func TestPlatformClock(t *testing.T) {
	local := fakeclock.New(t0)
	pc := NewPlatformClock(local)
	if _, ok := pc.Skew(); ok || !pc.Now().Equal(t0) {
		t.Fatalf("before any answer: skew known, or Now %s != local %s", pc.Now(), t0)
	}
	// Dates 10 minutes behind, one wild one, one with a slow round trip.
	behind := t0.Add(-10 * time.Minute)
	for i, d := range []time.Time{behind, behind, behind.Add(3 * time.Hour), behind} {
		rtt := time.Duration(0)
		if i == 3 {
			rtt = 2 * time.Second // processed a second before the answer arrived
			d = d.Add(-time.Second)
		}
		pc.ObserveDate(d, rtt)
	}
	skew, ok := pc.Skew()
	if !ok || skew != -10*time.Minute+500*time.Millisecond {
		t.Errorf("skew %v, want -9m59.5s (the median; Dates are whole seconds)", skew)
	}
	if got := pc.Now(); !got.Equal(t0.Add(skew)) {
		t.Errorf("Now %s, want local + skew", got)
	}
	if latest, _ := pc.Latest(); !latest.Equal(behind.Add(-time.Second)) {
		t.Errorf("Latest %s, want the newest answer's Date", latest)
	}
	// A change of the platform's clock is followed after three answers.
	for range 3 {
		pc.ObserveDate(t0.Add(time.Hour), 0)
	}
	if skew, _ := pc.Skew(); skew != time.Hour+500*time.Millisecond {
		t.Errorf("skew %v after the platform's clock moved, want 1h0m0.5s", skew)
	}
}

// TestDeferredRowsAreFetchedAgain feeds a poll rows of buckets that had not
// ended by the platform's newest Date: they are counted, not published, and
// the next poll publishes them.
func TestDeferredRowsAreFetchedAgain(t *testing.T) {
	local := fakeclock.New(t0) // 10:02
	pc := NewPlatformClock(local)
	h := newHarness(t, func(c *Config) { c.Clock = pc }, "env-a")
	h.setEnvs("env-a")
	// The platform's last answer says 09:53:10: the buckets from 09:50 on
	// may still be filling there, whatever the estimate says.
	pc.ObserveDate(time.Date(2026, 11, 23, 9, 53, 10, 0, time.UTC), 0)
	pc.samples = []time.Duration{0} // but the estimate is still the local clock
	pc.skew = 0
	r := h.poll(t)
	if !r.To.Equal(time.Date(2026, 11, 23, 9, 50, 0, 0, time.UTC)) || r.Deferred != 2*len(countries) {
		t.Fatalf("poll to %s with %d deferred rows, want 09:50 and %d", r.To, r.Deferred, 2*len(countries))
	}
	if hwm, _ := h.s.Tracker().HighWaterMark(h.ds.Name, "env-a"); !hwm.Equal(r.To) {
		t.Fatalf("high-water mark %s moved past the platform's clock", hwm)
	}
	pc.ObserveDate(t0, 0)
	h.poll(t) // from the mark 09:50 minus the settle window
	h.checkExact(t, time.Date(2026, 11, 23, 9, 20, 0, 0, time.UTC), time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
}

func TestUnknownDatasetFailsFirstDiscovery(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Datasets = []string{"edge_eror"} }, "env-a")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := h.s.Run(ctx)
	if !errors.Is(err, ErrUnknownDataset) || !strings.Contains(err.Error(), `"edge_eror"`) || !strings.Contains(err.Error(), "edge_errors") {
		t.Fatalf("Run = %v, want ErrUnknownDataset naming edge_eror and listing edge_errors", err)
	}
	h.obs.mu.Lock()
	defer h.obs.mu.Unlock()
	if len(h.obs.discoveries) != 1 || h.obs.discoveries[0].Err == nil {
		t.Errorf("discoveries observed %+v, want one failed", h.obs.discoveries)
	}
}

// TestDatasetGoneLaterIsAWarning: after a successful start, a configured
// dataset that disappears stops its loop and is logged, without stopping
// the scheduler.
func TestDatasetGoneLaterIsAWarning(t *testing.T) {
	mds := &mutableDatasets{ds: []metricsapi.Dataset{testDataset}}
	h := newHarness(t, func(c *Config) { c.Datasets = []string{"edge_errors"}; c.DatasetSource = mds }, "env-a")
	ctx := context.Background()
	if err := h.s.discover(ctx); err != nil {
		t.Fatal(err)
	}
	mds.set(nil)
	if err := h.s.discover(ctx); err != nil {
		t.Fatalf("second discovery: %v, want only a warning", err)
	}
	h.s.stopAll()
	h.obs.mu.Lock()
	defer h.obs.mu.Unlock()
	if got := h.obs.discoveries; len(got) != 2 || got[0].Err != nil || !slices.Equal(got[0].Datasets, []string{"edge_errors"}) ||
		got[1].Err != nil || len(got[1].Datasets) != 0 {
		t.Errorf("discoveries %+v", got)
	}
}

// TestTrackerPublishesOnlyValues walks one bucket through the cases of
// issue 11: every update carries a value for every count, a non-value
// never replaces a published value, a decrease is not applied.
func TestTrackerPublishesOnlyValues(t *testing.T) {
	tr := NewTracker(FirstStart)
	bucket := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	floors := map[string]time.Time{"e1": bucket.Add(-time.Hour)}
	end := bucket.Add(time.Hour)
	metrics := []string{"requests_edge_total", "requests_cache_hit_ratio"}
	steps := []struct {
		name      string
		values    []float64
		want      []float64 // published values; nil: nothing published
		prev      []float64
		held      int
		decreases int
	}{
		{"count without value: held", []float64{nan, 0.5}, nil, nil, 1, 0},
		{"count, no ratio: published", []float64{10, nan}, []float64{10, nan}, nil, 0, 0},
		{"ratio arrives, count lost: last good count stays", []float64{nan, 0.7}, []float64{10, 0.7}, []float64{10, nan}, 0, 0},
		{"count decreases: not applied", []float64{8, 0.7}, nil, nil, 0, 1},
		{"count grows, ratio lost", []float64{12, nan}, []float64{12, 0.7}, []float64{10, 0.7}, 0, 0},
		{"nothing but non-values", []float64{nan, nan}, nil, nil, 0, 0},
	}
	for _, st := range steps {
		res := &metricsapi.Result{Labels: []string{}, Metrics: metrics,
			Rows: []metricsapi.Row{{Time: bucket, Environment: "e1", Labels: []string{}, Values: st.values}}}
		pr := tr.apply("edge_usage_by_country", res, floors, end, applyOptions{width: time.Hour, settle: 3 * time.Hour, ttl: DefaultSeriesTTL})
		same := func(a, b []float64) bool {
			return slices.EqualFunc(a, b, func(x, y float64) bool { return x == y || math.IsNaN(x) && math.IsNaN(y) })
		}
		switch {
		case pr.held != st.held || pr.decreases != st.decreases:
			t.Errorf("%s: held %d decreases %d, want %d %d", st.name, pr.held, pr.decreases, st.held, st.decreases)
		case st.want == nil && len(pr.updates) != 0:
			t.Errorf("%s: published %+v, want nothing", st.name, pr.updates)
		case st.want != nil && (len(pr.updates) != 1 || !same(pr.updates[0].Row.Values, st.want) || !same(pr.updates[0].Previous, st.prev)):
			t.Errorf("%s: published %+v, want values %v previous %v", st.name, pr.updates, st.want, st.prev)
		}
	}
}

// TestPollDurationOnTheLocalClock: a poll's duration is measured on this
// machine's clock, so a skew estimate that moves during the poll (here the
// platform's answer puts its clock a minute behind) cannot make it
// negative.
func TestPollDurationOnTheLocalClock(t *testing.T) {
	local := fakeclock.New(t0)
	pc := NewPlatformClock(local)
	p := &skewedPlatform{local: local, offset: -time.Minute, pc: pc}
	h := newHarness(t, func(c *Config) { c.Clock = pc; c.Fetcher = p }, "env-a")
	p.fakeAPI = h.api
	h.setEnvs("env-a")
	r := h.poll(t)
	if r.Err != nil || r.Duration < 0 {
		t.Fatalf("poll: duration %s, err %v", r.Duration, r.Err)
	}
	if skew, _ := pc.Skew(); skew > -50*time.Second {
		t.Fatalf("the poll did not move the skew estimate (%s): not a test", skew)
	}
}
