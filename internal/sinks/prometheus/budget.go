package prometheus

import (
	"log/slog"
	"maps"
	"sync"
	"time"
)

// DefaultMaxSeries is the default series budget (--prometheus.max-series):
// what one scrape serves well within Prometheus's default 10 s timeout.
// WriteText takes about 130 ns per series (make bench-scrape), 0.15 s for
// 300,000 on a 2-core machine, and a real Prometheus scraped them in at
// most 0.92 s there (make bench-scale); ingesting them is Prometheus's
// larger cost.
const DefaultMaxSeries = 300_000

// budgetLogInterval is how often a dataset whose label sets are refused is
// logged again while the refusals go on.
const budgetLogInterval = 10 * time.Minute

// seriesBudget bounds the series the collector holds, across datasets. A
// series is one metric of one label set; a label set of a dataset costs as
// many series as the dataset exports metrics, reserved when the label set is
// first published, whether or not every metric has a value yet. So the
// exposition never holds more cdn series than the budget, except after a
// descriptor adds metrics to label sets already held (they are not dropped
// for it; new label sets wait until the total is below the budget again).
//
// When the budget is reached, new label sets are refused and counted;
// label sets already held keep updating, so no counter goes backwards or
// disappears because of the budget. A refused label set is admitted at a
// later publish once there is room (series dropped by --prometheus.series-ttl
// or by environments that go away make room); its counters then show the
// scheduler's totals of the series, as if it had been held all along.
type seriesBudget struct {
	max int64 // 0: no budget
	log *slog.Logger

	mu   sync.Mutex
	held map[string]int64 // series held per dataset
	sum  int64

	seriesHelp, droppedHelp, limitHelp string
}

func newSeriesBudget(limit int, log *slog.Logger) *seriesBudget {
	return &seriesBudget{
		max:         int64(limit),
		log:         log,
		held:        make(map[string]int64),
		seriesHelp:  "Series of a dataset held for /metrics (label sets × the metrics the dataset exports), counted against --prometheus.max-series.",
		droppedHelp: "Series of new label sets of a dataset not exposed because --prometheus.max-series was reached; a label set still refused at a later publish counts again.",
		limitHelp:   "The series budget, --prometheus.max-series (absent when unlimited).",
	}
}

// reserve takes n series for a new label set of dataset, or reports false
// when that would exceed the budget.
func (b *seriesBudget) reserve(dataset string, n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.max > 0 && b.sum+int64(n) > b.max {
		return false
	}
	b.held[dataset] += int64(n)
	b.sum += int64(n)
	return true
}

// adjust changes what dataset holds by n (negative: releases) without
// checking the budget.
func (b *seriesBudget) adjust(dataset string, n int) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held[dataset] += int64(n)
	b.sum += int64(n)
}

// refused records that a publish of dataset refused series; it logs at most
// once per budgetLogInterval per dataset, with what was refused since the
// last log and where the series go.
func (b *seriesBudget) refused(d *datasetState, series int, now time.Time) {
	d.dropped += float64(series)
	d.unlogged += series
	if !d.lastWarn.IsZero() && now.Sub(d.lastWarn) < budgetLogInterval {
		return
	}
	b.mu.Lock()
	byDataset := maps.Clone(b.held)
	sum := b.sum
	b.mu.Unlock()
	b.log.Warn("series budget reached: new label sets of this dataset are not exposed (existing ones keep updating); "+
		"raise --prometheus.max-series, shard, or keep fewer dimensions, metrics or percentiles (--config.file)",
		"dataset", d.name, "refused_series", d.unlogged, "series", sum, "max_series", b.max, "series_by_dataset", byDataset)
	d.lastWarn = now
	d.unlogged = 0
}

// appendText appends the budget's metrics for the datasets given (whose
// locks the caller does not hold) in the text format.
func (b *seriesBudget) appendText(buf []byte, dss []*datasetState) []byte {
	if len(dss) > 0 {
		buf = appendHeader(buf, "edgepipe_series", b.seriesHelp, false)
		for _, d := range dss {
			d.mu.RLock()
			n := d.live * len(d.plans)
			d.mu.RUnlock()
			buf = appendSample(buf, "edgepipe_series", d.name, float64(n))
		}
		buf = appendHeader(buf, "edgepipe_series_limit_dropped_total", b.droppedHelp, true)
		for _, d := range dss {
			d.mu.RLock()
			dropped := d.dropped
			d.mu.RUnlock()
			buf = appendSample(buf, "edgepipe_series_limit_dropped_total", d.name, dropped)
		}
	}
	if b.max > 0 {
		buf = appendHeader(buf, "edgepipe_series_limit", b.limitHelp, false)
		buf = append(buf, "edgepipe_series_limit "...)
		buf = appendFloat(buf, float64(b.max))
		buf = append(buf, '\n')
	}
	return buf
}

// appendSample appends one sample of name with label dataset.
func appendSample(buf []byte, name, dataset string, v float64) []byte {
	buf = append(buf, name...)
	buf = append(buf, `{dataset="`...)
	buf = appendLabelValue(buf, dataset)
	buf = append(buf, `"} `...)
	buf = appendFloat(buf, v)
	return append(buf, '\n')
}
