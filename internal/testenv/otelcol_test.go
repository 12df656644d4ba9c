package testenv

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.yaml.in/yaml/v3"
)

func TestOTelCollectorManifest(t *testing.T) {
	t.Parallel()
	var m struct {
		Dist map[string]string
		// Component lists: "gomod" entries "module version".
		Receivers, Processors, Exporters, Extensions, Providers []struct{ GoMod string }
	}
	if err := yaml.Unmarshal(otelColManifest, &m); err != nil {
		t.Fatal(err)
	}
	if m.Dist["name"] != otelColBinaryName {
		t.Errorf("dist.name %q, want %q", m.Dist["name"], otelColBinaryName)
	}
	mods := map[string]string{}
	for _, list := range [][]struct{ GoMod string }{m.Receivers, m.Processors, m.Exporters, m.Extensions, m.Providers} {
		for _, c := range list {
			mod, version, ok := strings.Cut(c.GoMod, " ")
			if !ok {
				t.Fatalf("gomod %q has no version", c.GoMod)
			}
			mods[mod] = version
			// Core and contrib v0 modules are released with the builder.
			if strings.HasPrefix(version, "v0.") && version != OTelCollectorBuilderVersion {
				t.Errorf("%s at %s, builder at %s", mod, version, OTelCollectorBuilderVersion)
			}
		}
	}
	for _, want := range []string{
		"go.opentelemetry.io/collector/receiver/otlpreceiver",
		"go.opentelemetry.io/collector/processor/batchprocessor",
		"github.com/open-telemetry/opentelemetry-collector-contrib/processor/deltatocumulativeprocessor",
		"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/prometheusremotewriteexporter",
		"go.opentelemetry.io/collector/exporter/debugexporter",
		"github.com/open-telemetry/opentelemetry-collector-contrib/extension/healthcheckextension",
	} {
		if _, ok := mods[want]; !ok {
			t.Errorf("manifest lacks %s", want)
		}
	}

	out, err := otelColManifestFor("/tmp/x/src", "/opt/go/bin/go")
	if err != nil {
		t.Fatal(err)
	}
	var withOut struct{ Dist map[string]string }
	if err := yaml.Unmarshal(out, &withOut); err != nil {
		t.Fatal(err)
	}
	if withOut.Dist["output_path"] != "/tmp/x/src" || withOut.Dist["go"] != "/opt/go/bin/go" || withOut.Dist["name"] != otelColBinaryName {
		t.Errorf("manifest with output: dist %v", withOut.Dist)
	}
}

func TestOTelCollectorConfig(t *testing.T) {
	t.Parallel()
	type pipeline struct{ Receivers, Processors, Exporters []string }
	tests := []struct {
		name  string
		opts  OTelCollectorOptions
		want  pipeline
		check func(t *testing.T, cfg map[string]any)
	}{
		{
			name: "debug only",
			want: pipeline{Receivers: []string{"otlp"}, Exporters: []string{"debug"}},
		},
		{
			name: "remote write with every processor",
			opts: OTelCollectorOptions{
				DeltaToCumulative: true, DeltaToCumulativeMaxStale: 10 * time.Minute, Batch: true,
				RemoteWriteURL: "http://127.0.0.1:9/api/v1/write", RemoteWriteTranslationStrategy: "NoTranslation",
				RemoteWriteConsumers: 1, Debug: true,
			},
			want: pipeline{
				Receivers:  []string{"otlp"},
				Processors: []string{"delta_to_cumulative", "batch"},
				Exporters:  []string{"prometheus_remote_write", "debug"},
			},
			check: func(t *testing.T, cfg map[string]any) {
				rw := cfg["exporters"].(map[string]any)["prometheus_remote_write"].(map[string]any)
				if rw["endpoint"] != "http://127.0.0.1:9/api/v1/write" || rw["translation_strategy"] != "NoTranslation" ||
					rw["remote_write_queue"].(map[string]any)["num_consumers"] != 1 {
					t.Errorf("remote write exporter: %v", rw)
				}
				d2c := cfg["processors"].(map[string]any)["delta_to_cumulative"].(map[string]any)
				if d2c["max_stale"] != "10m0s" {
					t.Errorf("delta_to_cumulative: %v", d2c)
				}
			},
		},
		{
			name: "remote write only",
			opts: OTelCollectorOptions{RemoteWriteURL: "http://127.0.0.1:9/api/v1/write"},
			want: pipeline{Receivers: []string{"otlp"}, Exporters: []string{"prometheus_remote_write"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := otelCollectorConfig(tc.opts, []int{1001, 1002, 1003, 1004})
			if err != nil {
				t.Fatal(err)
			}
			var cfg map[string]any
			if err := yaml.Unmarshal(b, &cfg); err != nil {
				t.Fatal(err)
			}
			var parsed struct {
				Service struct {
					Extensions []string
					Pipelines  struct{ Metrics pipeline }
					Telemetry  struct {
						Metrics struct {
							Level   string
							Readers []struct {
								Pull struct {
									Exporter struct{ Prometheus map[string]any }
								}
							}
						}
					}
				}
			}
			if err := yaml.Unmarshal(b, &parsed); err != nil {
				t.Fatal(err)
			}
			got := parsed.Service.Pipelines.Metrics
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("metrics pipeline %+v, want %+v\n%s", got, tc.want, b)
			}
			tel := parsed.Service.Telemetry.Metrics
			if tel.Level != "detailed" || len(tel.Readers) != 1 ||
				tel.Readers[0].Pull.Exporter.Prometheus["host"] != "127.0.0.1" || tel.Readers[0].Pull.Exporter.Prometheus["port"] != 1003 {
				t.Errorf("telemetry: %+v", tel)
			}
			if s := string(b); !strings.Contains(s, "endpoint: 127.0.0.1:1001") || !strings.Contains(s, "endpoint: 127.0.0.1:1002") ||
				!strings.Contains(s, "endpoint: 127.0.0.1:1004") || fmt.Sprint(parsed.Service.Extensions) != "[health_check]" {
				t.Errorf("receiver or health check endpoints missing:\n%s", s)
			}
			if tc.check != nil {
				tc.check(t, cfg)
			}
		})
	}
}

