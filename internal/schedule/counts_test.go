package schedule

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// pointsRecorder is a Publisher that keeps the newest totals of every
// series (as the Prometheus collector does) and every point (as the OTLP
// sink sends them), checking the contract of SeriesCounts as it goes.
type pointsRecorder struct {
	t      *testing.T
	mu     sync.Mutex
	totals map[string]float64 // env|country → total of requests_edge_total
	start  map[string]time.Time
	points map[string][]recordedPoint
	// counted sums the deltas of the points per series: what a delta
	// backend counts.
	counted map[string]float64
	updates []Update
}

type recordedPoint struct {
	time, prev time.Time
	total      float64
}

func newPointsRecorder(t *testing.T) *pointsRecorder {
	return &pointsRecorder{t: t, totals: map[string]float64{}, start: map[string]time.Time{},
		points: map[string][]recordedPoint{}, counted: map[string]float64{}}
}

func (p *pointsRecorder) Publish(_ context.Context, b *Batch) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !slices.IsSortedFunc(b.Updates, func(a, b Update) int { return a.Row.Time.Compare(b.Row.Time) }) {
		p.t.Errorf("batch updates not in time order")
	}
	p.updates = append(p.updates, b.Updates...)
	for _, sc := range b.Counts {
		k := sc.Environment + "|" + sc.Labels[0]
		total := sc.Totals[0]
		if old, ok := p.totals[k]; ok && total < old {
			p.t.Errorf("%s: total went down from %v to %v", k, old, total)
		}
		p.totals[k] = total
		if st, ok := p.start[k]; ok && !st.Equal(sc.Start) {
			p.t.Errorf("%s: start moved from %s to %s", k, st, sc.Start)
		}
		p.start[k] = sc.Start
		if !sc.Point {
			continue
		}
		pts := p.points[k]
		if n := len(pts); n > 0 {
			last := pts[n-1]
			if !b.End.After(last.time) {
				p.t.Errorf("%s: point at %s after a point at %s", k, b.End, last.time)
			}
			if !sc.PreviousPoint.Equal(last.time) || sc.PreviousTotals[0] != last.total {
				p.t.Errorf("%s: previous point %s %v, want %s %v", k, sc.PreviousPoint, sc.PreviousTotals, last.time, last.total)
			}
		} else if !sc.PreviousPoint.IsZero() && !p.t.Failed() {
			// A series restored from state continues its earlier points.
			p.counted[k] -= sc.PreviousTotals[0]
		}
		if sc.Start.After(b.End) {
			p.t.Errorf("%s: start %s after the point %s", k, sc.Start, b.End)
		}
		p.points[k] = append(pts, recordedPoint{time: b.End, prev: sc.PreviousPoint, total: total})
		prev := 0.0
		if sc.PreviousTotals != nil {
			prev = sc.PreviousTotals[0]
		}
		p.counted[k] += total - prev
	}
	return nil
}

func (p *pointsRecorder) snapshot() (totals map[string]float64, points map[string][]recordedPoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.totals), maps.Clone(p.points)
}

// memState is a StateSaver in memory.
type memState struct {
	mu    sync.Mutex
	saved map[string][]byte
	err   error
}

func (m *memState) Save(dataset string, state []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	if m.saved == nil {
		m.saved = map[string][]byte{}
	}
	m.saved[dataset] = slices.Clone(state)
	return nil
}

