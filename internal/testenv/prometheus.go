package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
)

// ScrapeJob is one scrape_config of the generated prometheus.yml.
type ScrapeJob struct {
	// Name is the job label. Required.
	Name string
	// Targets are host:port addresses.
	Targets []string
	// MetricsPath defaults to /metrics.
	MetricsPath string
	// Scheme defaults to http. With https, certificates are not verified.
	Scheme string
	// BasicAuthUser and BasicAuthPassword, if set, are sent on every scrape.
	BasicAuthUser, BasicAuthPassword string
	// Labels are added to every series of the job's targets (as the
	// Prometheus Operator adds namespace and pod), so alert expressions
	// that select on them can be evaluated as written.
	Labels map[string]string
	// ScrapeInterval, when set, is the job's scrape interval and timeout
	// instead of PrometheusScrapeInterval (for targets too big to scrape
	// every second).
	ScrapeInterval time.Duration
}

// PrometheusServer is a Prometheus process (Debian's prometheus 2.42 in CI)
// started for one test, scraping its jobs every second, with its TSDB in
// t.TempDir() and its web API on a free loopback port.
type PrometheusServer struct {
	url  string
	dir  string
	proc *process
	api  promv1.API
}

// PrometheusScrapeInterval is the scrape and evaluation interval of the
// generated configuration.
const PrometheusScrapeInterval = time.Second

// Prometheus starts Prometheus scraping targets (host:port) under the job
// name "edgepipe", waits for /-/ready and stops it on cleanup.
func Prometheus(t testing.TB, targets ...string) *PrometheusServer {
	t.Helper()
	return PrometheusScrape(t, ScrapeJob{Name: "edgepipe", Targets: targets})
}

// PrometheusScrape starts Prometheus with the given scrape jobs, waits for
// /-/ready and stops it on cleanup.
func PrometheusScrape(t testing.TB, jobs ...ScrapeJob) *PrometheusServer {
	t.Helper()
	return PrometheusWith(t, PrometheusOptions{Jobs: jobs})
}

// PrometheusOptions configure PrometheusWith.
type PrometheusOptions struct {
	// Jobs are the scrape jobs (none: Prometheus only receives remote
	// writes, if enabled).
	Jobs []ScrapeJob
	// RemoteWriteReceiver starts Prometheus with
	// --web.enable-remote-write-receiver: it accepts remote-write requests
	// at RemoteWriteURL. Prometheus 2.42 appends a request in one
	// transaction: a sample it refuses (out of order, out of bounds, another
	// value at a timestamp it already has, or older than the out-of-order
	// window) rolls back the whole request, answered with 400 (500 for "too
	// old"). See PrometheusRemoteWriteStats.
	RemoteWriteReceiver bool
	// OutOfOrderTimeWindow sets storage.tsdb.out_of_order_time_window
	// (experimental in 2.42): a sample up to that much older than its
	// series' newest one is appended instead of refused as out of order.
	// 0 keeps Prometheus's default (no out-of-order ingestion).
	OutOfOrderTimeWindow time.Duration
	// EnableFeatures are passed as --enable-feature, e.g.
	// "native-histograms": Prometheus 2.42 then scrapes the protobuf format
	// and stores a histogram with native buckets as a native histogram only
	// (its classic buckets are not stored).
	EnableFeatures []string
}