// otlpExporter is what the OTLP metric exporters do (as in
// internal/sinks/otel): export ResourceMetrics built by hand.
type otlpExporter interface {
	Export(ctx context.Context, rm *metricdata.ResourceMetrics) error
	Shutdown(ctx context.Context) error
}

func newOTLPExporter(t *testing.T, transport string, col *OTelCollectorProcess) otlpExporter {
	t.Helper()
	ctx := context.Background()
	var exp otlpExporter
	var err error
	switch transport {
	case "grpc":
		exp, err = otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithEndpoint(col.GRPCAddr()), otlpmetricgrpc.WithInsecure(),
			otlpmetricgrpc.WithRetry(otlpmetricgrpc.RetryConfig{Enabled: false}))
	case "http":
		exp, err = otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpoint(col.HTTPAddr()), otlpmetrichttp.WithInsecure(),
			otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig{Enabled: false}))
	default:
		t.Fatalf("transport %q", transport)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exp.Shutdown(context.Background()) })
	return exp
}

// The resource and scope the exporter sends (service.name and
// service.instance.id become job and instance; other resource attributes go
// to target_info).
var (
	testResource = resource.NewSchemaless(
		attribute.String("service.name", "edgepipe-exporter"),
		attribute.String("service.instance.id", "exporter-1"),
		attribute.String("host.name", "edge-host"),
	)
	testScope = instrumentation.Scope{Name: "github.com/edgepipe/edgepipe/internal/sinks/otel"}
	testAttrs = attribute.NewSet(attribute.String("environment_id", "env1"), attribute.String("country", "DE"))
)

func exportMetrics(t *testing.T, exp otlpExporter, ms ...metricdata.Metrics) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rm := &metricdata.ResourceMetrics{Resource: testResource, ScopeMetrics: []metricdata.ScopeMetrics{{Scope: testScope, Metrics: ms}}}
	if err := exp.Export(ctx, rm); err != nil {
		t.Fatalf("export: %v", err)
	}
}

// point is one bucket [start, end) of testAttrs.
func point(start, end time.Time, v float64) metricdata.DataPoint[float64] {
	return metricdata.DataPoint[float64]{Attributes: testAttrs, StartTime: start, Time: end, Value: v}
}

func monotonicSum(name, unit string, temporality metricdata.Temporality, p metricdata.DataPoint[float64]) metricdata.Metrics {
	return metricdata.Metrics{Name: name, Unit: unit, Data: metricdata.Sum[float64]{
		Temporality: temporality, IsMonotonic: true, DataPoints: []metricdata.DataPoint[float64]{p},
	}}
}

func gauge(name, unit string, p metricdata.DataPoint[float64]) metricdata.Metrics {
	return metricdata.Metrics{Name: name, Unit: unit, Data: metricdata.Gauge[float64]{DataPoints: []metricdata.DataPoint[float64]{p}}}
}

