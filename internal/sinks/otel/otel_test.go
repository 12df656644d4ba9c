package otel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
	"github.com/edgepipe/edgepipe/internal/sinks/otel/otlptest"
)

var ds = &metricsapi.Dataset{
	Name: "edge_usage_by_country",
	Metrics: []metricsapi.Metric{
		{Name: "requests_edge_total", Description: "Edge requests."},
		{Name: "requests_cache_hit_ratio"},
		{Name: "ttfb_edge_ms_95_percentile"},
	},
}

var b0 = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)

func row(bucket int, env, country string, vals ...float64) metricsapi.Row {
	return metricsapi.Row{Time: b0.Add(time.Duration(bucket) * 5 * time.Minute), Environment: env, Labels: []string{country}, Values: vals}
}

func batch(us ...schedule.Update) *schedule.Batch {
	return &schedule.Batch{Dataset: ds, Granularity: metricsapi.FiveMinutes, Labels: []string{"country_code"},
		Metrics: ds.MetricNames(), Updates: us}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

type wantPoint struct {
	metric string
	sum    bool
	bucket int
	value  float64
}

func TestExportOverOTLP(t *testing.T) {
	for _, proto := range []string{ProtocolGRPC, ProtocolHTTP} {
		t.Run(proto, func(t *testing.T) {
			var rcv *otlptest.Receiver
			var endpoint string
			if proto == ProtocolGRPC {
				rcv, endpoint = otlptest.StartGRPC(t)
				endpoint = "http://" + endpoint
			} else {
				rcv, endpoint = otlptest.StartHTTP(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			exp, err := NewExporter(ctx, proto, endpoint)
			if err != nil {
				t.Fatal(err)
			}
			res, err := NewResource(ctx, "v9.9.9")
			if err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			sink, err := New(exp, Options{Resource: res, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
				Registerer: reg, Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			rcv.FailNext(2) // the collector is down for the first attempts
			if err := sink.Publish(ctx, batch(
				schedule.Update{Row: row(0, "e1", "us", 100, 0.5, 120)},
				schedule.Update{Row: row(1, "e1", "us", 50, 0.6, 130)},
			)); err != nil {
				t.Fatal(err)
			}
			// A revision of bucket 0: count +10, ratio unchanged, ttfb 125.
			if err := sink.Publish(ctx, batch(
				schedule.Update{Row: row(0, "e1", "us", 110, 0.5, 125), Previous: []float64{100, 0.5, 120}},
			)); err != nil {
				t.Fatal(err)
			}
			pts := rcv.WaitPoints(ctx, 8)
			if err := sink.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if rcv.Failed() != 2 {
				t.Errorf("receiver refused %d exports, want 2 (retried)", rcv.Failed())
			}
			want := []wantPoint{
				{"cdn.edge_usage_by_country.requests_edge_total", true, 0, 100},
				{"cdn.edge_usage_by_country.requests_edge_total", true, 1, 50},
				{"cdn.edge_usage_by_country.requests_edge_total", true, 0, 10},
				{"cdn.edge_usage_by_country.requests_cache_hit_ratio", false, 0, 0.5},
				{"cdn.edge_usage_by_country.requests_cache_hit_ratio", false, 1, 0.6},
				{"cdn.edge_usage_by_country.ttfb_edge_ms_95_percentile", false, 0, 120},
				{"cdn.edge_usage_by_country.ttfb_edge_ms_95_percentile", false, 1, 130},
				{"cdn.edge_usage_by_country.ttfb_edge_ms_95_percentile", false, 0, 125},
			}
			checkPoints(t, pts, want)
			if v := testutil.ToFloat64(sink.exported); v != 8 {
				t.Errorf("exported points metric %v, want 8", v)
			}
		})
	}
}

func checkPoints(t *testing.T, pts []otlptest.Point, want []wantPoint) {
	t.Helper()
	units := map[string]string{
		"cdn.edge_usage_by_country.requests_edge_total":        "{request}",
		"cdn.edge_usage_by_country.requests_cache_hit_ratio":   "1",
		"cdn.edge_usage_by_country.ttfb_edge_ms_95_percentile": "ms",
	}
	key := func(m string, bucket int, v float64) string { return fmt.Sprintf("%s@%d=%g", m, bucket, v) }
	var got, exp []string
	for _, p := range pts {
		bucket := int((int64(p.Start) - b0.UnixNano()) / int64(5*time.Minute))
		if want := uint64(b0.Add(time.Duration(bucket) * 5 * time.Minute).UnixNano()); p.Start != want {
			t.Errorf("%s: start %d not a bucket start", p.Metric, p.Start)
		}
		if p.Time != p.Start+uint64(5*time.Minute) {
			t.Errorf("%s: time %d, want start + 5m", p.Metric, p.Time)
		}
		if p.Unit != units[p.Metric] {
			t.Errorf("%s: unit %q, want %q", p.Metric, p.Unit, units[p.Metric])
		}
		isCount := p.Metric == "cdn.edge_usage_by_country.requests_edge_total"
		if p.Sum != isCount || (isCount && (!p.Monotonic || p.Temporality != metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_DELTA)) {
			t.Errorf("%s: sum %v monotonic %v temporality %v", p.Metric, p.Sum, p.Monotonic, p.Temporality)
		}
		if p.Attributes["environment_id"] != "e1" || p.Attributes["country_code"] != "us" || len(p.Attributes) != 2 {
			t.Errorf("%s: attributes %v", p.Metric, p.Attributes)
		}
		if p.Resource["service.name"] != ServiceName || p.Resource["service.version"] != "v9.9.9" || p.Resource["host.name"] == "" {
			t.Errorf("resource %v", p.Resource)
		}
		got = append(got, key(p.Metric, bucket, p.Value))
	}
	for _, w := range want {
		exp = append(exp, key(w.metric, w.bucket, w.value))
	}
	sort.Strings(got)
	sort.Strings(exp)
	if fmt.Sprint(got) != fmt.Sprint(exp) {
		t.Errorf("points\n got %v\nwant %v", got, exp)
	}
}

// blockingExporter blocks every export until released.
type blockingExporter struct {
	mu      sync.Mutex
	release chan struct{}
	n       int
}

func (b *blockingExporter) Export(ctx context.Context, _ *metricdata.ResourceMetrics) error {
	select {
	case <-b.release:
		b.mu.Lock()
		b.n++
		b.mu.Unlock()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *blockingExporter) Shutdown(context.Context) error { return nil }

func TestQueueOverflowNeverBlocks(t *testing.T) {
	exp := &blockingExporter{release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	sink, err := New(exp, Options{QueueSize: 2, Registerer: reg, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var full int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 10 {
			if err := sink.Publish(ctx, batch(schedule.Update{Row: row(i, "e1", "us", 1, 0.5, 10)})); errors.Is(err, ErrQueueFull) {
				full++
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Publish blocked on a stuck exporter")
	}
	// One export in flight, two queued, the rest dropped.
	if full < 7 {
		t.Errorf("%d publishes reported a full queue, want at least 7", full)
	}
	if v := testutil.ToFloat64(sink.dropped.WithLabelValues("queue_full")); v != float64(full*3) {
		t.Errorf("dropped points %v, want %d", v, full*3)
	}
	close(exp.release)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := sink.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if exp.n != 10-full {
		t.Errorf("%d exports after release, want %d (queued ones drained on Close)", exp.n, 10-full)
	}
}

func TestChunking(t *testing.T) {
	var ups []schedule.Update
	for i := range 10 {
		ups = append(ups, schedule.Update{Row: row(i, "e1", "us", 1, 0.5, 10)})
	}
	ex := convert(batch(ups...), DefaultPrefix, nil, 7) // 3 metrics: 2 updates per chunk
	if len(ex) != 5 {
		t.Fatalf("%d exports, want 5", len(ex))
	}
	for _, e := range ex {
		if e.points != 6 {
			t.Errorf("chunk of %d points, want 6", e.points)
		}
	}
}
