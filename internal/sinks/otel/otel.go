// Package otel is the OpenTelemetry sink: it turns the scheduler's batches
// into OTLP points carrying the buckets' real times and pushes them with the
// OTLP exporters (gRPC or HTTP/protobuf).
//
// The SDK's instruments stamp points with the time of collection, so the sink
// builds metricdata.ResourceMetrics itself and calls the exporter's Export
// directly. Names follow the OpenTelemetry conventions (MetricName):
// <prefix>.<dataset>.<metric> (Options.Prefix, default cdn) without _total,
// units in the unit field only, one metric per percentile stem with a
// percentile attribute; attributes environment_id plus the dataset's
// dimensions (those it is exported with).
//
// Counts are monotonic Sums, one point per series each time a poll's end
// passes a bucket boundary (schedule.SeriesCounts.Point), at that end:
// cumulative (the default; start fixed for the series' life, value the
// running total) or delta (start = the series' previous point, value the
// change since; never overlapping). A revision of an older bucket is folded
// into the next point. Everything else is a Gauge, one point per bucket at
// the bucket's end, sent once (schedule.Update.Latest): a revised ratio or
// percentile is not sent again, so no series ever has two points with one
// timestamp, and each series' points go out in time order, within and
// across export requests.
//
// Export runs off the poll path: Publish converts and enqueues (never
// blocks); one worker exports the requests one by one, in order, with
// exponential backoff. When the bounded queue is full, new points are
// dropped, counted and logged.
package otel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
)

// ScopeName is the instrumentation scope of every exported metric.
const ScopeName = "github.com/edgepipe/edgepipe/internal/sinks/otel"

// Exporter sends metric data; the OTLP exporters (otlpmetricgrpc,
// otlpmetrichttp) implement it.
type Exporter interface {
	Export(ctx context.Context, rm *metricdata.ResourceMetrics) error
	Shutdown(ctx context.Context) error
}

// Defaults of Options.
const (
	DefaultQueueSize       = 256
	DefaultMaxPoints       = 10000
	DefaultExportTimeout   = 30 * time.Second
	DefaultInitialBackoff  = time.Second
	DefaultMaxBackoff      = time.Minute
	DefaultMaxRetryElapsed = time.Hour
)

