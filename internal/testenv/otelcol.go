package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"
)

// Component names of the test collector (`otelcol-edgepipe components`):
// v0.165.0 names them in snake case.
const (
	otelColDeltaToCumulative = "delta_to_cumulative"
	otelColBatch             = "batch"
	otelColRemoteWrite       = "prometheus_remote_write"
	otelColDebug             = "debug"
	otelColHealthCheck       = "health_check"
)

// Self-telemetry of the test collector (service.telemetry.metrics at level
// detailed), as TelemetryURL exposes it with the collector's default reader
// settings: no _total and no unit suffixes, no scope labels.
const (
	// OTelColDeltaToCumulativeDatapoints counts the delta points the
	// delta_to_cumulative processor handled. Those it dropped carry an
	// "error" label: "delta.ErrOutOfOrder" (a point whose time is not after
	// the stream's newest one: a late bucket, or a second delta for the same
	// bucket), "delta.ErrOlderStart" (start before the stream's start) or
	// "limit" (max_streams reached); the others have no such label.
	OTelColDeltaToCumulativeDatapoints = "otelcol_deltatocumulative_datapoints"
	// OTelColReceiverAccepted and OTelColReceiverRefused count the points
	// the otlp receiver accepted or refused (labels receiver="otlp",
	// transport="grpc" or "http").
	OTelColReceiverAccepted = "otelcol_receiver_accepted_metric_points"
	OTelColReceiverRefused  = "otelcol_receiver_refused_metric_points"
	// OTelColExporterSent and OTelColExporterSendFailed count the points an
	// exporter delivered or gave up on (label exporter="prometheus_remote_write"
	// or "debug"; failures also carry error_permanent="true"/"false" and
	// error_type). Prometheus answering 4xx is a permanent failure: the
	// request's points are dropped at once; 5xx is retried (retry_on_failure,
	// up to 5 minutes) before it counts.
	OTelColExporterSent       = "otelcol_exporter_sent_metric_points"
	OTelColExporterSendFailed = "otelcol_exporter_send_failed_metric_points"
	// OTelColRemoteWriteTranslatedSeries and
	// OTelColRemoteWriteFailedTranslations are the prometheus_remote_write
	// exporter's counters of series translated from OTLP and of translation
	// failures.
	OTelColRemoteWriteTranslatedSeries   = "otelcol_exporter_prometheusremotewrite_translated_time_series"
	OTelColRemoteWriteFailedTranslations = "otelcol_exporter_prometheusremotewrite_failed_translations"
)

// OTelCollectorOptions choose the metrics pipeline of OTelCollector:
// otlp receiver → [delta_to_cumulative] → [batch] → exporters.
type OTelCollectorOptions struct {
	// DeltaToCumulative adds the delta_to_cumulative processor, which turns
	// delta Sums into cumulative ones (the prometheus_remote_write exporter
	// writes no delta Sums).
	DeltaToCumulative bool
	// DeltaToCumulativeMaxStale is the processor's max_stale (how long a
	// stream without points is kept); 0 keeps its default (5m).
	DeltaToCumulativeMaxStale time.Duration
	// Batch adds the batch processor (default settings: up to 200ms delay).
	Batch bool
	// RemoteWriteURL, if set, adds the prometheus_remote_write exporter
	// sending to it (e.g. PrometheusServer.RemoteWriteURL).
	RemoteWriteURL string
	// RemoteWriteTranslationStrategy is the exporter's translation_strategy
	// ("UnderscoreEscapingWithSuffixes", "UnderscoreEscapingWithoutSuffixes",
	// "NoUTF8EscapingWithSuffixes", "NoTranslation"); empty keeps the
	// exporter's default (add_metric_suffixes: true, i.e. escaping with
	// suffixes).
	RemoteWriteTranslationStrategy string
	// RemoteWriteConsumers is the exporter's remote_write_queue.num_consumers;
	// 0 keeps its default (5). With more than one, the requests of
	// exports that follow each other closely are sent concurrently and may
	// reach Prometheus out of order, which it refuses (see
	// PrometheusOptions.RemoteWriteReceiver).
	RemoteWriteConsumers int
	// Debug adds the debug exporter at detailed verbosity: every point
	// received is written to the collector's log. It is also the exporter
	// when RemoteWriteURL is empty.
	Debug bool
}