// TestTotalsAndPoints: totals are the sums of the buckets counted, points
// come once per bucket boundary in time order with every live series, a
// revision between boundaries is folded into the next point, and the
// deltas of the points add up to the totals.
func TestTotalsAndPoints(t *testing.T) {
	rec := newPointsRecorder(t)
	h := newHarness(t, func(c *Config) {
		c.Publishers = append(c.Publishers, NamedPublisher{Name: "points", Publisher: rec})
		c.Points = true
	}, "env-a", "env-b")
	h.setEnvs("env-a", "env-b")
	first := time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC)
	h.poll(t) // 10:02: end 10:00
	totals, points := rec.snapshot()
	truth := h.api.truth(first, time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
	if !maps.Equal(totals, truth) {
		t.Fatalf("totals %v, want %v", totals, truth)
	}
	for k, pts := range points {
		if len(pts) != 1 || !pts[0].time.Equal(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)) || rec.start[k] != first {
			t.Fatalf("%s: points %v start %s, want one at 10:00 starting 09:30", k, pts, rec.start[k])
		}
	}
	// 10:03, same end: a revision moves the totals but makes no point.
	h.clock.Advance(time.Minute)
	rev := time.Date(2026, 11, 23, 9, 55, 0, 0, time.UTC)
	h.api.set("env-a", "us", rev, value("env-a", "us", rev)+7)
	h.poll(t)
	totals, points = rec.snapshot()
	if totals["env-a|us"] != truth["env-a|us"]+7 || len(points["env-a|us"]) != 1 {
		t.Fatalf("after a revision: total %v (want %v), %d points (want 1)", totals["env-a|us"], truth["env-a|us"]+7, len(points["env-a|us"]))
	}
	// 10:06: the next boundary: every series gets a point, the revision
	// folded in. env-b|de gets no new bucket and still gets its point.
	h.api.mu.Lock()
	delete(h.api.values, bucketKey("env-b", "de", time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)))
	h.api.mu.Unlock()
	h.clock.Advance(3 * time.Minute)
	h.poll(t)
	totals, points = rec.snapshot()
	want := h.api.truth(first, time.Date(2026, 11, 23, 10, 5, 0, 0, time.UTC))
	if !maps.Equal(totals, want) {
		t.Fatalf("totals %v, want %v", totals, want)
	}
	for k, pts := range points {
		if len(pts) != 2 || pts[1].total != want[k] || !pts[1].prev.Equal(pts[0].time) {
			t.Errorf("%s: points %v, want a second at 10:05 with total %v", k, pts, want[k])
		}
		if rec.counted[k] != want[k] {
			t.Errorf("%s: deltas add up to %v, total %v", k, rec.counted[k], want[k])
		}
	}
}

// TestBaselineAfterRestartWithoutState: a tracker that cannot tell a first
// start from a restart remembers the first poll's buckets without counting
// them; revisions of them and later buckets are counted; an environment
// discovered later is counted in full.
func TestBaselineAfterRestartWithoutState(t *testing.T) {
	rec := newPointsRecorder(t)
	h := newHarness(t, func(c *Config) {
		c.Publishers = append(c.Publishers, NamedPublisher{Name: "points", Publisher: rec})
		c.Points = true
		c.Tracker = NewTracker(Restart)
	}, "env-a", "env-b")
	h.s.tracker.Retain([]string{"env-a"})
	h.setEnvs("env-a")
	r := h.poll(t) // 10:02: baseline of [09:30, 10:00)
	if r.Baseline != 12 || r.New != 0 {
		t.Fatalf("baseline poll: baseline %d new %d, want 12, 0", r.Baseline, r.New)
	}
	totals, points := rec.snapshot()
	for k, v := range totals {
		if v != 0 || len(points[k]) != 0 {
			t.Errorf("%s after the baseline: total %v, %d points; want 0 and none", k, v, len(points[k]))
		}
	}
	for _, u := range rec.updates {
		if u.Latest {
			t.Errorf("baseline bucket %s %v is Latest", u.Row.Environment, u.Row.Time)
		}
	}
	rev := time.Date(2026, 11, 23, 9, 55, 0, 0, time.UTC)
	h.api.set("env-a", "us", rev, value("env-a", "us", rev)+7)
	h.s.tracker.Retain([]string{"env-a", "env-b"}) // env-b discovered later
	h.setEnvs("env-a", "env-b")
	h.clock.Advance(4 * time.Minute)
	h.poll(t) // 10:06: bucket 10:00 of env-a counted, the revision too; env-b in full
	totals, points = rec.snapshot()
	end := time.Date(2026, 11, 23, 10, 5, 0, 0, time.UTC)
	for _, c := range countries {
		if got, want := totals["env-a|"+c], h.api.truth(end.Add(-5*time.Minute), end)["env-a|"+c]; c == "us" && got != want+7 || c != "us" && got != want {
			t.Errorf("env-a|%s: total %v after the baseline, want the bucket 10:00 (%v) plus the revision", c, got, want)
		}
		if got, want := totals["env-b|"+c], h.api.truth(time.Date(2026, 11, 23, 9, 35, 0, 0, time.UTC), end)["env-b|"+c]; got != want {
			t.Errorf("env-b|%s (discovered later): total %v, want %v in full", c, got, want)
		}
		k := "env-a|" + c
		if pts := points[k]; len(pts) != 1 || !pts[0].time.Equal(end) || rec.start[k] != time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC) {
			t.Errorf("%s: points %v start %s, want one at 10:05 starting at the baseline's end 10:00", k, pts, rec.start[k])
		}
	}
}