// Options configure a Sink; zero values take the defaults.
type Options struct {
	// Resource identifies the exporter (see NewResource).
	Resource *resource.Resource
	// QueueSize bounds the exports waiting (each up to MaxPoints points).
	QueueSize int
	// MaxPoints bounds the data points of one export request (default
	// 10000, well under the 4 MiB gRPC message limit of collectors).
	MaxPoints int
	// ExportTimeout bounds one export attempt.
	ExportTimeout time.Duration
	// InitialBackoff and MaxBackoff shape the retry delays; an export
	// still failing after MaxRetryElapsed is dropped and counted.
	InitialBackoff, MaxBackoff, MaxRetryElapsed time.Duration
	// Prefix starts every metric name (default DefaultPrefix).
	Prefix string
	// Temporality of the count sums: metricdata.CumulativeTemporality
	// (the default) or metricdata.DeltaTemporality.
	Temporality metricdata.Temporality
	// Registerer receives the sink's self-metrics (optional).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Sink is the OTLP publisher. Create it with New and stop it with Close.
type Sink struct {
	exp   Exporter
	opts  Options
	log   *slog.Logger
	queue chan *export

	mu     sync.Mutex
	closed bool

	ctx    context.Context // export attempts; canceled when Close gives up
	cancel context.CancelFunc
	done   chan struct{}

	queued   prometheus.Gauge
	dropped  *prometheus.CounterVec
	exported prometheus.Counter
	failures prometheus.Counter
}

type export struct {
	rm     *metricdata.ResourceMetrics
	points int
}

// New starts a Sink exporting with exp.
func New(exp Exporter, opts Options) (*Sink, error) {
	if opts.Resource == nil {
		opts.Resource = resource.Empty()
	}
	if opts.QueueSize <= 0 {
		opts.QueueSize = DefaultQueueSize
	}
	if opts.MaxPoints <= 0 {
		opts.MaxPoints = DefaultMaxPoints
	}
	if opts.ExportTimeout <= 0 {
		opts.ExportTimeout = DefaultExportTimeout
	}
	if opts.InitialBackoff <= 0 {
		opts.InitialBackoff = DefaultInitialBackoff
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = DefaultMaxBackoff
	}
	if opts.MaxRetryElapsed <= 0 {
		opts.MaxRetryElapsed = DefaultMaxRetryElapsed
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	switch opts.Temporality {
	case 0:
		opts.Temporality = metricdata.CumulativeTemporality
	case metricdata.CumulativeTemporality, metricdata.DeltaTemporality:
	default:
		return nil, fmt.Errorf("otlp sink: temporality %v: want cumulative or delta", opts.Temporality)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sink{
		exp: exp, opts: opts, log: opts.Logger,
		queue:  make(chan *export, opts.QueueSize),
		ctx:    ctx,
		cancel: cancel,
		done:   make(chan struct{}),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgepipe_otlp_queue_length", Help: "OTLP export requests waiting to be sent."}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_otlp_dropped_points_total",
			Help: "OTLP data points dropped: reason queue_full (queue overflow) or retries_exhausted."}, []string{"reason"}),
		exported: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgepipe_otlp_exported_points_total", Help: "OTLP data points the collector accepted."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgepipe_otlp_export_failures_total", Help: "Failed OTLP export attempts (each is retried)."}),
	}
	s.dropped.WithLabelValues("queue_full")
	s.dropped.WithLabelValues("retries_exhausted")
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{s.queued, s.dropped, s.exported, s.failures} {
			if err := opts.Registerer.Register(c); err != nil {
				cancel()
				return nil, fmt.Errorf("register otlp self-metrics: %w", err)
			}
		}
	}
	go s.run()
	return s, nil
}

// ErrQueueFull is returned by Publish when points had to be dropped.
var ErrQueueFull = errors.New("otlp export queue full: points dropped")

// Publish converts the batch to OTLP points and queues them for export. It
// never blocks: when the queue is full the points are dropped, counted in
// edgepipe_otlp_dropped_points_total{reason="queue_full"}, and ErrQueueFull
// is returned (the scheduler logs and counts it).
func (s *Sink) Publish(_ context.Context, b *schedule.Batch) error {
	exports := convert(b, s.opts.Prefix, s.opts.Resource, s.opts.MaxPoints, s.opts.Temporality)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("otlp sink closed")
	}
	dropped := 0
	for _, e := range exports {
		select {
		case s.queue <- e:
			s.queued.Inc()
		default:
			dropped += e.points
		}
	}
	if dropped > 0 {
		s.dropped.WithLabelValues("queue_full").Add(float64(dropped))
		s.log.Warn("OTLP export queue full; points dropped (is the collector down?)",
			"dataset", b.Dataset.Name, "points", dropped, "queue_size", s.opts.QueueSize)
		return fmt.Errorf("%w (%d points of %s)", ErrQueueFull, dropped, b.Dataset.Name)
	}
	return nil
}

// run exports queued requests one by one until the queue is closed.
func (s *Sink) run() {
	defer close(s.done)
	for e := range s.queue {
		s.queued.Dec()
		s.send(e)
	}
}

