// Package prometheus is the Prometheus sink: a prometheus.Collector that
// holds the newest state of every series of every dataset and builds const
// metrics from it at scrape time (node_exporter style), plus the exporter's
// own edgepipe_* self-metrics.
//
// Names follow DESIGN.md: cdn_<dataset>_<metric> with labels environment_id
// and the dataset's dimensions. API counts are counters (the sum of every
// bucket value seen since start; a revision adds its difference), everything
// else is a gauge of the newest bucket; percentiles become
// cdn_<dataset>_<stem>_seconds{percentile="P"} and bits become bytes.
//
// State is compact: per label set one slice of interned label values shared
// by all of its metrics and one []float64 of values, kept in a slice indexed
// through one map entry per label set (not per metric series).
package prometheus

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"
	"unique"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
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
}

// Collector is the Prometheus sink. It implements schedule.Publisher,
// schedule.EnvironmentWatcher and prometheus.Collector; register it on a
// registry and hand it to the scheduler. It is safe for concurrent use.
type Collector struct {
	opts Options

	mu       sync.RWMutex
	datasets map[string]*datasetState
	envs     map[string]bool // nil until SetEnvironments

	ignoredDecreases *prometheus.Desc
}

// datasetState is the state of one dataset's series.
type datasetState struct {
	mu         sync.RWMutex
	name       string
	resultLbls []string // the label dimensions, in Row.Labels order
	plans      []*metricPlan
	byName     map[string]int
	index      map[string]int32 // series key → position in series
	series     []seriesState
	free       []int32
	newest     int64 // newest bucket start seen, Unix seconds
	swept      int64 // newest at the last staleness sweep
	decreases  float64
	idxScratch []int
	keyScratch []byte
}

// seriesState is one label set. labels is nil for a free slot.
type seriesState struct {
	labels []string  // environment_id, then the dimensions; interned
	vals   []float64 // per plan; NaN until a value arrived
	newest int64     // newest bucket start seen, Unix seconds
}

// NewCollector returns an empty Collector.
func NewCollector(opts Options) *Collector {
	if opts.SeriesTTL <= 0 {
		opts.SeriesTTL = DefaultSeriesTTL
	}
	if opts.GaugeMaxAge <= 0 {
		opts.GaugeMaxAge = DefaultGaugeMaxAge
	}
	return &Collector{
		opts:     opts,
		datasets: make(map[string]*datasetState),
		ignoredDecreases: prometheus.NewDesc("edgepipe_count_decreases_ignored_total",
			"Revisions that lowered an API count; a counter cannot go down, so the decrease was not applied.",
			[]string{"dataset"}, nil),
	}
}

// Describe sends nothing: the metrics follow the dataset descriptors, which
// are only known at run time, so the collector is unchecked.
func (c *Collector) Describe(chan<- *prometheus.Desc) {}

// Collect sends the current value of every series.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.RLock()
	dss := make([]*datasetState, 0, len(c.datasets))
	for _, d := range c.datasets {
		dss = append(dss, d)
	}
	c.mu.RUnlock()
	gaugeAge := int64(c.opts.GaugeMaxAge / time.Second)
	for _, d := range dss {
		d.mu.RLock()
		gaugeFloor := d.newest - gaugeAge
		for i := range d.series {
			s := &d.series[i]
			if s.labels == nil {
				continue
			}
			gauges := s.newest >= gaugeFloor
			for j, p := range d.plans {
				if j >= len(s.vals) {
					break
				}
				v := s.vals[j]
				if math.IsNaN(v) {
					continue
				}
				if p.kind == kindCounter {
					ch <- prometheus.MustNewConstMetric(p.desc, prometheus.CounterValue, v, s.labels...)
				} else if gauges {
					ch <- prometheus.MustNewConstMetric(p.desc, prometheus.GaugeValue, v*p.scale, s.labels...)
				}
			}
		}
		if d.decreases > 0 {
			ch <- prometheus.MustNewConstMetric(c.ignoredDecreases, prometheus.CounterValue, d.decreases, d.name)
		}
		d.mu.RUnlock()
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
		d.removeWhere(func(s *seriesState) bool { return !keep[s.labels[0]] })
		d.mu.Unlock()
	}
}

