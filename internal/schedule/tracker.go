package schedule

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// Start says what a Tracker may assume about buckets published before it
// was created.
type Start int

const (
	// Restart is the safe assumption: an earlier run may have published
	// buckets and left no state behind. The first successful poll of every
	// environment known at start is a baseline: its buckets are remembered
	// (and handed to the sinks for their gauges and rows) but not counted,
	// so nothing an earlier run counted is counted again; the buckets that
	// ended while nothing ran are not counted either. Environments that
	// appear later (discovered after the first Retain) are counted in full.
	Restart Start = iota
	// FirstStart means nothing was published before: the first poll of
	// every environment is counted in full.
	FirstStart
)

// Tracker is the scheduler's memory that outlives any one poll loop, so a
// restarted loop neither skips nor double-counts a bucket. Per dataset and
// environment it keeps the HighWaterMark (the end of the newest bucket range
// fetched successfully); per series it keeps the values last published for
// every bucket inside the settle window, to tell first sightings, revisions
// and unchanged re-polls apart, and the running totals of its counts (the sum
// of every bucket value counted since the series' start) with the time and
// totals of its last point. Snapshot and Restore carry all of it across a
// restart. It is safe for concurrent use.
type Tracker struct {
	mu       sync.Mutex
	start    Start
	datasets map[string]*datasetTrack
	// served is the environment set of the last Retain (nil before):
	// results of other environments are neither applied nor committed.
	served map[string]bool
	// later holds, in Restart mode, the environments that were not served
	// at the first Retain: new ones, counted in full.
	later map[string]bool
}

type datasetTrack struct {
	hwm map[string]time.Time
	// resume holds the floor a ResumeSource gave an environment that has
	// no HighWaterMark yet; asked records that it was asked for it.
	resume map[string]time.Time
	asked  map[string]bool

	labels  []string
	metrics []string
	series  map[string]*seriesTrack
	// newest is the start of the newest bucket seen in the dataset (Unix
	// ns): series whose newest bucket is older than newest − series TTL
	// are forgotten.
	newest int64
	// pointT is the poll end (Unix ns) at which points were last made.
	pointT int64
	// replay is set by Restore: the next poll republishes every bucket it
	// fetches and the totals of every live series, so sinks that start
	// empty (gauges, ClickHouse rows a crash lost) get them back.
	replay bool
}

type seriesTrack struct {
	env     string
	labels  []string
	buckets []bucketValues // ascending by t; the settle window
	// start is when counting began for the series (Unix ns): the floor of
	// the poll that first counted it, or the end of its baseline poll.
	start int64
	// newest is the start of the newest bucket published (Unix ns); it
	// outlives the buckets trimmed from the settle window.
	newest int64
	// totals holds, per metric, the sum of every bucket value counted since
	// start for a count, NaN for other metrics.
	totals []float64
	// pointT is the time of the series' last point (poll end, Unix ns; 0:
	// none) and pointTotals its totals then.
	pointT      int64
	pointTotals []float64
	// changed marks a series whose totals or existence changed in the poll
	// being applied.
	changed bool
}

type bucketValues struct {
	t      int64 // bucket start, Unix nanoseconds
	values []float64
}

// NewTracker returns an empty Tracker that assumes start about earlier runs.
func NewTracker(start Start) *Tracker {
	return &Tracker{start: start, datasets: make(map[string]*datasetTrack)}
}

func (t *Tracker) dataset(name string) *datasetTrack {
	d := t.datasets[name]
	if d == nil {
		d = &datasetTrack{
			hwm:    make(map[string]time.Time),
			resume: make(map[string]time.Time),
			asked:  make(map[string]bool),
			series: make(map[string]*seriesTrack),
			newest: math.MinInt64,
		}
		t.datasets[name] = d
	}
	return d
}

// needResume returns the environments of envs that have neither a
// HighWaterMark nor been asked for a resume point.
func (t *Tracker) needResume(dataset string, envs []string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.dataset(dataset)
	var out []string
	for _, e := range envs {
		if _, ok := d.hwm[e]; !ok && !d.asked[e] {
			out = append(out, e)
		}
	}
	return out
}

// setResume records the resume points of envs (asked of a ResumeSource;
// environments missing from points have nothing stored).
func (t *Tracker) setResume(dataset string, envs []string, points map[string]time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.dataset(dataset)
	for _, e := range envs {
		d.asked[e] = true
		if p, ok := points[e]; ok && !p.IsZero() {
			d.resume[e] = p
		}
	}
}