// send exports e, retrying with backoff until it succeeds, MaxRetryElapsed
// passes or the sink is closed for good.
func (s *Sink) send(e *export) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = s.opts.InitialBackoff
	bo.MaxInterval = s.opts.MaxBackoff
	_, err := backoff.Retry(s.ctx, func() (struct{}, error) {
		ctx, cancel := context.WithTimeout(s.ctx, s.opts.ExportTimeout)
		defer cancel()
		err := s.exp.Export(ctx, e.rm)
		if err != nil {
			s.failures.Inc()
			s.log.Warn("OTLP export failed; retrying", "err", err, "points", e.points)
		}
		return struct{}{}, err
	}, backoff.WithBackOff(bo), backoff.WithMaxElapsedTime(s.opts.MaxRetryElapsed), backoff.WithMaxTries(0))
	if err != nil {
		s.dropped.WithLabelValues("retries_exhausted").Add(float64(e.points))
		s.log.Error("OTLP export given up; points dropped", "err", err, "points", e.points)
		return
	}
	s.exported.Add(float64(e.points))
}

// Close stops accepting batches, exports what is queued until ctx is done,
// then shuts the exporter down. Points still queued then are dropped.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.queue)
	}
	s.mu.Unlock()
	select {
	case <-s.done:
	case <-ctx.Done():
		s.cancel()
		<-s.done
	}
	s.cancel()
	if err := s.exp.Shutdown(ctx); err != nil {
		return fmt.Errorf("shut down OTLP exporter: %w", err)
	}
	return nil
}

// DefaultPrefix starts every metric name unless Options.Prefix says
// otherwise.
const DefaultPrefix = "cdn"

// Attribute keys the sink adds to the dataset's dimensions.
const (
	AttrEnvironment = "environment_id"
	AttrPercentile  = "percentile"
)

// MetricName returns the OTLP name of an API metric of a dataset and the
// value of its percentile attribute ("" unless it is a percentile), by the
// OpenTelemetry conventions: units in the unit field only, no _total, one
// metric per percentile stem:
//
//	requests_edge_total          → <prefix>.<dataset>.requests_edge
//	bytes_edge_total             → <prefix>.<dataset>.bytes_edge
//	ttfb_edge_ms_95_percentile   → <prefix>.<dataset>.ttfb_edge, percentile "95"
//	requests_cache_hit_ratio     → <prefix>.<dataset>.requests_cache_hit_ratio
func MetricName(prefix, dataset, metric string) (name, percentile string) {
	info := metricsapi.Classify(metric)
	base := metric
	switch info.Kind {
	case metricsapi.KindCount:
		base = strings.TrimSuffix(metric, "_total")
	case metricsapi.KindPercentile:
		base, percentile = info.Stem, info.Percentile
	}
	return prefix + "." + dataset + "." + base, percentile
}

// slot is one OTLP metric of a batch: the API metrics of a percentile stem
// share one.
type slot struct {
	name, desc, unit string
	count            bool
}

// plan is how a batch's metrics become OTLP metrics.
type plan struct {
	slots []slot
	// slotOf and pctOf give, per batch metric, its slot and the index of
	// its percentile in pcts (-1: none).
	slotOf, pctOf []int
	pcts          []string
	attrKeys      []attribute.Key
}

func newPlan(b *schedule.Batch, prefix string) *plan {
	p := &plan{slotOf: make([]int, len(b.Metrics)), pctOf: make([]int, len(b.Metrics))}
	byName := map[string]int{}
	for j, m := range b.Metrics {
		info := metricsapi.Classify(m)
		name, pct := MetricName(prefix, b.Dataset.Name, m)
		i, ok := byName[name]
		if !ok {
			i = len(p.slots)
			byName[name] = i
			p.slots = append(p.slots, slot{name: name, desc: description(b.Dataset, m, info), unit: info.Unit,
				count: info.Kind == metricsapi.KindCount})
		}
		p.slotOf[j] = i
		p.pctOf[j] = -1
		if pct != "" {
			p.pctOf[j] = slices.Index(p.pcts, pct)
			if p.pctOf[j] < 0 {
				p.pctOf[j] = len(p.pcts)
				p.pcts = append(p.pcts, pct)
			}
		}
	}
	p.attrKeys = make([]attribute.Key, 0, len(b.Labels)+1)
	p.attrKeys = append(p.attrKeys, attribute.Key(AttrEnvironment))
	for _, l := range b.Labels {
		p.attrKeys = append(p.attrKeys, attribute.Key(l))
	}
	return p
}

