package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
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
	bin := Binary(t, "prometheus")
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(prometheusConfig(jobs)), 0o644); err != nil {
		t.Fatalf("testenv: write prometheus.yml: %v", err)
	}
	var lastErr error
	for attempt := 0; attempt < 4; attempt++ {
		addr := FreeAddr(t)
		logPath := filepath.Join(dir, "prometheus.log")
		p, err := startProcess("prometheus", logPath, bin,
			"--config.file="+cfgPath,
			"--storage.tsdb.path="+filepath.Join(dir, "data"),
			"--web.listen-address="+addr,
			"--web.enable-lifecycle",
			"--log.level=info",
		)
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

func prometheusConfig(jobs []ScrapeJob) string {
	var b strings.Builder
	fmt.Fprintf(&b, "global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: %s\nscrape_configs:\n",
		model.Duration(PrometheusScrapeInterval), model.Duration(PrometheusScrapeInterval), model.Duration(PrometheusScrapeInterval))
	for _, j := range jobs {
		fmt.Fprintf(&b, "  - job_name: %s\n", strconv.Quote(j.Name))
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/-/ready", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/-/ready: %s", resp.Status)
	}
	return nil
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

// QueryVector evaluates promql and returns its instant vector (empty when
// nothing matches). It fails the test on error or when the result is not a
// vector.
func (p *PrometheusServer) QueryVector(t testing.TB, promql string) model.Vector {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := p.Query(ctx, promql)
	if err != nil {
		t.Fatalf("testenv: %v", err)
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
