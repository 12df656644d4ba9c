package otel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
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

// counts is the scheduler's totals of requests_edge_total for e1/us with
// a point at end (the previous one at prevEnd with prevTotal, if set).
func counts(start, prevEnd time.Time, prevTotal, total float64) schedule.SeriesCounts {
	nan := math.NaN()
	sc := schedule.SeriesCounts{Environment: "e1", Labels: []string{"us"}, Totals: []float64{total, nan, nan},
		Start: start, Point: true}
	if !prevEnd.IsZero() {
		sc.PreviousPoint, sc.PreviousTotals = prevEnd, []float64{prevTotal, nan, nan}
	}
	return sc
}

func at(bucket int) time.Time { return b0.Add(time.Duration(bucket) * 5 * time.Minute) }

// TestExportOverOTLP publishes three polls' batches to an OTLP receiver
// over both protocols and both temporalities, the collector down for the
// first attempts: a gauge point per Latest bucket at its end (a revision is
// not sent again), the percentile as an attribute of one metric per stem,
// one sum point per poll end (the revision folded into the next one).
func TestExportOverOTLP(t *testing.T) {
	for _, proto := range []string{ProtocolGRPC, ProtocolHTTP} {
		for _, temp := range []metricdata.Temporality{metricdata.CumulativeTemporality, metricdata.DeltaTemporality} {
			t.Run(proto+"/"+temp.String(), func(t *testing.T) {
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
					Registerer: reg, Logger: quiet(), Temporality: temp})
				if err != nil {
					t.Fatal(err)
				}
				rcv.FailNext(2) // the collector is down for the first attempts
				// Poll ending at bucket 2: buckets 0 and 1 are new.
				b := batch(
					schedule.Update{Row: row(1, "e1", "us", 50, 0.6, 130), Latest: true},
					schedule.Update{Row: row(0, "e1", "us", 100, 0.5, 120), Latest: true},
				)
				b.Counts, b.End = []schedule.SeriesCounts{counts(at(0), time.Time{}, 0, 150)}, at(2)
				publish(t, sink, b)
				// Same end: bucket 0 revised (count +10, ttfb 125): no point.
				b = batch(schedule.Update{Row: row(0, "e1", "us", 110, 0.5, 125), Previous: []float64{100, 0.5, 120}})
				sc := counts(at(0), time.Time{}, 0, 160)
				sc.Point = false
				b.Counts, b.End = []schedule.SeriesCounts{sc}, at(2)
				publish(t, sink, b)
				// Next end: bucket 2 is new; the revision is in the totals.
				b = batch(schedule.Update{Row: row(2, "e1", "us", 30, 0.7, 140), Latest: true})
				b.Counts, b.End = []schedule.SeriesCounts{counts(at(0), at(2), 150, 190)}, at(3)
				publish(t, sink, b)

				pts := rcv.WaitPoints(ctx, 8)
				if err := sink.Close(ctx); err != nil {
					t.Fatal(err)
				}
				if rcv.Failed() != 2 {
					t.Errorf("receiver refused %d exports, want 2 (retried)", rcv.Failed())
				}
				const (
					reqs  = "cdn.edge_usage_by_country.requests_edge"
					ratio = "cdn.edge_usage_by_country.requests_cache_hit_ratio"
					ttfb  = "cdn.edge_usage_by_country.ttfb_edge"
				)
				want := []string{
					// gauges: one point per bucket, at its end
					ratio + " [0,1) 0.5", ratio + " [1,2) 0.6", ratio + " [2,3) 0.7",
					ttfb + "{95} [0,1) 120", ttfb + "{95} [1,2) 130", ttfb + "{95} [2,3) 140",
				}
				if temp == metricdata.CumulativeTemporality {
					want = append(want, reqs+" [0,2) 150", reqs+" [0,3) 190")
				} else {
					want = append(want, reqs+" [0,2) 150", reqs+" [2,3) 40")
				}
				var got []string
				for _, p := range pts {
					pct := ""
					if v, ok := p.Attributes[AttrPercentile]; ok {
						pct = "{" + v + "}"
					}
					got = append(got, fmt.Sprintf("%s%s [%d,%d) %g", p.Metric, pct,
						(int64(p.Start)-b0.UnixNano())/int64(5*time.Minute), (int64(p.Time)-b0.UnixNano())/int64(5*time.Minute), p.Value))
					unit := map[string]string{reqs: "{request}", ratio: "1", ttfb: "ms"}[p.Metric]
					if p.Unit != unit {
						t.Errorf("%s: unit %q, want %q", p.Metric, p.Unit, unit)
					}
					isCount := p.Metric == reqs
					if p.Sum != isCount || (isCount && (!p.Monotonic || p.Temporality != wantTemporality(temp))) {
						t.Errorf("%s: sum %v monotonic %v temporality %v", p.Metric, p.Sum, p.Monotonic, p.Temporality)
					}
					wantAttrs := 2
					if pct != "" {
						wantAttrs = 3
					}
					if p.Attributes["environment_id"] != "e1" || p.Attributes["country_code"] != "us" || len(p.Attributes) != wantAttrs {
						t.Errorf("%s: attributes %v", p.Metric, p.Attributes)
					}
					if p.Resource["service.name"] != ServiceName || p.Resource["service.version"] != "v9.9.9" || p.Resource["host.name"] == "" {
						t.Errorf("resource %v", p.Resource)
					}
				}
				sort.Strings(got)
				sort.Strings(want)
				if !slices.Equal(got, want) {
					t.Errorf("points\n got %v\nwant %v", got, want)
				}
				if v := testutil.ToFloat64(sink.exported); v != 8 {
					t.Errorf("exported points metric %v, want 8", v)
				}
			})
		}
	}
}