// description is the OTLP description of an API metric: the descriptor's,
// or for a percentile one text for the whole stem.
func description(ds *metricsapi.Dataset, metric string, info metricsapi.MetricInfo) string {
	if info.Kind == metricsapi.KindPercentile {
		return fmt.Sprintf("Percentiles of %s (attribute %s), per bucket of dataset %s.", strings.ReplaceAll(info.Stem, "_", " "), AttrPercentile, ds.Name)
	}
	for _, dm := range ds.Metrics {
		if dm.Name == metric {
			return dm.Description
		}
	}
	return ""
}

// chunker gathers points into export requests of at most max points, in
// the order they are added. sizes (from countPoints) says how many points
// of each slot every request gets, so each request's data points are
// allocated once, exactly.
type chunker struct {
	p      *plan
	res    *resource.Resource
	max    int
	temp   metricdata.Temporality
	sizes  [][]int
	points int
	dps    [][]metricdata.DataPoint[float64] // per slot, of the request being filled
	out    []*export
}

func (c *chunker) add(slot int, dp metricdata.DataPoint[float64]) {
	if c.dps == nil {
		c.start()
	}
	c.dps[slot] = append(c.dps[slot], dp)
	if c.points++; c.points >= c.max {
		c.flush()
	}
}

// start allocates the data points of the next request.
func (c *chunker) start() {
	size := c.sizes[len(c.out)]
	total := 0
	for _, n := range size {
		total += n
	}
	backing := make([]metricdata.DataPoint[float64], total)
	c.dps = make([][]metricdata.DataPoint[float64], len(c.p.slots))
	off := 0
	for slot, n := range size {
		c.dps[slot] = backing[off : off : off+n]
		off += n
	}
}

func (c *chunker) flush() {
	if c.points == 0 {
		return
	}
	var ms []metricdata.Metrics
	for i, sl := range c.p.slots {
		if len(c.dps[i]) == 0 {
			continue
		}
		md := metricdata.Metrics{Name: sl.name, Description: sl.desc, Unit: sl.unit}
		if sl.count {
			md.Data = metricdata.Sum[float64]{DataPoints: c.dps[i], Temporality: c.temp, IsMonotonic: true}
		} else {
			md.Data = metricdata.Gauge[float64]{DataPoints: c.dps[i]}
		}
		ms = append(ms, md)
	}
	c.out = append(c.out, &export{points: c.points, rm: &metricdata.ResourceMetrics{
		Resource:     c.res,
		ScopeMetrics: []metricdata.ScopeMetrics{{Scope: instrumentation.Scope{Name: ScopeName}, Metrics: ms}},
	}})
	c.points, c.dps = 0, nil
}

// attrSets builds the attribute sets of one series: without and with each
// percentile of the plan (made when first asked for).
type attrSets struct {
	p    *plan
	kvs  []attribute.KeyValue
	with []attribute.KeyValue // kvs plus a percentile (NewSet sorts its argument in place)
	base attribute.Set
	pct  []attribute.Set
	made []bool
}

func (a *attrSets) reset(env string, labels []string) {
	if a.kvs == nil {
		a.kvs = make([]attribute.KeyValue, len(a.p.attrKeys))
		a.pct = make([]attribute.Set, len(a.p.pcts))
		a.made = make([]bool, len(a.p.pcts))
	}
	a.kvs = a.kvs[:len(a.p.attrKeys)]
	a.kvs[0] = a.p.attrKeys[0].String(env)
	for i := 1; i < len(a.kvs); i++ {
		v := ""
		if i-1 < len(labels) {
			v = labels[i-1]
		}
		a.kvs[i] = a.p.attrKeys[i].String(v)
	}
	a.base = attribute.NewSet(a.kvs...)
	clear(a.made)
}