// TestRestoreContinuesExactly saves the tracker at every poll, "crashes"
// (throws away scheduler and tracker) at various moments, restores a new
// tracker from the saved state and goes on: the totals equal the API's sums
// over the whole run, start times stay, points continue in order, and the
// first poll after the restore republishes its range without counting.
func TestRestoreContinuesExactly(t *testing.T) {
	state := &memState{}
	rec := newPointsRecorder(t)
	api := newFakeAPI()
	envs := []string{"env-a", "env-b"}
	api.fill(envs, countries, t0.Add(-48*time.Hour), t0.Add(48*time.Hour), value)
	var clockNow = t0
	start := func(tr *Tracker) *harness {
		h := newHarness(t, func(c *Config) {
			c.Fetcher, c.DatasetSource = api, api
			c.Publishers = []NamedPublisher{{Name: "points", Publisher: rec}}
			c.Points, c.State, c.Tracker = true, state, tr
		}, envs...)
		h.api = api
		h.clock.Set(clockNow)
		h.setEnvs(envs...)
		return h
	}
	h := start(NewTracker(FirstStart))
	first := time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC)
	step := func(d time.Duration, revise bool) {
		h.clock.Advance(d)
		clockNow = h.clock.Now()
		if revise {
			b := metricsapi.FiveMinutes.Truncate(clockNow).Add(-10 * time.Minute)
			api.set("env-b", "de", b, value("env-b", "de", b)+float64(clockNow.Minute()))
		}
		h.poll(t)
	}
	h.poll(t)
	for i := range 12 {
		step(time.Minute, i%3 == 0)
	}
	restarts := 0
	for _, stopped := range []time.Duration{0, 2 * time.Minute, 47 * time.Minute} {
		tr := NewTracker(Restart)
		if err := tr.Restore(h.ds.Name, state.saved[h.ds.Name]); err != nil {
			t.Fatal(err)
		}
		clockNow = clockNow.Add(stopped) // buckets end while nothing runs
		h = start(tr)
		rec.mu.Lock()
		before := len(rec.updates)
		rec.mu.Unlock()
		r := h.poll(t)
		restarts++
		if r.Baseline != 0 || r.Replayed == 0 {
			t.Errorf("restart %d: first poll baseline %d replayed %d; want none and some", restarts, r.Baseline, r.Replayed)
		}
		rec.mu.Lock()
		for _, u := range rec.updates[before:] {
			if slices.Equal(u.Previous, u.Row.Values) && u.Latest {
				t.Errorf("restart %d: replayed bucket %v marked Latest", restarts, u.Row.Time)
			}
		}
		rec.mu.Unlock()
		for i := range 9 {
			step(time.Minute, i%4 == 1)
		}
	}
	end := metricsapi.FiveMinutes.Truncate(clockNow)
	truth := api.truth(first, end)
	totals, points := rec.snapshot()
	if !maps.Equal(totals, truth) {
		t.Errorf("totals after %d restarts %v, want the API's sums %v", restarts, totals, truth)
	}
	for k, pts := range points {
		if last := pts[len(pts)-1]; !last.time.Equal(end) || rec.counted[k] != truth[k] || rec.start[k] != first {
			t.Errorf("%s: last point %v, deltas add up to %v, start %s; want %s, %v, %s", k, last, rec.counted[k], rec.start[k], end, truth[k], first)
		}
	}
}

func TestRestoreRefusesBadState(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.State = &memState{} }, "env-a")
	h.setEnvs("env-a")
	h.poll(t)
	good, err := h.s.tracker.Snapshot(h.ds.Name)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		dataset string
		state   []byte
		want    string
	}{
		"garbage":       {h.ds.Name, []byte("not a state"), "decode"},
		"truncated":     {h.ds.Name, good[:len(good)/2], "decode"},
		"other dataset": {"origin_errors", good, `holds dataset "edge_errors"`},
	} {
		t.Run(name, func(t *testing.T) {
			tr := NewTracker(Restart)
			err := tr.Restore(tc.dataset, tc.state)
			if !errors.Is(err, ErrBadState) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Restore = %v, want ErrBadState mentioning %q", err, tc.want)
			}
			if tr.Series(tc.dataset) != 0 {
				t.Error("a refused state was partly applied")
			}
		})
	}
	// A state saver that fails does not fail the poll; the report says so.
	h2 := newHarness(t, func(c *Config) { c.State = &memState{err: errors.New("disk full")} }, "env-a")
	h2.setEnvs("env-a")
	if r := h2.poll(t); r.StateErr == nil || !strings.Contains(r.StateErr.Error(), "disk full") {
		t.Errorf("poll with a failing state saver: StateErr %v", r.StateErr)
	}
}