func wantTemporality(t metricdata.Temporality) metricspb.AggregationTemporality {
	if t == metricdata.DeltaTemporality {
		return metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_DELTA
	}
	return metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE
}

func publish(t *testing.T, s *Sink, b *schedule.Batch) {
	t.Helper()
	if err := s.Publish(context.Background(), b); err != nil {
		t.Fatal(err)
	}
}

func TestMetricName(t *testing.T) {
	for _, tc := range []struct{ metric, name, pct string }{
		{"requests_edge_total", "cdn.ds.requests_edge", ""},
		{"bytes_origin_total", "cdn.ds.bytes_origin", ""},
		{"ttfb_edge_ms_95_percentile", "cdn.ds.ttfb_edge", "95"},
		{"response_time_origin_ms_5_percentile", "cdn.ds.response_time_origin", "5"},
		{"requests_cache_hit_ratio", "cdn.ds.requests_cache_hit_ratio", ""},
		{"requests_per_second_edge", "cdn.ds.requests_per_second_edge", ""},
		{"bits_per_second_edge", "cdn.ds.bits_per_second_edge", ""},
	} {
		if name, pct := MetricName(DefaultPrefix, "ds", tc.metric); name != tc.name || pct != tc.pct {
			t.Errorf("MetricName(%s) = %s, %q; want %s, %q", tc.metric, name, pct, tc.name, tc.pct)
		}
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
			if err := sink.Publish(ctx, batch(schedule.Update{Row: row(i, "e1", "us", 1, 0.5, 10), Latest: true})); errors.Is(err, ErrQueueFull) {
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
	if v := testutil.ToFloat64(sink.dropped.WithLabelValues("queue_full")); v != float64(full*2) {
		t.Errorf("dropped points %v, want %d (two gauge points per batch)", v, full*2)
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

// TestChunking: requests hold at most MaxPoints points, and each series'
// points are in time order across them (gauges oldest bucket first, sums
// at the batch's end last).
func TestChunking(t *testing.T) {
	b := batch()
	for i := range 10 {
		b.Updates = append(b.Updates, schedule.Update{Row: row(i, "e1", "us", 1, 0.5, 10), Latest: true})
	}
	b.Counts, b.End = []schedule.SeriesCounts{counts(at(0), time.Time{}, 0, 10)}, at(10)
	ex := convert(b, DefaultPrefix, nil, 7, metricdata.CumulativeTemporality)
	// 10 buckets × 2 gauges + 1 sum = 21 points: 3 requests of 7.
	if len(ex) != 3 {
		t.Fatalf("%d exports, want 3", len(ex))
	}
	last := map[string]time.Time{}
	for _, e := range ex {
		if e.points != 7 {
			t.Errorf("chunk of %d points, want 7", e.points)
		}
		for _, m := range e.rm.ScopeMetrics[0].Metrics {
			var dps []metricdata.DataPoint[float64]
			switch d := m.Data.(type) {
			case metricdata.Gauge[float64]:
				dps = d.DataPoints
			case metricdata.Sum[float64]:
				dps = d.DataPoints
			}
			for _, dp := range dps {
				if !dp.Time.After(last[m.Name]) {
					t.Errorf("%s: point at %s after one at %s", m.Name, dp.Time, last[m.Name])
				}
				last[m.Name] = dp.Time
			}
		}
	}
}

func TestTemporality(t *testing.T) {
	const env = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
	for _, tc := range []struct {
		flag, env string
		want      metricdata.Temporality
		bad       bool
	}{
		{"", "", metricdata.CumulativeTemporality, false},
		{"delta", "", metricdata.DeltaTemporality, false},
		{"", "Delta", metricdata.DeltaTemporality, false},
		{"", "lowmemory", metricdata.CumulativeTemporality, false},
		{"cumulative", "delta", metricdata.CumulativeTemporality, false},
		{"lowmemory", "", 0, true},
		{"", "sometimes", 0, true},
	} {
		t.Setenv(env, tc.env)
		got, err := Temporality(tc.flag)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("Temporality(%q) with %s=%q = %v, %v; want %v", tc.flag, env, tc.env, got, err, tc.want)
		}
	}
}

// TestAttributeSets: every point carries environment_id and every
// dimension, percentile points the percentile too, whatever the dimensions
// are called (NewSet sorts in place: "zone" sorts after "percentile").
func TestAttributeSets(t *testing.T) {
	zds := &metricsapi.Dataset{Name: "zoned", Metrics: []metricsapi.Metric{
		{Name: "ttfb_edge_ms_50_percentile"}, {Name: "ttfb_edge_ms_95_percentile"}, {Name: "requests_edge_total"}}}
	b := &schedule.Batch{Dataset: zds, Granularity: metricsapi.FiveMinutes, Labels: []string{"zone", "country_code"},
		Metrics: zds.MetricNames(), End: at(2)}
	for i, z := range []string{"z1", "z2"} {
		b.Updates = append(b.Updates, schedule.Update{Latest: true, Row: metricsapi.Row{Time: at(1), Environment: "e1",
			Labels: []string{z, "us"}, Values: []float64{float64(10 + i), float64(20 + i), 5}}})
		b.Counts = append(b.Counts, schedule.SeriesCounts{Environment: "e1", Labels: []string{z, "us"},
			Totals: []float64{math.NaN(), math.NaN(), 5}, Start: at(0), Point: true})
	}
	var got []string
	for _, e := range convert(b, DefaultPrefix, nil, 100, metricdata.CumulativeTemporality) {
		for _, m := range e.rm.ScopeMetrics[0].Metrics {
			var dps []metricdata.DataPoint[float64]
			switch d := m.Data.(type) {
			case metricdata.Gauge[float64]:
				dps = d.DataPoints
			case metricdata.Sum[float64]:
				dps = d.DataPoints
			}
			for _, dp := range dps {
				got = append(got, fmt.Sprintf("%s %s %g", m.Name, dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Value))
			}
		}
	}
	sort.Strings(got)
	want := []string{
		"cdn.zoned.requests_edge country_code=us,environment_id=e1,zone=z1 5",
		"cdn.zoned.requests_edge country_code=us,environment_id=e1,zone=z2 5",
		"cdn.zoned.ttfb_edge country_code=us,environment_id=e1,percentile=50,zone=z1 10",
		"cdn.zoned.ttfb_edge country_code=us,environment_id=e1,percentile=50,zone=z2 11",
		"cdn.zoned.ttfb_edge country_code=us,environment_id=e1,percentile=95,zone=z1 20",
		"cdn.zoned.ttfb_edge country_code=us,environment_id=e1,percentile=95,zone=z2 21",
	}
	if !slices.Equal(got, want) {
		t.Errorf("points\n got %q\nwant %q", got, want)
	}
}