// PrometheusWith starts Prometheus configured by opts, waits for /-/ready
// and stops it on cleanup.
func PrometheusWith(t testing.TB, opts PrometheusOptions) *PrometheusServer {
	t.Helper()
	bin := Binary(t, "prometheus")
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(prometheusConfig(opts.Jobs, opts.OutOfOrderTimeWindow)), 0o644); err != nil {
		t.Fatalf("testenv: write prometheus.yml: %v", err)
	}
	var lastErr error
	for attempt := 0; attempt < 4; attempt++ {
		addr := FreeAddr(t)
		logPath := filepath.Join(dir, "prometheus.log")
		args := []string{
			"--config.file=" + cfgPath,
			"--storage.tsdb.path=" + filepath.Join(dir, "data"),
			"--web.listen-address=" + addr,
			"--web.enable-lifecycle",
			"--log.level=info",
		}
		if opts.RemoteWriteReceiver {
			args = append(args, "--web.enable-remote-write-receiver")
		}
		if len(opts.EnableFeatures) > 0 {
			args = append(args, "--enable-feature="+strings.Join(opts.EnableFeatures, ","))
		}
		p, err := startProcess("prometheus", logPath, bin, args...)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		ps := &PrometheusServer{url: "http://" + addr, dir: dir, proc: p}
		ctx := context.Background()
		lastErr = waitFor(ctx, p, 60*time.Second, 100*time.Millisecond, ps.ready)
		if lastErr == nil {
			t.Cleanup(func() { p.stop(10 * time.Second) })
			client, err := api.NewClient(api.Config{Address: ps.url})
			if err != nil {
				t.Fatalf("testenv: prometheus API client: %v", err)
			}
			ps.api = promv1.NewAPI(client)
			return ps
		}
		p.kill()
		if !addrInUse(p.logTail(4000)) {
			break
		}
	}
	t.Fatalf("testenv: start prometheus: %v\n--- prometheus log ---\n%s", lastErr, fileTail(filepath.Join(dir, "prometheus.log"), 4000))
	return nil
}

func prometheusConfig(jobs []ScrapeJob, outOfOrderWindow time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: %s\n",
		model.Duration(PrometheusScrapeInterval), model.Duration(PrometheusScrapeInterval), model.Duration(PrometheusScrapeInterval))
	if outOfOrderWindow > 0 {
		fmt.Fprintf(&b, "storage:\n  tsdb:\n    out_of_order_time_window: %s\n", model.Duration(outOfOrderWindow))
	}
	b.WriteString("scrape_configs:\n")
	for _, j := range jobs {
		fmt.Fprintf(&b, "  - job_name: %s\n", strconv.Quote(j.Name))
		if j.ScrapeInterval > 0 {
			fmt.Fprintf(&b, "    scrape_interval: %s\n    scrape_timeout: %s\n", model.Duration(j.ScrapeInterval), model.Duration(j.ScrapeInterval))
		}
		if j.MetricsPath != "" {
			fmt.Fprintf(&b, "    metrics_path: %s\n", strconv.Quote(j.MetricsPath))
		}
		if j.Scheme != "" {
			fmt.Fprintf(&b, "    scheme: %s\n", strconv.Quote(j.Scheme))
			if j.Scheme == "https" {
				b.WriteString("    tls_config:\n      insecure_skip_verify: true\n")
			}
		}
		if j.BasicAuthUser != "" {
			fmt.Fprintf(&b, "    basic_auth:\n      username: %s\n      password: %s\n", strconv.Quote(j.BasicAuthUser), strconv.Quote(j.BasicAuthPassword))
		}
		b.WriteString("    static_configs:\n      - targets: [")
		for i, tg := range j.Targets {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(strconv.Quote(tg))
		}
		b.WriteString("]\n")
		if len(j.Labels) > 0 {
			b.WriteString("        labels:\n")
			names := make([]string, 0, len(j.Labels))
			for k := range j.Labels {
				names = append(names, k)
			}
			sort.Strings(names)
			for _, k := range names {
				fmt.Fprintf(&b, "          %s: %s\n", k, strconv.Quote(j.Labels[k]))
			}
		}
	}
	return b.String()
}

func (p *PrometheusServer) ready(ctx context.Context) error {
	return getOK(ctx, p.url+"/-/ready")
}

// API returns a client_golang API client for the server.
func (p *PrometheusServer) API() promv1.API { return p.api }