func (a *attrSets) of(pct int) attribute.Set {
	if pct < 0 {
		return a.base
	}
	if !a.made[pct] {
		a.with = append(append(a.with[:0], a.kvs...), attribute.String(AttrPercentile, a.p.pcts[pct]))
		a.pct[pct] = attribute.NewSet(a.with...)
		a.made[pct] = true
	}
	return a.pct[pct]
}

// convert turns a batch into export requests of at most maxPoints points,
// in time order: first a gauge point per metric of every Latest bucket (at
// the bucket's end, in bucket order), then a sum point per count of every
// series with a point at the batch's end (cumulative: the series' totals
// since its start; delta: their change since its previous point).
func convert(b *schedule.Batch, prefix string, res *resource.Resource, maxPoints int, temporality metricdata.Temporality) []*export {
	if len(b.Metrics) == 0 || (len(b.Updates) == 0 && len(b.Counts) == 0) {
		return nil
	}
	p := newPlan(b, prefix)
	c := &chunker{p: p, res: res, max: max(1, maxPoints), temp: temporality}
	c.sizes = countPoints(b, p, c.max)
	attrs := &attrSets{p: p}
	width := b.Granularity.Duration()
	for ui := range b.Updates {
		u := &b.Updates[ui]
		if !u.Latest {
			continue
		}
		attrs.reset(u.Row.Environment, u.Row.Labels)
		startT, endT := u.Row.Time, u.Row.Time.Add(width)
		for j, v := range u.Row.Values {
			if j >= len(b.Metrics) || p.slots[p.slotOf[j]].count || math.IsNaN(v) {
				continue
			}
			c.add(p.slotOf[j], metricdata.DataPoint[float64]{Attributes: attrs.of(p.pctOf[j]), StartTime: startT, Time: endT, Value: v})
		}
	}
	for ci := range b.Counts {
		sc := &b.Counts[ci]
		if !sc.Point {
			continue
		}
		attrs.reset(sc.Environment, sc.Labels)
		start := sc.Start
		if temporality == metricdata.DeltaTemporality && !sc.PreviousPoint.IsZero() {
			start = sc.PreviousPoint
		}
		for j, v := range sc.Totals {
			if j >= len(b.Metrics) || !p.slots[p.slotOf[j]].count || math.IsNaN(v) {
				continue
			}
			if temporality == metricdata.DeltaTemporality && j < len(sc.PreviousTotals) && !math.IsNaN(sc.PreviousTotals[j]) {
				v -= sc.PreviousTotals[j]
			}
			c.add(p.slotOf[j], metricdata.DataPoint[float64]{Attributes: attrs.of(-1), StartTime: start, Time: b.End, Value: v})
		}
	}
	c.flush()
	return c.out
}

// countPoints returns, for every export request convert makes of b, the
// number of points of each slot: the same walk as convert's, without
// building the points.
func countPoints(b *schedule.Batch, p *plan, maxPoints int) [][]int {
	var sizes [][]int
	n := 0
	count := func(slot int) {
		if n%maxPoints == 0 {
			sizes = append(sizes, make([]int, len(p.slots)))
		}
		sizes[len(sizes)-1][slot]++
		n++
	}
	for ui := range b.Updates {
		u := &b.Updates[ui]
		if !u.Latest {
			continue
		}
		for j, v := range u.Row.Values {
			if j < len(b.Metrics) && !p.slots[p.slotOf[j]].count && !math.IsNaN(v) {
				count(p.slotOf[j])
			}
		}
	}
	for ci := range b.Counts {
		sc := &b.Counts[ci]
		if !sc.Point {
			continue
		}
		for j, v := range sc.Totals {
			if j < len(b.Metrics) && p.slots[p.slotOf[j]].count && !math.IsNaN(v) {
				count(p.slotOf[j])
			}
		}
	}
	return sizes
}