// Publish folds a batch into the state: counters add new buckets and the
// positive difference of revisions, gauges take the newest bucket's value.
// It never fails and never blocks on I/O.
func (c *Collector) Publish(_ context.Context, b *schedule.Batch) error {
	if len(b.Updates) == 0 {
		return nil
	}
	c.mu.Lock()
	d := c.datasets[b.Dataset.Name]
	if d == nil {
		d = &datasetState{name: b.Dataset.Name, byName: make(map[string]int), index: make(map[string]int32)}
		c.datasets[b.Dataset.Name] = d
	}
	envs := c.envs
	c.mu.Unlock()

	d.mu.Lock()
	defer d.mu.Unlock()
	d.prepare(b)
	idx := d.idxScratch
	for ui := range b.Updates {
		u := &b.Updates[ui]
		row := &u.Row
		if envs != nil && !envs[row.Environment] {
			continue
		}
		s := d.lookup(row)
		bt := row.Time.Unix()
		newest := bt >= s.newest
		if newest {
			s.newest = bt
		}
		if bt > d.newest {
			d.newest = bt
		}
		for k, j := range idx {
			if j < 0 || k >= len(row.Values) {
				continue
			}
			v := row.Values[k]
			if math.IsNaN(v) {
				continue
			}
			p := d.plans[j]
			if p.kind == kindCounter {
				delta := v
				if u.Previous != nil && k < len(u.Previous) && !math.IsNaN(u.Previous[k]) {
					delta -= u.Previous[k]
				}
				if delta < 0 {
					d.decreases++
					continue
				}
				if math.IsNaN(s.vals[j]) {
					s.vals[j] = 0
				}
				s.vals[j] += delta
			} else if newest {
				s.vals[j] = v
			}
		}
	}
	d.sweep(int64(c.opts.SeriesTTL / time.Second))
	return nil
}

// prepare maps the batch's metrics onto plans (creating plans for metrics
// not seen before) and resets the state if the label dimensions changed.
func (d *datasetState) prepare(b *schedule.Batch) {
	if !slices.Equal(d.resultLbls, b.Labels) {
		d.resultLbls = slices.Clone(b.Labels)
		d.plans = nil
		clear(d.byName)
		clear(d.index)
		d.series = nil
		d.free = nil
	}
	names := labelNames(b.Labels)
	d.idxScratch = d.idxScratch[:0]
	for _, m := range b.Metrics {
		j, ok := d.byName[m]
		if !ok {
			j = len(d.plans)
			d.plans = append(d.plans, plan(b.Dataset, m, names))
			d.byName[m] = j
		}
		d.idxScratch = append(d.idxScratch, j)
	}
}

// lookup returns the series of row's label set, creating it.
func (d *datasetState) lookup(row *metricsapi.Row) *seriesState {
	key := d.keyScratch[:0]
	key = append(key, row.Environment...)
	for _, l := range row.Labels {
		key = append(key, 0xff)
		key = append(key, l...)
	}
	d.keyScratch = key
	if i, ok := d.index[string(key)]; ok {
		s := &d.series[i]
		if len(s.vals) < len(d.plans) {
			s.vals = growNaN(s.vals, len(d.plans))
		}
		return s
	}
	labels := make([]string, 0, len(row.Labels)+1)
	labels = append(labels, unique.Make(row.Environment).Value())
	for _, l := range row.Labels {
		labels = append(labels, unique.Make(l).Value())
	}
	var i int32
	if n := len(d.free); n > 0 {
		i = d.free[n-1]
		d.free = d.free[:n-1]
	} else {
		d.series = append(d.series, seriesState{})
		i = int32(len(d.series) - 1)
	}
	d.series[i] = seriesState{labels: labels, vals: growNaN(nil, len(d.plans)), newest: math.MinInt64}
	d.index[string(key)] = i
	return &d.series[i]
}

// sweep drops label sets whose newest bucket is more than ttl seconds
// older than the dataset's newest, at most once per advance of the newest
// bucket.
func (d *datasetState) sweep(ttl int64) {
	if d.newest == d.swept {
		return
	}
	d.swept = d.newest
	floor := d.newest - ttl
	d.removeWhere(func(s *seriesState) bool { return s.newest < floor })
}

// removeWhere frees every live series for which drop is true.
func (d *datasetState) removeWhere(drop func(*seriesState) bool) {
	var key []byte
	for i := range d.series {
		s := &d.series[i]
		if s.labels == nil || !drop(s) {
			continue
		}
		key = key[:0]
		for k, l := range s.labels {
			if k > 0 {
				key = append(key, 0xff)
			}
			key = append(key, l...)
		}
		delete(d.index, string(key))
		*s = seriesState{}
		d.free = append(d.free, int32(i))
	}
}

// growNaN returns v extended to n entries with NaN, allocating exactly n.
func growNaN(v []float64, n int) []float64 {
	if len(v) >= n {
		return v
	}
	out := make([]float64, n)
	copy(out, v)
	for i := len(v); i < n; i++ {
		out[i] = math.NaN()
	}
	return out
}

// Series returns the number of label sets held, for tests and sizing.
func (c *Collector) Series() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := 0
	for _, d := range c.datasets {
		d.mu.RLock()
		n += len(d.index)
		d.mu.RUnlock()
	}
	return n
}