// floors returns, per environment, the oldest bucket start a poll ending at
// to must fetch: HighWaterMark − settle; for an environment without one,
// min(resume point, to) − settle, or to − settle when nothing is stored.
// notBefore bounds every floor (the dataset's retention).
func (t *Tracker) floors(dataset string, envs []string, to time.Time, settle time.Duration, notBefore time.Time) map[string]time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.dataset(dataset)
	out := make(map[string]time.Time, len(envs))
	for _, e := range envs {
		var f time.Time
		if h, ok := d.hwm[e]; ok {
			f = h.Add(-settle)
		} else if r, ok := d.resume[e]; ok && r.Before(to) {
			f = r.Add(-settle)
		} else {
			f = to.Add(-settle)
		}
		if f.Before(notBefore) {
			f = notBefore
		}
		out[e] = f
	}
	return out
}

// applyOptions are the scheduler's settings apply needs.
type applyOptions struct {
	width  time.Duration // bucket width
	settle time.Duration
	ttl    time.Duration // series TTL
	points bool          // make points (Config.Points)
}

// pollResult is what apply made of a query result.
type pollResult struct {
	updates   []Update
	counts    []SeriesCounts
	rows      int
	newOnes   int
	revisions int
	// baseline counts buckets remembered, not counted (Restart).
	baseline int
	// replays counts unchanged buckets republished after a Restore.
	replays int
	// decreases counts count values lower than the value published for
	// their bucket: not applied.
	decreases int
	// deferred counts rows whose bucket starts at or after the poll's end:
	// not applied, fetched again by a later poll.
	deferred int
	// held counts buckets seen for the first time without a value for
	// every count: not published yet, fetched again by the next poll.
	held   int
	newest time.Time // start of the newest bucket received
}

// apply compares the rows of res with what was published before and
// returns the updates and series totals to publish. Rows of an environment
// not in floors, or before their environment's floor, are ignored; rows at
// or after end are counted as deferred and left for a later poll (the
// HighWaterMark never passes end, so a later poll fetches them again).
// apply records the new values and totals; commit then advances the
// HighWaterMarks.
//
// What is published for a bucket only ever moves forward: a metric the row
// has no value for (NaN) keeps the value published before, and a count
// lower than the one published before is not applied (and counted), so
// every sink sees the same, never-decreasing counts. A bucket is first
// published once it has a value for every count (it is held, and counted,
// until then); a ratio, rate or percentile may still lack one (NaN: an
// undefined ratio of a bucket without traffic), which sinks leave out.
// Every update therefore carries a value for every count. A first sighting
// adds its counts to the series' totals, a revision its difference; in a
// baseline poll neither happens.
//
// apply sorts res.Rows by time; updates come out in that order. With opts.points, every live
// series gets a point at end once end is later than its last point.
func (t *Tracker) apply(dataset string, res *metricsapi.Result, floors map[string]time.Time, end time.Time, opts applyOptions) pollResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.dataset(dataset)
	if !slices.Equal(d.labels, res.Labels) {
		// Series keys depend on the label order: start over (a descriptor
		// change; the series' memory and totals are lost).
		d.labels = slices.Clone(res.Labels)
		clear(d.series)
	}
	if !slices.Equal(d.metrics, res.Metrics) {
		d.remapMetrics(res.Metrics)
	}
	isCount := make([]bool, len(res.Metrics))
	for i, m := range res.Metrics {
		isCount[i] = metricsapi.Classify(m).Kind == metricsapi.KindCount
	}
	var pr pollResult
	endNs := end.UnixNano()
	presentFrom := endNs - int64(opts.settle) // a bucket ending after this is recent
	width := int64(opts.width)
	baseline := make(map[string]bool)
	var changed []*seriesTrack
	// In time order, so a series' buckets are first seen oldest first (for
	// Latest) and the updates come out ordered.
	slices.SortStableFunc(res.Rows, func(a, b metricsapi.Row) int { return a.Time.Compare(b.Time) })
	for i := range res.Rows {
		row := &res.Rows[i]
		floor, ok := floors[row.Environment]
		if !ok || (t.served != nil && !t.served[row.Environment]) {
			continue
		}
		bt := row.Time.UnixNano()
		if bt >= endNs {
			pr.deferred++
			continue
		}
		if bt < floor.UnixNano() {
			continue
		}
		base, known := baseline[row.Environment]
		if !known {
			base = t.needsBaseline(d, row.Environment)
			baseline[row.Environment] = base
		}
		key := row.SeriesKey()
		s := d.series[key]
		idx, found := 0, false
		if s != nil {
			idx, found = slices.BinarySearchFunc(s.buckets, bt, func(b bucketValues, t int64) int { return cmp.Compare(b.t, t) })
		}
		if !found && !countsComplete(row.Values, isCount) {
			pr.held++
			continue
		}
		pr.rows++
		if row.Time.After(pr.newest) {
			pr.newest = row.Time
		}
		if bt > d.newest {
			d.newest = bt
		}
		if s == nil {
			s = &seriesTrack{env: row.Environment, labels: slices.Clone(row.Labels), start: floor.UnixNano(),
				newest: math.MinInt64, totals: newTotals(isCount)}
			if base {
				// Counting starts at the baseline's end: the series' first
				// point comes after it (and is not at its time).
				s.start, s.pointT, s.pointTotals = endNs, endNs, slices.Clone(s.totals)
			}
			d.series[key] = s
			changed = markChanged(changed, s)
		}
		if !found {
			latest := !base && bt > s.newest && bt+width > presentFrom
			s.buckets = slices.Insert(s.buckets, idx, bucketValues{t: bt, values: row.Values})
			s.newest = max(s.newest, bt)
			pr.updates = append(pr.updates, Update{Row: *row, Latest: latest})
			if base {
				pr.baseline++
				continue
			}
			addCounts(s.totals, nil, row.Values, isCount)
			changed = markChanged(changed, s)
			pr.newOnes++
			continue
		}
		prev := s.buckets[idx].values
		merged, decreases := mergeValues(prev, row.Values, isCount)
		pr.decreases += decreases
		if merged == nil {
			if d.replay {
				u := Update{Row: *row, Previous: prev}
				u.Row.Values = prev
				pr.updates = append(pr.updates, u)
				pr.replays++
			}
			continue
		}
		s.buckets[idx].values = merged
		if !base && addCounts(s.totals, prev, merged, isCount) {
			changed = markChanged(changed, s)
		}
		u := Update{Row: *row, Previous: prev}
		u.Row.Values = merged
		pr.updates = append(pr.updates, u)
		pr.revisions++
	}
	pr.counts = d.seriesCounts(changed, endNs, opts)
	return pr
}

