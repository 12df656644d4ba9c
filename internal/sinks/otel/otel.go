// Package otel is the OpenTelemetry sink: it turns every published bucket
// into OTLP points carrying the bucket's real time and pushes them with the
// OTLP exporters (gRPC or HTTP/protobuf).
//
// The SDK's instruments stamp points with the time of collection, so the sink
// builds metricdata.ResourceMetrics itself and calls the exporter's Export
// directly. Metric names are cdn.<dataset>.<metric> (the API's names; the
// prefix is Options.Prefix), with
// the source's unit and attributes environment_id plus the dataset's
// dimensions. Counts are monotonic Sums with delta temporality
// (StartTime = bucket start, Time = bucket end; a revision sends the
// difference as a further delta); everything else is a Gauge of the bucket's
// newest value at the same times.
//
// Export runs off the poll path: Publish converts and enqueues (never
// blocks); one worker exports with exponential backoff. When the bounded
// queue is full, new points are dropped, counted and logged.
package otel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
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
	exports := convert(b, s.opts.Prefix, s.opts.Resource, s.opts.MaxPoints)
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

// MetricName returns the OTLP name of an API metric of a dataset.
func MetricName(prefix, dataset, metric string) string {
	return prefix + "." + dataset + "." + metric
}

// convert turns a batch into export requests of at most maxPoints points.
func convert(b *schedule.Batch, prefix string, res *resource.Resource, maxPoints int) []*export {
	if len(b.Updates) == 0 || len(b.Metrics) == 0 {
		return nil
	}
	width := b.Granularity.Duration()
	attrKeys := make([]attribute.Key, 0, len(b.Labels)+1)
	attrKeys = append(attrKeys, attribute.Key(metricsapi.DimensionEnvironment))
	for _, l := range b.Labels {
		attrKeys = append(attrKeys, attribute.Key(l))
	}
	kinds := make([]metricsapi.MetricInfo, len(b.Metrics))
	descs := make([]string, len(b.Metrics))
	for j, m := range b.Metrics {
		kinds[j] = metricsapi.Classify(m)
		for _, dm := range b.Dataset.Metrics {
			if dm.Name == m {
				descs[j] = dm.Description
			}
		}
	}
	perChunk := max(1, maxPoints/len(b.Metrics))
	var out []*export
	kvs := make([]attribute.KeyValue, len(attrKeys))
	for start := 0; start < len(b.Updates); start += perChunk {
		ups := b.Updates[start:min(start+perChunk, len(b.Updates))]
		sums := make([][]metricdata.DataPoint[float64], len(b.Metrics))
		gauges := make([][]metricdata.DataPoint[float64], len(b.Metrics))
		points := 0
		for ui := range ups {
			u := &ups[ui]
			kvs[0] = attrKeys[0].String(u.Row.Environment)
			for i, l := range u.Row.Labels {
				if i+1 < len(kvs) {
					kvs[i+1] = attrKeys[i+1].String(l)
				}
			}
			set := attribute.NewSet(kvs...)
			startT, endT := u.Row.Time, u.Row.Time.Add(width)
			for j := range b.Metrics {
				if j >= len(u.Row.Values) {
					break
				}
				v := u.Row.Values[j]
				if math.IsNaN(v) {
					continue
				}
				var prev float64 = math.NaN()
				if u.Previous != nil && j < len(u.Previous) {
					prev = u.Previous[j]
				}
				if kinds[j].Kind == metricsapi.KindCount {
					if u.Previous != nil {
						if !math.IsNaN(prev) {
							v -= prev
						}
						if v <= 0 { // unchanged, or lowered: a monotonic sum cannot go down
							continue
						}
					}
					sums[j] = append(sums[j], metricdata.DataPoint[float64]{Attributes: set, StartTime: startT, Time: endT, Value: v})
				} else {
					if u.Previous != nil && prev == v {
						continue
					}
					gauges[j] = append(gauges[j], metricdata.DataPoint[float64]{Attributes: set, StartTime: startT, Time: endT, Value: v})
				}
				points++
			}
		}
		if points == 0 {
			continue
		}
		var ms []metricdata.Metrics
		for j, m := range b.Metrics {
			md := metricdata.Metrics{Name: MetricName(prefix, b.Dataset.Name, m), Description: descs[j], Unit: kinds[j].Unit}
			switch {
			case len(sums[j]) > 0:
				md.Data = metricdata.Sum[float64]{DataPoints: sums[j], Temporality: metricdata.DeltaTemporality, IsMonotonic: true}
			case len(gauges[j]) > 0:
				md.Data = metricdata.Gauge[float64]{DataPoints: gauges[j]}
			default:
				continue
			}
			ms = append(ms, md)
		}
		out = append(out, &export{points: points, rm: &metricdata.ResourceMetrics{
			Resource:     res,
			ScopeMetrics: []metricdata.ScopeMetrics{{Scope: instrumentation.Scope{Name: ScopeName}, Metrics: ms}},
		}})
	}
	return out
}