// Query evaluates an instant PromQL query at the current time through
// /api/v1/query.
func (p *PrometheusServer) Query(ctx context.Context, promql string) (model.Value, error) {
	v, _, _, err := p.api.Query(ctx, promql, time.Now())
	if err != nil {
		return nil, fmt.Errorf("prometheus query %q: %w", promql, err)
	}
	return v, nil
}

// QueryVector evaluates promql at the current time and returns its instant
// vector (empty when nothing matches). It fails the test on error or when
// the result is not a vector.
func (p *PrometheusServer) QueryVector(t testing.TB, promql string) model.Vector {
	t.Helper()
	return p.QueryVectorAt(t, promql, time.Now())
}

// QueryVectorAt is QueryVector evaluated at ts, e.g. for samples written
// with past timestamps (an instant query sees samples up to 5 minutes old).
func (p *PrometheusServer) QueryVectorAt(t testing.TB, promql string, ts time.Time) model.Vector {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, _, _, err := p.api.Query(ctx, promql, ts)
	if err != nil {
		t.Fatalf("testenv: prometheus query %q: %v", promql, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		t.Fatalf("testenv: prometheus query %q: got %s, want a vector", promql, v.Type())
	}
	return vec
}

// WaitTargetsUp waits until every active target has been scraped
// successfully (health "up") and fails the test after timeout with each
// target's last error.
func (p *PrometheusServer) WaitTargetsUp(t testing.TB, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	for {
		res, err := p.api.Targets(ctx)
		if err == nil {
			up := len(res.Active) > 0
			var states []string
			for _, at := range res.Active {
				if at.Health != promv1.HealthGood {
					up = false
				}
				states = append(states, fmt.Sprintf("%s=%s %s", at.ScrapeURL, at.Health, at.LastError))
			}
			if up {
				return
			}
			last = strings.Join(states, "; ")
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: prometheus targets not up after %s: %s", timeout, last)
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Promtool returns the path of promtool (Debian's prometheus package).
// Missing: skip, or fail with CI=true.
func Promtool(t testing.TB) string {
	t.Helper()
	return Binary(t, "promtool")
}

// CheckMetrics runs `promtool check metrics` on a text exposition and fails
// the test with promtool's output if it reports any problem (lint findings
// such as a counter without _total, a missing HELP, or a parse error).
func CheckMetrics(t testing.TB, exposition []byte) {
	t.Helper()
	out, err := PromtoolCheckMetrics(Promtool(t), exposition)
	if err != nil {
		t.Fatalf("testenv: promtool check metrics: %v\n%s", err, out)
	}
}

// PromtoolCheckMetrics runs `<promtool> check metrics` with exposition on
// stdin and returns its combined output and an error when promtool exits
// non-zero or prints anything (it prints nothing for a clean exposition).
func PromtoolCheckMetrics(promtool string, exposition []byte) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(exposition)
	out, err := cmd.CombinedOutput()
	text := strings.TrimSpace(string(out))
	switch {
	case err != nil:
		return text, fmt.Errorf("promtool: %w", err)
	case text != "":
		return text, errors.New("promtool reported problems")
	}
	return "", nil
}

// RemoteWriteURL is the server's remote-write endpoint (/api/v1/write),
// served when it was started with PrometheusOptions.RemoteWriteReceiver.
func (p *PrometheusServer) RemoteWriteURL() string { return p.url + "/api/v1/write" }

// MetricsURL is the server's own /metrics endpoint.
func (p *PrometheusServer) MetricsURL() string { return p.url + "/metrics" }

// SelfMetrics scrapes Prometheus's own metrics and fails the test if it
// cannot.
func (p *PrometheusServer) SelfMetrics(t testing.TB) map[string]*dto.MetricFamily {
	t.Helper()
	return scrapeT(t, p.MetricsURL())
}

// PrometheusRemoteWriteStats are Prometheus's own counters about
// remote-write requests and the samples its TSDB appended or refused, with
// their Prometheus 2.42 names. Prometheus 2.42 appends a remote-write
// request in one transaction: one refused sample rolls back the whole
// request.
type PrometheusRemoteWriteStats struct {
	// Requests counts /api/v1/write requests by HTTP status code
	// (prometheus_http_requests_total{handler="/api/v1/write"}): "204"
	// appended; "400" refused for an out-of-order sample, a sample out of
	// the head block's bounds, or a second sample with the same timestamp
	// and another value (the sender drops the request); "500" for a sample
	// older than the out-of-order window (the sender retries it).
	Requests map[string]float64
	// Appended counts float samples committed, by scrapes too
	// (prometheus_tsdb_head_samples_appended_total{type="float"}).
	Appended float64
	// OutOfOrderAppended counts samples accepted through the out-of-order
	// window (prometheus_tsdb_head_out_of_order_samples_appended_total).
	OutOfOrderAppended float64
	// OutOfOrder, OutOfBounds and TooOld count refused float samples
	// (prometheus_tsdb_out_of_order_samples_total,
	// prometheus_tsdb_out_of_bound_samples_total,
	// prometheus_tsdb_too_old_samples_total, each {type="float"}). A
	// refused duplicate timestamp has no counter of its own: it shows as a
	// "400" request and a log line "duplicate sample for timestamp".
	OutOfOrder, OutOfBounds, TooOld float64
}

// RemoteWriteStats scrapes the server's own metrics into a
// PrometheusRemoteWriteStats, failing the test if it cannot.
func (p *PrometheusServer) RemoteWriteStats(t testing.TB) PrometheusRemoteWriteStats {
	t.Helper()
	mfs := p.SelfMetrics(t)
	float := map[string]string{"type": "float"}
	return PrometheusRemoteWriteStats{
		Requests:           SamplesByLabel(mfs, "prometheus_http_requests_total", "code", map[string]string{"handler": "/api/v1/write"}),
		Appended:           SampleSum(mfs, "prometheus_tsdb_head_samples_appended_total", float),
		OutOfOrderAppended: SampleSum(mfs, "prometheus_tsdb_head_out_of_order_samples_appended_total", nil),
		OutOfOrder:         SampleSum(mfs, "prometheus_tsdb_out_of_order_samples_total", float),
		OutOfBounds:        SampleSum(mfs, "prometheus_tsdb_out_of_bound_samples_total", float),
		TooOld:             SampleSum(mfs, "prometheus_tsdb_too_old_samples_total", float),
	}
}

// Log returns Prometheus's log so far.
func (p *PrometheusServer) Log(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(p.proc.logPath)
	if err != nil {
		t.Fatalf("testenv: read prometheus log: %v", err)
	}
	return string(b)
}

// RawSamples evaluates the range selector selector[lookback] at the current
// time and returns the stored samples of every matching series, with their
// own timestamps (an instant query would also return a sample older than
// the time asked for, up to 5 minutes).
func (p *PrometheusServer) RawSamples(t testing.TB, selector string, lookback time.Duration) model.Matrix {
	t.Helper()
	return p.RawSamplesAt(t, selector, lookback, time.Now())
}

// RawSamplesAt is RawSamples evaluated at ts: the samples in
// [ts − lookback, ts], e.g. of data written with simulated timestamps.
func (p *PrometheusServer) RawSamplesAt(t testing.TB, selector string, lookback time.Duration, ts time.Time) model.Matrix {
	t.Helper()
	promql := selector + "[" + model.Duration(lookback).String() + "]"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, _, _, err := p.api.Query(ctx, promql, ts)
	if err != nil {
		t.Fatalf("testenv: prometheus query %q: %v", promql, err)
	}
	m, ok := v.(model.Matrix)
	if !ok {
		t.Fatalf("testenv: prometheus query %q: got %s, want a matrix", promql, v.Type())
	}
	return m
}