// seriesCounts returns the totals to publish after a poll ending at endNs:
// those of every series in changed, and of every live series when points
// are due or a Restore is being replayed. It makes the points that are due
// and clears the changed marks.
func (d *datasetTrack) seriesCounts(changed []*seriesTrack, endNs int64, opts applyOptions) []SeriesCounts {
	pointsDue := opts.points && endNs > d.pointT
	all := pointsDue || d.replay
	live := int64(math.MinInt64)
	if d.newest > math.MinInt64+int64(opts.ttl) {
		live = d.newest - int64(opts.ttl)
	}
	var out []SeriesCounts
	add := func(s *seriesTrack) {
		sc := SeriesCounts{Environment: s.env, Labels: s.labels, Totals: slices.Clone(s.totals),
			Start: time.Unix(0, s.start).UTC(), Newest: time.Unix(0, s.newest).UTC()}
		if pointsDue && s.pointT < endNs && s.newest >= live {
			sc.Point = true
			if s.pointT > 0 {
				sc.PreviousPoint = time.Unix(0, s.pointT).UTC()
				sc.PreviousTotals = s.pointTotals
			}
			s.pointT, s.pointTotals = endNs, sc.Totals
		}
		out = append(out, sc)
	}
	if all {
		for _, s := range d.series {
			if s.changed || s.newest >= live {
				add(s)
			}
			s.changed = false
		}
	} else {
		for _, s := range changed {
			add(s)
			s.changed = false
		}
	}
	if pointsDue {
		d.pointT = endNs
	}
	d.replay = false
	return out
}

// needsBaseline reports whether env's next poll of d is a baseline.
func (t *Tracker) needsBaseline(d *datasetTrack, env string) bool {
	if t.start != Restart || t.later[env] {
		return false
	}
	_, ok := d.hwm[env]
	return !ok
}

// newTotals returns the totals of a new series: 0 for counts, NaN else.
func newTotals(isCount []bool) []float64 {
	out := make([]float64, len(isCount))
	for i, c := range isCount {
		if !c {
			out[i] = math.NaN()
		}
	}
	return out
}

// addCounts adds next − prev (prev nil or NaN: next) of every count to
// totals and reports whether a total changed. mergeValues guarantees next
// is not below prev.
func addCounts(totals, prev, next []float64, isCount []bool) bool {
	changed := false
	for i, v := range next {
		if !isCount[i] || math.IsNaN(v) || i >= len(totals) {
			continue
		}
		if p := valueAt(prev, i); !math.IsNaN(p) {
			v -= p
		}
		if v != 0 {
			totals[i] += v
			changed = true
		}
	}
	return changed
}

// markChanged marks s changed in the poll being applied, once.
func markChanged(changed []*seriesTrack, s *seriesTrack) []*seriesTrack {
	if s.changed {
		return changed
	}
	s.changed = true
	return append(changed, s)
}

