// Package prometheus is the Prometheus sink: a Collector that holds the
// newest state of every series of every dataset and writes it in the text
// exposition format at scrape time (Handler serves it after the registry's
// metrics), plus the exporter's own edgepipe_* self-metrics. Writing the
// series straight from the state, instead of through const metrics and
// protobuf objects, keeps a scrape of a million series fast and its memory
// small.
//
// Names follow DESIGN.md: cdn_<dataset>_<metric> (the prefix is
// Options.Prefix) with labels environment_id and the dataset's dimensions
// (those it is exported with). API counts are counters (the scheduler's
// running totals: the sum of every bucket value counted since the series
// started; a revision adds its difference), everything else is a gauge of
// the newest bucket; percentiles become
// cdn_<dataset>_<stem>_seconds{percentile="P"} and bits become bytes.
//
// The collector holds at most Options.MaxSeries series (see seriesBudget in
// budget.go) and exposes edgepipe_series{dataset},
// edgepipe_series_limit_dropped_total{dataset} and edgepipe_series_limit.
//
// State is compact: per label set its interned label values (shared by all of
// its metrics) and one value per metric, in flat per-dataset slices, found
// through one pointer-free map entry per label set (not per metric series).
package prometheus

import (
	"context"
	"hash/maphash"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"
	"unique"

	"github.com/edgepipe/edgepipe/internal/schedule"
)

// Defaults of Options.
const (
	// DefaultSeriesTTL is how long a label set stays after its newest
	// bucket, measured against the dataset's newest bucket: a country or
	// content type that stops appearing disappears a day later.
	DefaultSeriesTTL = 24 * time.Hour
	// DefaultGaugeMaxAge is how old (against the dataset's newest bucket) a
	// label set's newest bucket may be for its gauges to be exposed: a gauge
	// shows the newest bucket, not a value from hours ago. Its counters stay
	// until DefaultSeriesTTL.
	DefaultGaugeMaxAge = 30 * time.Minute
)

// Options configure a Collector; zero values take the defaults.
type Options struct {
	SeriesTTL   time.Duration
	GaugeMaxAge time.Duration
	// Prefix starts every metric name (default DefaultPrefix).
	Prefix string
	// MaxSeries is the series budget (see seriesBudget); 0 means none.
	MaxSeries int
	// Logger receives the budget's warnings (default slog.Default()).
	Logger *slog.Logger
}

// Collector is the Prometheus sink. It implements schedule.Publisher and
// schedule.EnvironmentWatcher; hand it to the scheduler, and serve it with
// Handler (or WriteText). It is safe for concurrent use.
type Collector struct {
	opts   Options
	budget *seriesBudget
	// textBufs keeps WriteText's buffers between scrapes.
	textBufs sync.Pool

	mu       sync.RWMutex
	datasets map[string]*datasetState
	envs     map[string]bool // nil until SetEnvironments
}

// datasetState is the state of one dataset's series, laid out flat so the
// garbage collector has little to scan and a label set costs no allocation
// of its own: series i owns labels[i*k:(i+1)*k] (k = 1 + label dimensions),
// vals[i*p:(i+1)*p] (p = len(plans)) and newest[i]. A free slot has an
// empty environment label.
type datasetState struct {
	mu         sync.RWMutex
	name       string
	budget     *seriesBudget
	resultLbls []string // the label dimensions, in Row.Labels order
	plans      []*metricPlan
	byName     map[string]int
	k          int // labels per series
	labels     []string
	vals       []float64
	newest     []int64 // newest bucket start seen per series, Unix seconds
	free       []int32
	live       int
	// index finds a series by the hash of its labels; collide holds the
	// rare series whose hash another series already took.
	seed    maphash.Seed
	index   map[uint64]int32
	collide map[string]int32

	dsNewest   int64 // newest bucket start seen in the dataset, Unix seconds
	swept      int64 // dsNewest at the last staleness sweep
	idxScratch []int
	keyScratch []byte

	// dropped counts the series the budget refused; unlogged those not
	// logged yet, lastWarn when they last were.
	dropped  float64
	unlogged int
	lastWarn time.Time
}