// OTelCollectorProcess is an OpenTelemetry Collector process (the build of
// testdata/otelcol-builder.yaml, see OTelCollectorBinary) started for one
// test, with the otlp receiver on free loopback gRPC and HTTP ports and its
// own metrics at level detailed on a free loopback port.
type OTelCollectorProcess struct {
	grpcAddr, httpAddr string
	telemetryURL       string
	healthURL          string
	logPath            string
	proc               *process
}

// OTelCollector starts the test collector with the pipeline opts
// describes, waits until its health check and its telemetry endpoint answer,
// and stops it on cleanup. When the test fails, the end of the collector's log
// is written to the test log. A collector that cannot be built skips the
// test, or fails it when CI=true.
func OTelCollector(t testing.TB, opts OTelCollectorOptions) *OTelCollectorProcess {
	t.Helper()
	bin := OTelCollectorBinary(t)
	dir := t.TempDir()
	logPath := filepath.Join(dir, "otelcol.log")
	cfgPath := filepath.Join(dir, "otelcol.yaml")
	var lastErr error
	for attempt := 0; attempt < 4; attempt++ {
		ports, err := freePorts(4)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		c := &OTelCollectorProcess{
			grpcAddr:     loopback(ports[0]),
			httpAddr:     loopback(ports[1]),
			telemetryURL: "http://" + loopback(ports[2]) + "/metrics",
			healthURL:    "http://" + loopback(ports[3]) + "/",
			logPath:      logPath,
		}
		cfg, err := otelCollectorConfig(opts, ports)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
			t.Fatalf("testenv: write collector config: %v", err)
		}
		c.proc, err = startProcess("otelcol", logPath, bin, "--config=file:"+cfgPath)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		lastErr = waitFor(context.Background(), c.proc, 60*time.Second, 100*time.Millisecond, c.ready)
		if lastErr == nil {
			t.Cleanup(func() {
				c.proc.stop(10 * time.Second)
				if t.Failed() {
					t.Logf("--- otelcol log (%s) ---\n%s", logPath, fileTail(logPath, 8000))
				}
			})
			return c
		}
		c.proc.kill()
		if !addrInUse(c.proc.logTail(4000)) {
			break
		}
	}
	t.Fatalf("testenv: start otelcol: %v\n--- otelcol config ---\n%s\n--- otelcol log ---\n%s", lastErr, fileTail(cfgPath, 4000), fileTail(logPath, 6000))
	return nil
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// freePorts returns n distinct ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	seen := map[int]bool{}
	for len(ports) < n {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		if !seen[p] {
			seen[p] = true
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// otelCollectorConfig renders the collector configuration; ports are the
// OTLP gRPC, OTLP HTTP, telemetry and health check ports.
func otelCollectorConfig(opts OTelCollectorOptions, ports []int) ([]byte, error) {
	processors := map[string]any{}
	var pipelineProcessors []string
	if opts.DeltaToCumulative {
		d2c := map[string]any{}
		if opts.DeltaToCumulativeMaxStale > 0 {
			d2c["max_stale"] = opts.DeltaToCumulativeMaxStale.String()
		}
		processors[otelColDeltaToCumulative] = d2c
		pipelineProcessors = append(pipelineProcessors, otelColDeltaToCumulative)
	}
	if opts.Batch {
		processors[otelColBatch] = map[string]any{}
		pipelineProcessors = append(pipelineProcessors, otelColBatch)
	}
	exporters := map[string]any{}
	var pipelineExporters []string
	if opts.RemoteWriteURL != "" {
		rw := map[string]any{"endpoint": opts.RemoteWriteURL}
		if opts.RemoteWriteTranslationStrategy != "" {
			rw["translation_strategy"] = opts.RemoteWriteTranslationStrategy
		}
		if opts.RemoteWriteConsumers > 0 {
			rw["remote_write_queue"] = map[string]any{"num_consumers": opts.RemoteWriteConsumers}
		}
		exporters[otelColRemoteWrite] = rw
		pipelineExporters = append(pipelineExporters, otelColRemoteWrite)
	}
	if opts.Debug || opts.RemoteWriteURL == "" {
		exporters[otelColDebug] = map[string]any{"verbosity": "detailed"}
		pipelineExporters = append(pipelineExporters, otelColDebug)
	}
	metricsPipeline := map[string]any{"receivers": []string{"otlp"}, "exporters": pipelineExporters}
	if len(pipelineProcessors) > 0 {
		metricsPipeline["processors"] = pipelineProcessors
	}
	cfg := map[string]any{
		"receivers": map[string]any{
			"otlp": map[string]any{"protocols": map[string]any{
				"grpc": map[string]any{"endpoint": loopback(ports[0])},
				"http": map[string]any{"endpoint": loopback(ports[1])},
			}},
		},
		"exporters":  exporters,
		"extensions": map[string]any{otelColHealthCheck: map[string]any{"endpoint": loopback(ports[3])}},
		"service": map[string]any{
			"extensions": []string{otelColHealthCheck},
			"pipelines":  map[string]any{"metrics": metricsPipeline},
			"telemetry": map[string]any{
				"logs": map[string]any{"level": "info", "sampling": map[string]any{"enabled": false}},
				"metrics": map[string]any{
					"level": "detailed",
					// The collector's default reader, on another port.
					"readers": []any{map[string]any{"pull": map[string]any{"exporter": map[string]any{
						"prometheus": map[string]any{
							"host": "127.0.0.1", "port": ports[2],
							"without_scope_info": true, "without_units": true, "without_type_suffix": true,
						},
					}}}},
				},
			},
		},
	}
	if len(processors) > 0 {
		cfg["processors"] = processors
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("render collector config: %w", err)
	}
	return b, nil
}

func (c *OTelCollectorProcess) ready(ctx context.Context) error {
	for _, u := range []string{c.healthURL, c.telemetryURL} {
		if err := getOK(ctx, u); err != nil {
			return err
		}
	}
	return nil
}

// GRPCAddr is the host:port of the OTLP/gRPC receiver (plaintext), e.g. for
// otlpmetricgrpc.WithEndpoint with WithInsecure.
func (c *OTelCollectorProcess) GRPCAddr() string { return c.grpcAddr }

// HTTPAddr is the host:port of the OTLP/HTTP receiver (plaintext, metrics
// at /v1/metrics), e.g. for otlpmetrichttp.WithEndpoint with WithInsecure.
func (c *OTelCollectorProcess) HTTPAddr() string { return c.httpAddr }

// TelemetryURL is the collector's own /metrics endpoint.
func (c *OTelCollectorProcess) TelemetryURL() string { return c.telemetryURL }

// Log returns the collector's log so far (stdout and stderr).
func (c *OTelCollectorProcess) Log(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		t.Fatalf("testenv: read otelcol log: %v", err)
	}
	return string(b)
}

// Telemetry scrapes the collector's own metrics (see the OTelCol* names)
// and fails the test if it cannot.
func (c *OTelCollectorProcess) Telemetry(t testing.TB) map[string]*dto.MetricFamily {
	t.Helper()
	return scrapeT(t, c.telemetryURL)
}

// TelemetrySum scrapes the collector's own metrics and returns the sum of
// the samples of name whose labels include labels (0 if none).
func (c *OTelCollectorProcess) TelemetrySum(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	return SampleSum(c.Telemetry(t), name, labels)
}

// DeltaToCumulativeDatapoints scrapes OTelColDeltaToCumulativeDatapoints and
// returns the points by their "error" label: key "" holds the points turned
// into cumulative ones, every other key a cause of dropped points (e.g.
// "delta.ErrOutOfOrder").
func (c *OTelCollectorProcess) DeltaToCumulativeDatapoints(t testing.TB) map[string]float64 {
	t.Helper()
	return SamplesByLabel(c.Telemetry(t), OTelColDeltaToCumulativeDatapoints, "error", nil)
}

// DeltaToCumulativeDropped is the number of delta points the processor has
// dropped so far, for any cause.
func (c *OTelCollectorProcess) DeltaToCumulativeDropped(t testing.TB) float64 {
	t.Helper()
	var n float64
	for cause, v := range c.DeltaToCumulativeDatapoints(t) {
		if cause != "" {
			n += v
		}
	}
	return n
}
