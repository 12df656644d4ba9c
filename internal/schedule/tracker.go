package schedule

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// Tracker is the scheduler's memory that outlives any one poll loop, so a
// restarted loop neither skips nor double-counts a bucket. Per dataset and
// environment it keeps the HighWaterMark (the end of the newest bucket range
// fetched successfully); per series and bucket inside the settle window it
// keeps the values last published, to tell first sightings, revisions and
// unchanged re-polls apart. It is safe for concurrent use.
type Tracker struct {
	mu       sync.Mutex
	datasets map[string]*datasetTrack
	// served is the environment set of the last Retain (nil before):
	// results of other environments are neither applied nor committed.
	served map[string]bool
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
}

type seriesTrack struct {
	env     string
	buckets []bucketValues // ascending by t
}

type bucketValues struct {
	t      int64 // bucket start, Unix nanoseconds
	values []float64
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker {
	return &Tracker{datasets: make(map[string]*datasetTrack)}
}

func (t *Tracker) dataset(name string) *datasetTrack {
	d := t.datasets[name]
	if d == nil {
		d = &datasetTrack{
			hwm:    make(map[string]time.Time),
			resume: make(map[string]time.Time),
			asked:  make(map[string]bool),
			series: make(map[string]*seriesTrack),
		}
		t.datasets[name] = d
	}
	return d
}

// HighWaterMark returns the end of the newest bucket range of dataset
// fetched successfully for env, and false when none was.
func (t *Tracker) HighWaterMark(dataset, env string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.datasets[dataset]
	if d == nil {
		return time.Time{}, false
	}
	h, ok := d.hwm[env]
	return h, ok
}

// Buckets returns how many (series, bucket) entries the tracker holds for
// dataset: the memory the settle window costs.
func (t *Tracker) Buckets(dataset string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.datasets[dataset]
	if d == nil {
		return 0
	}
	n := 0
	for _, s := range d.series {
		n += len(s.buckets)
	}
	return n
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

// pollResult is what apply made of a query result.
type pollResult struct {
	updates   []Update
	rows      int
	newOnes   int
	revisions int
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
// returns the updates to publish. Rows of an environment not in floors, or
// before their environment's floor, are ignored; rows at or after end are
// counted as deferred and left for a later poll (the HighWaterMark never
// passes end, so a later poll fetches them again). apply records the new
// values; commit then advances the HighWaterMarks.
//
// What is published for a bucket only ever moves forward: a metric the row
// has no value for (NaN) keeps the value published before, and a count
// lower than the one published before is not applied (and counted), so
// every sink sees the same, never-decreasing counts. A bucket is first
// published once it has a value for every count (it is held, and counted,
// until then); a ratio, rate or percentile may still lack one (NaN: an
// undefined ratio of a bucket without traffic), which sinks leave out.
// Every update therefore carries a value for every count.
func (t *Tracker) apply(dataset string, res *metricsapi.Result, floors map[string]time.Time, end time.Time) pollResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.dataset(dataset)
	if !slices.Equal(d.labels, res.Labels) {
		// Series keys depend on the label order: start over (a descriptor
		// change; only the settle window's memory is lost).
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
		key := row.SeriesKey()
		s := d.series[key]
		idx, found := 0, false
		if s != nil {
			idx, found = slices.BinarySearchFunc(s.buckets, bt, func(b bucketValues, t int64) int {
				switch {
				case b.t < t:
					return -1
				case b.t > t:
					return 1
				}
				return 0
			})
		}
		if !found && !countsComplete(row.Values, isCount) {
			pr.held++
			continue
		}
		pr.rows++
		if row.Time.After(pr.newest) {
			pr.newest = row.Time
		}
		if s == nil {
			s = &seriesTrack{env: row.Environment}
			d.series[key] = s
		}
		if !found {
			s.buckets = slices.Insert(s.buckets, idx, bucketValues{t: bt, values: row.Values})
			pr.updates = append(pr.updates, Update{Row: *row})
			pr.newOnes++
			continue
		}
		prev := s.buckets[idx].values
		merged, decreases := mergeValues(prev, row.Values, isCount)
		pr.decreases += decreases
		if merged == nil {
			continue
		}
		s.buckets[idx].values = merged
		u := Update{Row: *row, Previous: prev}
		u.Row.Values = merged
		pr.updates = append(pr.updates, u)
		pr.revisions++
	}
	return pr
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
// poll to to (never backwards) and forgets buckets that can no longer be
// re-fetched.
func (t *Tracker) commit(dataset string, envs []string, to time.Time, settle time.Duration) {
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
	for key, s := range d.series {
		h, ok := d.hwm[s.env]
		if !ok {
			continue
		}
		cut := h.Add(-settle).UnixNano()
		n := 0
		for n < len(s.buckets) && s.buckets[n].t < cut {
			n++
		}
		if n == len(s.buckets) {
			delete(d.series, key)
			continue
		}
		if n > 0 {
			s.buckets = slices.Delete(s.buckets, 0, n)
		}
	}
}

// Retain forgets every environment not in envs: its HighWaterMarks, resume
// points and buckets. An environment that comes back starts afresh.
func (t *Tracker) Retain(envs []string) {
	keep := make(map[string]bool, len(envs))
	for _, e := range envs {
		keep[e] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
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

// remapMetrics reorders the stored values to a new metric list; metrics
// not known before read NaN (so a sink sees them as not published).
func (d *datasetTrack) remapMetrics(metrics []string) {
	old := d.metrics
	d.metrics = slices.Clone(metrics)
	if len(old) == 0 {
		return
	}
	pos := make([]int, len(metrics))
	for i, m := range metrics {
		pos[i] = slices.Index(old, m)
	}
	for _, s := range d.series {
		for i := range s.buckets {
			nv := make([]float64, len(metrics))
			for j, p := range pos {
				if p >= 0 && p < len(s.buckets[i].values) {
					nv[j] = s.buckets[i].values[p]
				} else {
					nv[j] = math.NaN()
				}
			}
			s.buckets[i].values = nv
		}
	}
}