// eventually calls check every 200ms until it returns nil and fails the
// test with its last error after timeout.
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sampleAt returns the value of the single series selector matches, stored
// at exactly ts, and whether there is one.
func sampleAt(t *testing.T, prom *PrometheusServer, selector string, ts time.Time) (float64, bool) {
	t.Helper()
	m := prom.RawSamples(t, selector, 3*time.Hour)
	if len(m) > 1 {
		t.Fatalf("%s matches %d series: %v", selector, len(m), m)
	}
	for _, s := range m {
		for _, v := range s.Values {
			if v.Timestamp.Time().Equal(ts) {
				return float64(v.Value), true
			}
		}
	}
	return 0, false
}

func waitSample(t *testing.T, prom *PrometheusServer, selector string, ts time.Time, want float64) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		got, ok := sampleAt(t, prom, selector, ts)
		switch {
		case !ok:
			return fmt.Errorf("%s has no sample at %s: %v", selector, ts, prom.RawSamples(t, selector, 3*time.Hour))
		case got != want:
			return fmt.Errorf("%s at %s = %v, want %v", selector, ts, got, want)
		}
		return nil
	})
}

// TestOTelCollectorToPrometheus sends cumulative and delta Sums and Gauges
// (the metric names and units of internal/sinks/otel) with OTLP over gRPC
// and HTTP to a real collector (delta_to_cumulative →
// prometheus_remote_write) writing into a real Prometheus 2.42, and checks
// the names, labels and values Prometheus stores, and the collector's own
// counters, including the delta points delta_to_cumulative drops.
func TestOTelCollectorToPrometheus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		transport string
		opts      OTelCollectorOptions
	}{
		{"grpc", OTelCollectorOptions{DeltaToCumulative: true}},
		// Also through the batch processor, with another max_stale.
		{"http", OTelCollectorOptions{DeltaToCumulative: true, DeltaToCumulativeMaxStale: 10 * time.Minute, Batch: true}},
	} {
		transport := tc.transport
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			prom := PrometheusWith(t, PrometheusOptions{RemoteWriteReceiver: true})
			opts := tc.opts
			opts.RemoteWriteURL = prom.RemoteWriteURL()
			col := OTelCollector(t, opts)
			exp := newOTLPExporter(t, transport, col)

			// Two one-minute buckets ending 8 and 9 minutes ago.
			b0 := time.Now().Truncate(time.Minute).Add(-10 * time.Minute)
			b1, b2 := b0.Add(time.Minute), b0.Add(2*time.Minute)
			const (
				cumulative = metricdata.CumulativeTemporality
				delta      = metricdata.DeltaTemporality
			)
			// OTLP name and unit → the Prometheus name the exporter writes,
			// and the values of the two buckets.
			series := []struct {
				otlp, unit, prom string
				sum              bool
				temporality      metricdata.Temporality
				sent             [2]float64 // what each export carries
				stored           [2]float64 // what Prometheus holds at b1, b2
			}{
				// A name that ends in _total keeps one _total; {request}
				// (an annotation) adds nothing.
				{"cdn.edge_usage.requests_edge_total", "{request}", "cdn_edge_usage_requests_edge_total", true, cumulative, [2]float64{10, 25}, [2]float64{10, 25}},
				// By adds _bytes unless the name has the word "bytes".
				{"cdn.edge_usage.bytes_edge_total", "By", "cdn_edge_usage_bytes_edge_total", true, delta, [2]float64{100, 50}, [2]float64{100, 150}},
				{"cdn.edge_usage.requests_hit", "{request}", "cdn_edge_usage_requests_hit_total", true, delta, [2]float64{7, 3}, [2]float64{7, 10}},
				{"cdn.edge_usage.bytes_out", "By", "cdn_edge_usage_bytes_out_total", true, delta, [2]float64{1000, 24}, [2]float64{1000, 1024}},
				{"cdn.edge_usage.body", "By", "cdn_edge_usage_body_bytes_total", true, delta, [2]float64{5, 5}, [2]float64{5, 10}},
				// Gauges: unit "1" adds _ratio (moved to the end if the name
				// has it), ms _milliseconds; a main unit word already among
				// the name's words is not repeated, but "/s" always adds
				// _per_second; "bit" has no Prometheus name and stays.
				{"cdn.edge_usage.requests_cache_hit_ratio", "1", "cdn_edge_usage_requests_cache_hit_ratio", false, 0, [2]float64{0.5, 0.75}, [2]float64{0.5, 0.75}},
				{"cdn.edge_usage.cache_hit", "1", "cdn_edge_usage_cache_hit_ratio", false, 0, [2]float64{0.25, 0.5}, [2]float64{0.25, 0.5}},
				{"cdn.edge_usage.ttfb_edge_ms_95_percentile", "ms", "cdn_edge_usage_ttfb_edge_ms_95_percentile_milliseconds", false, 0, [2]float64{12, 14}, [2]float64{12, 14}},
				{"cdn.edge_usage.bits_per_second_edge", "bit/s", "cdn_edge_usage_bits_per_second_edge_bit_per_second", false, 0, [2]float64{8e6, 9e6}, [2]float64{8e6, 9e6}},
				{"cdn.edge_usage.requests_per_second_edge", "{request}/s", "cdn_edge_usage_requests_per_second_edge_per_second", false, 0, [2]float64{3, 4}, [2]float64{3, 4}},
			}
			var deltas int
			for i, end := range []time.Time{b1, b2} {
				var ms []metricdata.Metrics
				for _, s := range series {
					switch {
					case !s.sum:
						ms = append(ms, gauge(s.otlp, s.unit, point(end.Add(-time.Minute), end, s.sent[i])))
					case s.temporality == cumulative:
						ms = append(ms, monotonicSum(s.otlp, s.unit, cumulative, point(b0, end, s.sent[i])))
					default:
						ms = append(ms, monotonicSum(s.otlp, s.unit, delta, point(end.Add(-time.Minute), end, s.sent[i])))
						deltas++
					}
				}
				exportMetrics(t, exp, ms...)
				// One bucket at a time: the exporter's concurrent queue
				// consumers could otherwise deliver the second before the
				// first, which Prometheus refuses as out of order.
				waitSample(t, prom, series[1].prom, end, series[1].stored[i])
			}

			labels := model.Metric{
				"environment_id": "env1", "country": "DE",
				"job": "edgepipe-exporter", "instance": "exporter-1",
				"otel_scope_name": model.LabelValue(testScope.Name),
			}
			for _, s := range series {
				m := prom.RawSamples(t, s.prom, time.Hour)
				if len(m) != 1 {
					names := map[model.LabelValue]bool{}
					for _, ss := range prom.RawSamples(t, `{__name__=~"cdn_.*"}`, time.Hour) {
						names[ss.Metric[model.MetricNameLabel]] = true
					}
					t.Errorf("%s (%s): want one series %s, got %d; stored names: %v", s.otlp, s.unit, s.prom, len(m), slices.Sorted(maps.Keys(names)))
					continue
				}
				got := m[0].Metric.Clone()
				delete(got, model.MetricNameLabel)
				if !got.Equal(labels) {
					t.Errorf("%s labels %v, want %v", s.prom, got, labels)
				}
				var values []string
				for _, v := range m[0].Values {
					values = append(values, fmt.Sprintf("%g@%s", float64(v.Value), v.Timestamp.Time().UTC().Format("15:04:05")))
				}
				want := []string{
					fmt.Sprintf("%g@%s", s.stored[0], b1.UTC().Format("15:04:05")),
					fmt.Sprintf("%g@%s", s.stored[1], b2.UTC().Format("15:04:05")),
				}
				if fmt.Sprint(values) != fmt.Sprint(want) {
					t.Errorf("%s samples %v, want %v", s.prom, values, want)
				}
			}
			// Resource attributes other than service.* become target_info.
			if v, ok := sampleAt(t, prom, `target_info{job="edgepipe-exporter",instance="exporter-1",host_name="edge-host"}`, b2); !ok || v != 1 {
				t.Errorf("target_info at b2: %v %v", v, ok)
			}

			// The collector's own counters: every point accepted over this
			// transport and sent, every delta turned cumulative, none dropped.
			points := float64(2 * len(series))
			if got := col.TelemetrySum(t, OTelColReceiverAccepted, map[string]string{"receiver": "otlp", "transport": transport}); got != points {
				t.Errorf("%s{transport=%s} = %v, want %v", OTelColReceiverAccepted, transport, got, points)
			}
			eventually(t, 10*time.Second, func() error {
				if got := col.TelemetrySum(t, OTelColExporterSent, map[string]string{"exporter": "prometheus_remote_write"}); got != points {
					return fmt.Errorf("%s = %v, want %v", OTelColExporterSent, got, points)
				}
				return nil
			})
			for name, want := range map[string]float64{
				OTelColExporterSendFailed:            0,
				OTelColReceiverRefused:               0,
				OTelColRemoteWriteFailedTranslations: 0,
			} {
				if got := col.TelemetrySum(t, name, nil); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
			if got := col.TelemetrySum(t, OTelColRemoteWriteTranslatedSeries, map[string]string{"exporter": "prometheus_remote_write"}); got < float64(len(series)) {
				t.Errorf("%s = %v, want at least %d", OTelColRemoteWriteTranslatedSeries, got, len(series))
			}
			if got, want := col.DeltaToCumulativeDatapoints(t), map[string]float64{"": float64(deltas)}; !maps.Equal(got, want) {
				t.Errorf("delta_to_cumulative datapoints %v, want %v", got, want)
			}
			if got := col.DeltaToCumulativeDropped(t); got != 0 {
				t.Errorf("delta_to_cumulative dropped %v, want 0", got)
			}
			maxStale := 5 * time.Minute
			if opts.DeltaToCumulativeMaxStale > 0 {
				maxStale = opts.DeltaToCumulativeMaxStale
			}
			if got := col.TelemetrySum(t, "otelcol_deltatocumulative_streams_max_stale", nil); got != maxStale.Seconds() {
				t.Errorf("delta_to_cumulative max_stale %vs, want %v", got, maxStale)
			}

			// A late delta for the first bucket, and a second delta for the
			// newest bucket (what a revision sent as a further delta with
			// the bucket's own times looks like): the processor drops both
			// as out of order, and nothing changes in Prometheus.
			bytes := series[1]
			exportMetrics(t, exp,
				monotonicSum(bytes.otlp, bytes.unit, delta, point(b0, b1, 999)),
				monotonicSum(series[2].otlp, series[2].unit, delta, point(b1, b2, 5)),
			)
			eventually(t, 10*time.Second, func() error {
				got := col.DeltaToCumulativeDatapoints(t)
				want := map[string]float64{"": float64(deltas), "delta.ErrOutOfOrder": 2}
				if !maps.Equal(got, want) {
					return fmt.Errorf("delta_to_cumulative datapoints %v, want %v", got, want)
				}
				return nil
			})
			if got := col.DeltaToCumulativeDropped(t); got != 2 {
				t.Errorf("delta_to_cumulative dropped %v, want 2", got)
			}
			if got := col.TelemetrySum(t, OTelColReceiverAccepted, nil); got != points+2 {
				t.Errorf("%s = %v, want %v", OTelColReceiverAccepted, got, points+2)
			}
			for _, s := range series[1:3] {
				if v, _ := sampleAt(t, prom, s.prom, b2); v != s.stored[1] {
					t.Errorf("%s at b2 = %v after dropped deltas, want %v", s.prom, v, s.stored[1])
				}
			}
			if got := col.TelemetrySum(t, OTelColExporterSent, nil); got != points {
				t.Errorf("%s = %v after dropped deltas, want %v (nothing more sent)", OTelColExporterSent, got, points)
			}
			if st := prom.RemoteWriteStats(t); st.Requests["204"] != 2 || len(st.Requests) != 1 {
				t.Errorf("prometheus remote-write requests %v, want 2 × 204", st.Requests)
			}
		})
	}
}

