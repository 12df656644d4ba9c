package otel

import (
	"context"
	"fmt"
	"math"
	"net"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	colmetricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
)

// benchUsage has the shape of edge_usage_by_country: 19 metrics (14 counts)
// plus 12 percentiles, i.e. 31 points per (environment, country) per bucket.
var benchUsage = func() *metricsapi.Dataset {
	ds := &metricsapi.Dataset{Name: "edge_usage_by_country"}
	for _, m := range []string{"requests_edge_total", "requests_per_second_edge", "requests_hit_total", "requests_cache_hit_ratio",
		"requests_miss_total", "requests_stale_total", "requests_prefetch_total", "requests_prefetch_cache_hit_ratio",
		"requests_cachable_total", "requests_2xx_total", "requests_3xx_total", "requests_4xx_total", "requests_5xx_total",
		"requests_error_ratio", "bytes_edge_total", "bytes_hit_total", "bytes_miss_total", "bytes_stale_total", "bits_per_second_edge"} {
		ds.Metrics = append(ds.Metrics, metricsapi.Metric{Name: m})
	}
	for _, stem := range []string{"ttfb_edge", "response_time_edge"} {
		for _, p := range []string{"5", "25", "50", "75", "95", "99"} {
			ds.Metrics = append(ds.Metrics, metricsapi.Metric{Name: stem + "_ms_" + p + "_percentile"})
		}
	}
	return ds
}()

// benchBatch is one poll's batch of ds: one new bucket for each of n label
// sets (UUID-like environments times two-letter countries), and a point of
// each series' counts.
func benchBatch(ds *metricsapi.Dataset, n int) *schedule.Batch {
	metrics := ds.MetricNames()
	b := &schedule.Batch{Dataset: ds, Granularity: metricsapi.FiveMinutes, Labels: []string{"country_code"}, Metrics: metrics}
	t := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for i := range n {
		env := fmt.Sprintf("%08x-5d1e-4c3b-9a2f-%012x", i/250, i)
		country := string([]byte{'a' + byte(i%250/26), 'a' + byte(i%26)})
		vals := make([]float64, len(metrics))
		totals := make([]float64, len(metrics))
		for j := range vals {
			vals[j] = float64(j*7 + i%13 + 1)
			totals[j] = math.NaN()
			if metricsapi.Classify(metrics[j]).Kind == metricsapi.KindCount {
				totals[j] = 1000 * vals[j]
			}
		}
		lbls := []string{country}
		b.Updates = append(b.Updates, schedule.Update{Row: metricsapi.Row{Time: t, Environment: env, Labels: lbls, Values: vals}, Latest: true})
		b.Counts = append(b.Counts, schedule.SeriesCounts{Environment: env, Labels: lbls, Totals: totals, Start: t.Add(-time.Hour),
			Newest: t, Point: true})
	}
	b.End = t.Add(5 * time.Minute)
	return b
}

// BenchmarkConvert measures the sink's own work per OTLP data point: one
// poll's batch (10k label sets of edge_usage_by_country, one new bucket
// each) turned into export requests.
// Run: go test -run '^$' -bench BenchmarkConvert -benchmem ./internal/sinks/otel
func BenchmarkConvert(b *testing.B) {
	batch := benchBatch(benchUsage, 10_000)
	points := 0
	b.ReportAllocs()
	for b.Loop() {
		points = 0
		for _, e := range convert(batch, DefaultPrefix, nil, DefaultMaxPoints, metricdata.CumulativeTemporality) {
			points += e.points
		}
	}
	if points == 0 {
		b.Fatal("no points")
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(points), "ns/point")
	b.ReportMetric(float64(points), "points")
}

// discardServer accepts every OTLP export and keeps nothing.
type discardServer struct {
	colmetricspb.UnimplementedMetricsServiceServer
}

func (discardServer) Export(context.Context, *colmetricspb.ExportMetricsServiceRequest) (*colmetricspb.ExportMetricsServiceResponse, error) {
	return &colmetricspb.ExportMetricsServiceResponse{}, nil
}

// skipDecoding is a server codec that does not decode requests, so a
// benchmark measures the sender only.
type skipDecoding struct{}

func (skipDecoding) Marshal(v any) ([]byte, error)   { return proto.Marshal(v.(proto.Message)) }
func (skipDecoding) Unmarshal(_ []byte, _ any) error { return nil }
func (skipDecoding) Name() string                    { return "proto" }

// BenchmarkExportGRPC measures the exporter's whole cost per point:
// conversion, the OTLP exporter's transform and protobuf encoding, and the
// gRPC call to an in-process server on loopback that does not decode the
// request (that is the collector's cost).
// Run: go test -run '^$' -bench BenchmarkExportGRPC -benchmem ./internal/sinks/otel
func BenchmarkExportGRPC(b *testing.B) {
	benchExport(b, grpc.ForceServerCodec(skipDecoding{}))
}

// BenchmarkExportGRPCDecoded is BenchmarkExportGRPC with the server
// decoding every request, as a collector does.
func BenchmarkExportGRPCDecoded(b *testing.B) {
	benchExport(b)
}

func benchExport(b *testing.B, opts ...grpc.ServerOption) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	colmetricspb.RegisterMetricsServiceServer(srv, discardServer{})
	go srv.Serve(l)
	defer srv.Stop()
	ctx := context.Background()
	exp, err := NewExporter(ctx, ProtocolGRPC, "http://"+l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer exp.Shutdown(ctx)
	batch := benchBatch(benchUsage, 10_000)
	points := 0
	b.ReportAllocs()
	for b.Loop() {
		points = 0
		for _, e := range convert(batch, DefaultPrefix, nil, DefaultMaxPoints, metricdata.CumulativeTemporality) {
			if err := exp.Export(ctx, e.rm); err != nil {
				b.Fatal(err)
			}
			points += e.points
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(points), "ns/point")
}