// mergeValues returns the values to publish for a bucket whose published
// values are prev and that now reads next: next's values, except that a
// metric next has no value for keeps prev's, and a count lower than prev's
// keeps prev's (counted in decreases). merged is nil when it equals prev.
// remapMetrics keeps prev as long as next.
func mergeValues(prev, next []float64, isCount []bool) (merged []float64, decreases int) {
	for i, v := range next {
		p := valueAt(prev, i)
		switch {
		case math.IsNaN(v):
			v = p
		case isCount[i] && v < p: // false when p is NaN
			decreases++
			v = p
		}
		if merged == nil && v != p && !(math.IsNaN(v) && math.IsNaN(p)) {
			merged = make([]float64, len(next))
			for j := range i {
				merged[j] = valueAt(prev, j)
			}
		}
		if merged != nil {
			merged[i] = v
		}
	}
	return merged, decreases
}

// valueAt returns vals[i], or NaN (no value) beyond its end.
func valueAt(vals []float64, i int) float64 {
	if i < len(vals) {
		return vals[i]
	}
	return math.NaN()
}

// countsComplete reports whether vals has a value (not NaN) for every
// count, and for at least one metric.
func countsComplete(vals []float64, isCount []bool) bool {
	some := false
	for i, v := range vals {
		if math.IsNaN(v) {
			if isCount[i] {
				return false
			}
			continue
		}
		some = true
	}
	return some
}

// commit advances the HighWaterMark of every environment of a successful
// poll to the time to (never backwards), forgets buckets that can no longer be
// re-fetched, and forgets series whose newest bucket is more than ttl older
// than the dataset's newest.
func (t *Tracker) commit(dataset string, envs []string, to time.Time, settle, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.dataset(dataset)
	for _, e := range envs {
		if t.served != nil && !t.served[e] {
			continue
		}
		if h, ok := d.hwm[e]; !ok || to.After(h) {
			d.hwm[e] = to
		}
		delete(d.resume, e)
	}
	live := int64(math.MinInt64)
	if d.newest > math.MinInt64+int64(ttl) {
		live = d.newest - int64(ttl)
	}
	for key, s := range d.series {
		if s.newest < live {
			delete(d.series, key)
			continue
		}
		h, ok := d.hwm[s.env]
		if !ok {
			continue
		}
		cut := h.Add(-settle).UnixNano()
		n := 0
		for n < len(s.buckets) && s.buckets[n].t < cut {
			n++
		}
		if n > 0 {
			s.buckets = slices.Delete(s.buckets, 0, n)
		}
	}
}

// Retain forgets every environment not in envs: its HighWaterMarks, resume
// points and series. An environment that comes back starts afresh and is
// counted in full.
func (t *Tracker) Retain(envs []string) {
	keep := make(map[string]bool, len(envs))
	for _, e := range envs {
		keep[e] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.start == Restart && t.served != nil {
		if t.later == nil {
			t.later = make(map[string]bool)
		}
		for e := range keep {
			if !t.served[e] {
				t.later[e] = true
			}
		}
		for e := range t.later {
			if !keep[e] {
				delete(t.later, e)
			}
		}
	}
	t.served = keep
	for _, d := range t.datasets {
		for e := range d.hwm {
			if !keep[e] {
				delete(d.hwm, e)
			}
		}
		for e := range d.resume {
			if !keep[e] {
				delete(d.resume, e)
			}
		}
		for e := range d.asked {
			if !keep[e] {
				delete(d.asked, e)
			}
		}
		for k, s := range d.series {
			if !keep[s.env] {
				delete(d.series, k)
			}
		}
	}
}

// remapMetrics reorders the stored values and totals to a new metric list;
// metrics not known before read NaN in buckets (so a sink sees them as not
// published) and start at 0 in the totals of a count.
func (d *datasetTrack) remapMetrics(metrics []string) {
	old := d.metrics
	d.metrics = slices.Clone(metrics)
	pos := make([]int, len(metrics))
	isCount := make([]bool, len(metrics))
	for i, m := range metrics {
		pos[i] = slices.Index(old, m)
		isCount[i] = metricsapi.Classify(m).Kind == metricsapi.KindCount
	}
	remap := func(vals []float64, absent func(j int) float64) []float64 {
		if vals == nil {
			return nil
		}
		nv := make([]float64, len(metrics))
		for j, p := range pos {
			if p >= 0 && p < len(vals) {
				nv[j] = vals[p]
			} else {
				nv[j] = absent(j)
			}
		}
		return nv
	}
	noValue := func(int) float64 { return math.NaN() }
	zeroCount := func(j int) float64 {
		if isCount[j] {
			return 0
		}
		return math.NaN()
	}
	for _, s := range d.series {
		for i := range s.buckets {
			s.buckets[i].values = remap(s.buckets[i].values, noValue)
		}
		s.totals = remap(s.totals, zeroCount)
		s.pointTotals = remap(s.pointTotals, zeroCount)
	}
}