// TestPrometheusRemoteWriteRefusals shows what Prometheus 2.42 does with
// the samples a collector writes late or twice, without and with an
// out-of-order window, and that RemoteWriteStats and the collector's
// exporter counters see it.
func TestPrometheusRemoteWriteRefusals(t *testing.T) {
	t.Parallel()
	for _, window := range []time.Duration{0, 30 * time.Minute} {
		t.Run("window="+window.String(), func(t *testing.T) {
			t.Parallel()
			prom := PrometheusWith(t, PrometheusOptions{RemoteWriteReceiver: true, OutOfOrderTimeWindow: window})
			col := OTelCollector(t, OTelCollectorOptions{RemoteWriteURL: prom.RemoteWriteURL(), RemoteWriteConsumers: 1})
			exp := newOTLPExporter(t, "grpc", col)
			const hit, errs = "cdn_edge_usage_requests_cache_hit_ratio", "cdn_edge_usage_requests_error_ratio"
			g := func(name string, end time.Time, v float64) metricdata.Metrics {
				return gauge("cdn.edge_usage."+strings.TrimPrefix(name, "cdn_edge_usage_"), "1", point(end.Add(-time.Minute), end, v))
			}
			b0 := time.Now().Truncate(time.Minute).Add(-10 * time.Minute)
			b1, b2, b3 := b0.Add(time.Minute), b0.Add(2*time.Minute), b0.Add(3*time.Minute)
			failed := func() float64 {
				return col.TelemetrySum(t, OTelColExporterSendFailed, map[string]string{"exporter": "prometheus_remote_write", "error_permanent": "true"})
			}
			waitStats := func(what string, ok func(PrometheusRemoteWriteStats) bool) PrometheusRemoteWriteStats {
				t.Helper()
				var st PrometheusRemoteWriteStats
				eventually(t, 15*time.Second, func() error {
					if st = prom.RemoteWriteStats(t); !ok(st) {
						return fmt.Errorf("%s: prometheus remote-write stats %+v", what, st)
					}
					return nil
				})
				return st
			}

			exportMetrics(t, exp, g(hit, b2, 0.5), g(errs, b2, 0.1))
			waitSample(t, prom, errs, b2, 0.1)

			// The same sample again (a retry) is accepted.
			exportMetrics(t, exp, g(hit, b2, 0.5))
			waitStats("repeated sample", func(st PrometheusRemoteWriteStats) bool { return st.Requests["204"] == 2 })

			// Another value at the same timestamp (a revised gauge bucket) is
			// refused with 400, with or without the window; the collector
			// drops the request (a permanent error).
			exportMetrics(t, exp, g(hit, b2, 0.6))
			waitStats("duplicate timestamp", func(st PrometheusRemoteWriteStats) bool { return st.Requests["400"] == 1 })
			eventually(t, 10*time.Second, func() error {
				if got := failed(); got != 1 {
					return fmt.Errorf("send failed %v, want 1", got)
				}
				return nil
			})
			if v, _ := sampleAt(t, prom, hit, b2); v != 0.5 {
				t.Errorf("%s at b2 = %v after a refused revision, want 0.5", hit, v)
			}
			if !strings.Contains(prom.Log(t), "duplicate sample for timestamp") {
				t.Errorf("prometheus log does not name the duplicate sample:\n%s", prom.Log(t))
			}
			if !strings.Contains(col.Log(t), "remote write request failed (http status 400)") {
				t.Errorf("collector log does not show the refused request:\n%s", col.Log(t))
			}

			// One request with a new bucket for one series and a late
			// bucket for another.
			exportMetrics(t, exp, g(hit, b3, 0.7), g(errs, b1, 0.2))
			if window == 0 {
				// Refused as out of order, and the whole request is rolled
				// back: the new bucket of the other series is lost too.
				st := waitStats("late sample", func(st PrometheusRemoteWriteStats) bool { return st.Requests["400"] == 2 })
				if st.OutOfOrder != 1 || st.OutOfOrderAppended != 0 {
					t.Errorf("stats %+v, want OutOfOrder 1", st)
				}
				eventually(t, 10*time.Second, func() error {
					if got := failed(); got != 3 {
						return fmt.Errorf("send failed %v, want 3", got)
					}
					return nil
				})
				if v, ok := sampleAt(t, prom, hit, b3); ok {
					t.Errorf("%s at b3 = %v: the refused request was partly appended", hit, v)
				}
				if _, ok := sampleAt(t, prom, errs, b1); ok {
					t.Errorf("%s at b1 was appended out of order", errs)
				}

				// Older than the head block allows (an hour before its newest
				// sample): out of bounds, also 400.
				exportMetrics(t, exp, g(errs, b2.Add(-2*time.Hour), 0.3))
				st = waitStats("out of bounds", func(st PrometheusRemoteWriteStats) bool { return st.Requests["400"] == 3 })
				if st.OutOfBounds != 1 {
					t.Errorf("stats %+v, want OutOfBounds 1", st)
				}
				return
			}
			// Within the window both are appended.
			waitSample(t, prom, hit, b3, 0.7)
			waitSample(t, prom, errs, b1, 0.2)
			st := prom.RemoteWriteStats(t)
			if st.OutOfOrderAppended != 1 || st.OutOfOrder != 0 || st.Requests["400"] != 1 {
				t.Errorf("stats %+v, want OutOfOrderAppended 1 and one 400", st)
			}
			// Older than the window: "too old", answered with 500, which the
			// collector retries.
			exportMetrics(t, exp, g(errs, b2.Add(-50*time.Minute), 0.3))
			waitStats("too old", func(st PrometheusRemoteWriteStats) bool { return st.TooOld >= 2 && st.Requests["500"] >= 2 })
		})
	}
}