// TestLatestBuckets: only first sightings later than every bucket of their
// series, and within the settle window, are Latest.
func TestLatestBuckets(t *testing.T) {
	tr := NewTracker(FirstStart)
	metrics := []string{"requests_edge_total", "requests_cache_hit_ratio"}
	end := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	opts := applyOptions{width: 5 * time.Minute, settle: 30 * time.Minute, ttl: DefaultSeriesTTL, points: true}
	floors := map[string]time.Time{"e1": end.Add(-2 * time.Hour)}
	row := func(minutesBeforeEnd int, country string) metricsapi.Row {
		return metricsapi.Row{Time: end.Add(-time.Duration(minutesBeforeEnd) * time.Minute), Environment: "e1", Labels: []string{country}, Values: []float64{1, 0.5}}
	}
	res := &metricsapi.Result{Labels: []string{"country_code"}, Metrics: metrics, Rows: []metricsapi.Row{
		row(10, "us"), row(60, "us"), row(5, "us"), row(35, "us"), row(30, "us"),
	}}
	pr := tr.apply("edge_usage_by_country", res, floors, end, opts)
	var latest []int
	for i, u := range pr.updates {
		if i > 0 && u.Row.Time.Before(pr.updates[i-1].Row.Time) {
			t.Fatal("updates not in time order")
		}
		if u.Latest {
			latest = append(latest, int(end.Sub(u.Row.Time)/time.Minute))
		}
	}
	// 60 and 35 minutes before the end ended outside the settle window.
	if !slices.Equal(latest, []int{30, 10, 5}) {
		t.Errorf("latest buckets (minutes before end) %v, want [30 10 5]", latest)
	}
	if len(pr.counts) != 1 || !pr.counts[0].Point || pr.counts[0].Totals[0] != 5 || !math.IsNaN(pr.counts[0].Totals[1]) {
		t.Fatalf("counts %+v, want one series with a point, total 5 and NaN for the ratio", pr.counts)
	}
	// A late first sighting older than the series' newest bucket is not
	// Latest (its gauge would go back in time) but is counted.
	res.Rows = []metricsapi.Row{row(15, "us"), row(20, "de")}
	pr = tr.apply("edge_usage_by_country", res, floors, end.Add(time.Minute), opts)
	for _, u := range pr.updates {
		if u.Latest != (u.Row.Labels[0] == "de") {
			t.Errorf("%s @%s: latest %v", u.Row.Labels[0], u.Row.Time, u.Latest)
		}
	}
}

// TestSeriesTTL: a series without buckets for longer than the TTL is
// forgotten, with its totals; one inside it keeps getting points.
func TestSeriesTTL(t *testing.T) {
	rec := newPointsRecorder(t)
	h := newHarness(t, func(c *Config) {
		c.Publishers = append(c.Publishers, NamedPublisher{Name: "points", Publisher: rec})
		c.Points = true
		c.SeriesTTL = time.Hour
	}, "env-a")
	h.setEnvs("env-a")
	h.poll(t)
	// "de" stops at 10:00.
	h.api.mu.Lock()
	for k := range h.api.values {
		var ns int64
		p := splitKey(k)
		if _, err := fmt.Sscan(p[2], &ns); err == nil && p[1] == "de" && ns >= time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC).UnixNano() {
			delete(h.api.values, k)
		}
	}
	h.api.mu.Unlock()
	for range 12 { // to 11:02
		h.clock.Advance(5 * time.Minute)
		h.poll(t)
	}
	_, points := rec.snapshot()
	if last := points["env-a|de"][len(points["env-a|de"])-1]; !last.time.Equal(time.Date(2026, 11, 23, 11, 0, 0, 0, time.UTC)) {
		t.Errorf("env-a|de: last point at %s, want 11:00 (its newest bucket 09:55 is within the TTL of the dataset's newest, 10:55)", last.time)
	}
	if h.s.tracker.Series(h.ds.Name) != 2 {
		t.Errorf("%d series before the TTL, want 2", h.s.tracker.Series(h.ds.Name))
	}
	h.clock.Advance(5 * time.Minute)
	h.poll(t)
	if n := h.s.tracker.Series(h.ds.Name); n != 1 {
		t.Errorf("%d series after the TTL, want 1", n)
	}
}