// NewCollector returns an empty Collector.
func NewCollector(opts Options) *Collector {
	if opts.SeriesTTL <= 0 {
		opts.SeriesTTL = DefaultSeriesTTL
	}
	if opts.GaugeMaxAge <= 0 {
		opts.GaugeMaxAge = DefaultGaugeMaxAge
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Collector{
		opts:     opts,
		budget:   newSeriesBudget(opts.MaxSeries, opts.Logger),
		datasets: make(map[string]*datasetState),
	}
}

// SetEnvironments drops the series of every environment not in ids.
func (c *Collector) SetEnvironments(ids []string) {
	keep := make(map[string]bool, len(ids))
	for _, id := range ids {
		keep[id] = true
	}
	c.mu.Lock()
	c.envs = keep
	dss := make([]*datasetState, 0, len(c.datasets))
	for _, d := range c.datasets {
		dss = append(dss, d)
	}
	c.mu.Unlock()
	for _, d := range dss {
		d.mu.Lock()
		d.removeWhere(func(i int) bool { return !keep[d.labels[i*d.k]] })
		d.mu.Unlock()
	}
}

// Publish folds a batch into the state: gauges take the values of the
// newest bucket of their label set, counters the series' totals
// (schedule.SeriesCounts: the sum of every bucket counted since the series
// started, restored after a restart with a state directory). Setting
// totals rather than adding differences makes a batch published twice, or
// a replay after a restart, change nothing. A NaN value (the bucket has no
// value for that metric) changes nothing. It never fails and never blocks
// on I/O.
func (c *Collector) Publish(_ context.Context, b *schedule.Batch) error {
	if len(b.Updates) == 0 && len(b.Counts) == 0 {
		return nil
	}
	c.mu.Lock()
	d := c.datasets[b.Dataset.Name]
	if d == nil {
		d = &datasetState{name: b.Dataset.Name, budget: c.budget, byName: make(map[string]int)}
		c.datasets[b.Dataset.Name] = d
	}
	envs := c.envs
	c.mu.Unlock()

	d.mu.Lock()
	defer d.mu.Unlock()
	d.prepare(b, c.opts.Prefix)
	idx := d.idxScratch
	p := len(d.plans)
	var refused map[string]struct{} // label sets the budget refused
	for ui := range b.Updates {
		row := &b.Updates[ui].Row
		if envs != nil && !envs[row.Environment] {
			continue
		}
		i := d.lookup(row.Environment, row.Labels)
		if i < 0 {
			refused = d.refuse(refused)
			continue
		}
		bt := row.Time.Unix()
		if bt < d.newest[i] {
			continue // an older bucket: its gauges are not the newest
		}
		d.newest[i] = bt
		d.dsNewest = max(d.dsNewest, bt)
		vals := d.vals[i*p : (i+1)*p]
		for k, j := range idx {
			if j < 0 || k >= len(row.Values) || d.plans[j].kind == kindCounter {
				continue
			}
			if v := row.Values[k]; !math.IsNaN(v) {
				vals[j] = v
			}
		}
	}
	for ci := range b.Counts {
		sc := &b.Counts[ci]
		if envs != nil && !envs[sc.Environment] {
			continue
		}
		i := d.lookup(sc.Environment, sc.Labels)
		if i < 0 {
			refused = d.refuse(refused)
			continue
		}
		if nt := sc.Newest.Unix(); nt > d.newest[i] {
			d.newest[i] = nt
			d.dsNewest = max(d.dsNewest, nt)
		}
		vals := d.vals[i*p : (i+1)*p]
		for k, j := range idx {
			if j < 0 || k >= len(sc.Totals) || d.plans[j].kind != kindCounter {
				continue
			}
			if v := sc.Totals[k]; !math.IsNaN(v) {
				vals[j] = v
			}
		}
	}
	d.sweep(int64(c.opts.SeriesTTL / time.Second))
	if len(refused) > 0 {
		c.budget.refused(d, len(refused)*p, time.Now())
	}
	return nil
}

// refuse adds the label set lookup just refused (its key is in keyScratch)
// to set, so that a label set with both rows and totals in a batch counts
// once.
func (d *datasetState) refuse(set map[string]struct{}) map[string]struct{} {
	if set == nil {
		set = make(map[string]struct{})
	}
	set[string(d.keyScratch)] = struct{}{}
	return set
}

// prepare maps the batch's metrics onto plans (creating plans for metrics
// not seen before, which widens every series' values) and resets the state
// if the label dimensions changed.
func (d *datasetState) prepare(b *schedule.Batch, prefix string) {
	if d.index == nil || !slices.Equal(d.resultLbls, b.Labels) {
		d.budget.adjust(d.name, -d.live*len(d.plans))
		d.resultLbls = slices.Clone(b.Labels)
		d.k = 1 + len(b.Labels)
		d.plans = nil
		clear(d.byName)
		d.seed = maphash.MakeSeed()
		d.index = make(map[uint64]int32)
		d.collide = nil
		d.labels, d.vals, d.newest, d.free, d.live = nil, nil, nil, nil, 0
	}
	oldP := len(d.plans)
	d.idxScratch = d.idxScratch[:0]
	for _, m := range b.Metrics {
		j, ok := d.byName[m]
		if !ok {
			j = len(d.plans)
			d.plans = append(d.plans, plan(prefix, b.Dataset, m))
			d.byName[m] = j
		}
		d.idxScratch = append(d.idxScratch, j)
	}
	d.budget.adjust(d.name, d.live*(len(d.plans)-oldP))
	if p := len(d.plans); p != oldP && len(d.newest) > 0 {
		vals := make([]float64, len(d.newest)*p, cap(d.newest)*p)
		for i := range d.newest {
			copy(vals[i*p:], d.vals[i*oldP:(i+1)*oldP])
			for j := oldP; j < p; j++ {
				vals[i*p+j] = math.NaN()
			}
		}
		d.vals = vals
	}
}

// hashLabels hashes a label set and leaves its key in keyScratch.
func (d *datasetState) hashLabels(env string, labels []string) uint64 {
	key := append(d.keyScratch[:0], env...)
	for _, l := range labels {
		key = append(key, 0xff)
		key = append(key, l...)
	}
	d.keyScratch = key
	return maphash.Bytes(d.seed, key)
}

// keyOf returns the key of series i (as hashLabels builds it).
func (d *datasetState) keyOf(i int) []byte {
	key := d.keyScratch[:0]
	for j, l := range d.labels[i*d.k : (i+1)*d.k] {
		if j > 0 {
			key = append(key, 0xff)
		}
		key = append(key, l...)
	}
	d.keyScratch = key
	return key
}

// sameLabels reports whether series i has the label set (env, labels).
func (d *datasetState) sameLabels(i int, env string, labels []string) bool {
	lbls := d.labels[i*d.k : (i+1)*d.k]
	if lbls[0] != env || len(labels) != d.k-1 {
		return false
	}
	for j, l := range labels {
		if lbls[j+1] != l {
			return false
		}
	}
	return true
}

// lookup returns the series index of the label set (env, labels),
// creating it if the budget has room, else -1 (its key is left in
// keyScratch).
func (d *datasetState) lookup(env string, labels []string) int {
	h := d.hashLabels(env, labels)
	i, taken := d.index[h]
	if taken && d.sameLabels(int(i), env, labels) {
		return int(i)
	}
	if d.collide != nil {
		if j, ok := d.collide[string(d.keyScratch)]; ok {
			return int(j)
		}
	}
	p := len(d.plans)
	if !d.budget.reserve(d.name, p) {
		return -1
	}
	var n int
	if f := len(d.free); f > 0 {
		n = int(d.free[f-1])
		d.free = d.free[:f-1]
	} else {
		n = len(d.newest)
		d.newest = append(d.newest, 0)
		d.labels = append(d.labels, make([]string, d.k)...)
		d.vals = append(d.vals, make([]float64, p)...)
	}
	lbls := d.labels[n*d.k : (n+1)*d.k]
	lbls[0] = unique.Make(env).Value()
	for j, l := range labels {
		if j+1 < d.k {
			lbls[j+1] = unique.Make(l).Value()
		}
	}
	for j := range p {
		d.vals[n*p+j] = math.NaN()
	}
	d.newest[n] = math.MinInt64
	if taken {
		if d.collide == nil {
			d.collide = make(map[string]int32)
		}
		d.collide[string(d.keyScratch)] = int32(n)
	} else {
		d.index[h] = int32(n)
	}
	d.live++
	return n
}

// sweep drops label sets whose newest bucket is more than ttl seconds
// older than the dataset's newest, at most once per advance of the newest
// bucket.
func (d *datasetState) sweep(ttl int64) {
	if d.dsNewest == d.swept {
		return
	}
	d.swept = d.dsNewest
	floor := d.dsNewest - ttl
	d.removeWhere(func(i int) bool { return d.newest[i] < floor })
}

// removeWhere frees every live series i for which drop(i) is true, and
// their share of the budget.
func (d *datasetState) removeWhere(drop func(i int) bool) {
	before := d.live
	defer func() { d.budget.adjust(d.name, (d.live-before)*len(d.plans)) }()
	for i := range d.newest {
		if d.labels[i*d.k] == "" || !drop(i) {
			continue
		}
		key := d.keyOf(i)
		h := maphash.Bytes(d.seed, key)
		if j, ok := d.index[h]; ok && int(j) == i {
			delete(d.index, h)
		} else {
			delete(d.collide, string(key))
		}
		clear(d.labels[i*d.k : (i+1)*d.k])
		d.free = append(d.free, int32(i))
		d.live--
	}
}

// Series returns the number of label sets held, for tests and sizing.
func (c *Collector) Series() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := 0
	for _, d := range c.datasets {
		d.mu.RLock()
		n += d.live
		d.mu.RUnlock()
	}
	return n
}
