package deploytest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// demoRun is one `make demo` started by a test.
type demoRun struct {
	cmd    *exec.Cmd
	out    string // the file holding its stdout and stderr
	exited chan struct{}
	err    error // Wait's result, valid once exited is closed
	addrs  map[string]string
}

// startDemo runs `make demo` in the repository root as a user would, with
// every address on a free loopback port, DEMO_DIR and BIN in temporary
// directories, and env added; it returns once the demo printed that it is
// running. The demo runs in its own process group, which is killed when the
// test ends in case the demo failed to stop what it started.
func startDemo(t *testing.T, env ...string) *demoRun {
	t.Helper()
	mk := testenv.Binary(t, "make")
	dir := t.TempDir()
	d := &demoRun{out: filepath.Join(dir, "demo.out"), exited: make(chan struct{}), addrs: map[string]string{}}
	for _, name := range []string{"SIM_ADDR", "EXPORTER_ADDR", "RECEIVER_ADDR", "PROMETHEUS_ADDR"} {
		d.addrs[name] = testenv.FreeAddr(t)
		env = append(env, name+"="+d.addrs[name])
	}
	out, err := os.Create(d.out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	d.cmd = exec.Command(mk, "--no-print-directory", "-C", "../..", "demo", "BIN="+filepath.Join(dir, "bin"))
	d.cmd.Env = append(os.Environ(), append(env, "DEMO_DIR="+filepath.Join(dir, "demo"))...)
	d.cmd.Stdout, d.cmd.Stderr = out, out
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("make demo: %v", err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		// Whatever is left of the process group (nothing, when the demo
		// stopped its programs as it must).
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.exited
		if t.Failed() {
			t.Logf("--- make demo output ---\n%s", d.output(t))
			for _, log := range []string{"platform-sim", "exporter", "rtld-receiver", "prometheus"} {
				if b, err := os.ReadFile(filepath.Join(dir, "demo", log+".log")); err == nil {
					if len(b) > 3000 {
						b = b[len(b)-3000:]
					}
					t.Logf("--- %s.log (tail) ---\n%s", log, b)
				}
			}
		}
	})
	// The build comes first: minutes on a cold cache.
	deadline := time.After(5 * time.Minute)
	for !strings.Contains(d.output(t), "Press Ctrl-C to stop.") {
		select {
		case <-d.exited:
			t.Fatalf("make demo ended before it was running: %v", d.err)
		case <-deadline:
			t.Fatal("make demo not running after 5 minutes")
		case <-time.After(200 * time.Millisecond):
		}
	}
	return d
}

func (d *demoRun) output(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(d.out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// pids returns the programs the demo says it started, by name.
func (d *demoRun) pids(t *testing.T) map[string]int {
	t.Helper()
	pids := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^demo: started (\S+) \(pid (\d+),`).FindAllStringSubmatch(d.output(t), -1) {
		pid, _ := strconv.Atoi(m[2])
		pids[m[1]] = pid
	}
	return pids
}

// stop stops the demo, with SIGINT to its whole process group as Ctrl-C in
// a terminal does (ctrlC), or with SIGTERM to make alone, which make passes
// on to the script (so only the script can stop the programs), and checks
// every program the demo started has ended and every address is free.
func (d *demoRun) stop(t *testing.T, ctrlC bool) {
	t.Helper()
	pids := d.pids(t)
	var err error
	if ctrlC {
		err = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGINT)
	} else {
		err = d.cmd.Process.Signal(syscall.SIGTERM)
	}
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("make demo still running 30 s after it was told to stop")
	}
	if !strings.Contains(d.output(t), "demo: stopped") {
		t.Error("the demo did not report stopping its programs")
	}
	for name, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) still exists after the demo stopped (kill -0: %v)", name, pid, err)
		}
	}
	for name, addr := range d.addrs {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s %s still accepts connections after the demo stopped", name, addr)
		}
	}
}

// TestMakeDemo runs `make demo` with Prometheus and helm installed, checks
// the Prometheus it prints has both programs' targets up (the receiver's
// over TLS, verified against the demo's certificate) and exactly the
// chart's alerts loaded and evaluating, that the chart's alert selectors
// match the demo's targets, that the four queries it prints return data
// and that the binaries carry `make version`'s stamp; then stops it and
// checks nothing it started is left. A second run without Prometheus shows
// the demo still needs nothing but Go.
func TestMakeDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the demo")
	}
	prometheus := testenv.Binary(t, "prometheus")
	helmBin := helmBinary(t)

	t.Run("with prometheus", func(t *testing.T) {
		d := startDemo(t, "PROMETHEUS_BIN="+prometheus, "HELM_BIN="+helmBin)
		out := d.output(t)
		if got := d.pids(t); len(got) != 4 {
			t.Errorf("started %v, want platform-sim, exporter, rtld-receiver and prometheus", got)
		}
		promURL := "http://" + d.addrs["PROMETHEUS_ADDR"]
		if !regexp.MustCompile(`(?m)^  prometheus +` + regexp.QuoteMeta(promURL) + ` `).MatchString(out) {
			t.Errorf("the demo does not print Prometheus's URL %s", promURL)
		}
		client, err := api.NewClient(api.Config{Address: promURL})
		if err != nil {
			t.Fatal(err)
		}
		prom := promv1.NewAPI(client)

		// Both targets up, each scraped at the address the demo was given.
		wantTargets := []string{"http://" + d.addrs["EXPORTER_ADDR"] + "/metrics", "https://" + d.addrs["RECEIVER_ADDR"] + "/metrics"}
		waitFor(t, 90*time.Second, func(ctx context.Context) error {
			res, err := prom.Targets(ctx)
			if err != nil {
				return err
			}
			var up []string
			var states []string
			for _, at := range res.Active {
				states = append(states, fmt.Sprintf("%s %s %s", at.ScrapeURL, at.Health, at.LastError))
				if at.Health == promv1.HealthGood {
					up = append(up, at.ScrapeURL)
				}
			}
			slices.Sort(up)
			if len(res.Active) != 2 || !slices.Equal(up, wantTargets) {
				return fmt.Errorf("targets %v, want %v up", states, wantTargets)
			}
			return nil
		})

		// Exactly the chart's alerts, rendered for the demo's release and
		// namespace, evaluating without error.
		chartRules := demoChartAlerts(t)
		waitFor(t, 60*time.Second, func(ctx context.Context) error {
			res, err := prom.Rules(ctx, nil)
			if err != nil {
				return err
			}
			got := map[string]promv1.AlertingRule{}
			for _, g := range res.Groups {
				for _, r := range g.Rules {
					ar, ok := r.(promv1.AlertingRule)
					if !ok {
						return fmt.Errorf("group %s: unexpected rule %T", g.Name, r)
					}
					got[ar.Name] = ar
				}
			}
			if len(got) != len(chartRules) {
				return fmt.Errorf("%d alerts loaded, the chart has %d", len(got), len(chartRules))
			}
			for name, want := range chartRules {
				ar, ok := got[name]
				switch {
				case !ok:
					return fmt.Errorf("alert %s not loaded", name)
				case ar.Health != promv1.RuleHealthGood:
					return fmt.Errorf("alert %s health %q %s", name, ar.Health, ar.LastError)
				}
				if err := want.matches(ar); err != nil {
					t.Fatalf("alert %s differs from the chart's: %v", name, err)
				}
			}
			return nil
		})

		// The chart's selectors find the demo's targets: the Down alerts'
		// up{…} selects one series, at 1. (The targets API can report a
		// target up a moment before its scrape's samples are committed, so
		// this waits too.)
		for _, name := range []string{"EdgepipeExporterDown", "EdgepipeReceiverDown"} {
			sel := regexp.MustCompile(`^(up\{[^}]*\})`).FindString(chartRules[name].expr)
			if sel == "" {
				t.Fatalf("%s: no up{…} selector in %q", name, chartRules[name].expr)
			}
			waitFor(t, 30*time.Second, func(context.Context) error {
				vec := queryVector(t, prom, sel)
				if len(vec) != 1 || vec[0].Value != 1 {
					return fmt.Errorf("%s selector %s selects %v, want one target that is up", name, sel, vec)
				}
				return nil
			})
		}

		// The queries the demo prints return data; records arrive.
		at := strings.Index(out, "Queries to try")
		if at < 0 {
			t.Fatalf("the demo prints no queries:\n%s", out)
		}
		queries := regexp.MustCompile(`(?m)^    (\S.*)$`).FindAllStringSubmatch(out[at:], -1)
		if len(queries) != 4 {
			t.Fatalf("the demo prints %d queries, want 4:\n%s", len(queries), out)
		}
		for _, q := range queries {
			waitFor(t, 90*time.Second, func(ctx context.Context) error {
				v, _, _, err := prom.Query(ctx, q[1], time.Now())
				if err != nil {
					return err
				}
				if vec, ok := v.(model.Vector); !ok || len(vec) == 0 {
					return fmt.Errorf("%s: no data yet (%v)", q[1], v)
				}
				return nil
			})
		}
		waitFor(t, 60*time.Second, func(_ context.Context) error {
			q := `sum(rate(edgepipe_rtld_records_received_total{status="accepted"}[1m])) > 0`
			if vec := queryVector(t, prom, q); len(vec) == 0 {
				return fmt.Errorf("no records accepted yet (%s)", q)
			}
			return nil
		})

		// make build's version stamp reaches the binaries.
		version, err := exec.Command(testenv.Binary(t, "make"), "-s", "--no-print-directory", "-C", "../..", "version").Output()
		if err != nil {
			t.Fatalf("make version: %v", err)
		}
		for _, q := range []string{`edgepipe_exporter_build_info{job="edgepipe-exporter"}`, `edgepipe_rtld_receiver_build_info{job="edgepipe-receiver"}`} {
			vec := queryVector(t, prom, q)
			if len(vec) != 1 || string(vec[0].Metric["version"]) != strings.TrimSpace(string(version)) {
				t.Errorf("%s: %v, want version %s", q, vec, version)
			}
		}
		d.stop(t, false)
	})

	t.Run("without prometheus", func(t *testing.T) {
		d := startDemo(t, "PROMETHEUS_BIN="+filepath.Join(t.TempDir(), "prometheus"))
		if !strings.Contains(d.output(t), "demo: prometheus not found") {
			t.Errorf("the demo does not say Prometheus was left out:\n%s", d.output(t))
		}
		if _, ok := d.pids(t)["prometheus"]; ok {
			t.Error("the demo started a prometheus it was told does not exist")
		}
		resp, err := http.Get("http://" + d.addrs["EXPORTER_ADDR"] + "/metrics")
		if err != nil {
			t.Fatalf("exporter: %v", err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("exporter /metrics: %s %v", resp.Status, err)
		}
		d.stop(t, true)
	})
}

func queryVector(t *testing.T, prom promv1.API, q string) model.Vector {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, _, _, err := prom.Query(ctx, q, time.Now())
	if err != nil {
		t.Fatalf("query %s: %v", q, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		t.Fatalf("query %s: %s, want a vector", q, v.Type())
	}
	return vec
}

// chartAlert is an alert as the chart renders it.
type chartAlert struct {
	expr                string
	forSeconds          float64
	labels, annotations map[string]string
}

// matches compares a rule as Prometheus reports it with the chart's: the
// same labels, annotations, duration and expression (Prometheus prints
// expressions in its own layout, so whitespace is ignored).
func (c chartAlert) matches(ar promv1.AlertingRule) error {
	strip := func(s string) string { return strings.Join(strings.Fields(s), "") }
	if strip(ar.Query) != strip(c.expr) {
		return fmt.Errorf("query %q, chart %q", ar.Query, c.expr)
	}
	if ar.Duration != c.forSeconds {
		return fmt.Errorf("for %vs, chart %vs", ar.Duration, c.forSeconds)
	}
	for what, pair := range map[string][2]map[string]string{
		"labels":      {labelSet(ar.Labels), c.labels},
		"annotations": {labelSet(ar.Annotations), c.annotations},
	} {
		if fmt.Sprint(pair[0]) != fmt.Sprint(pair[1]) {
			return fmt.Errorf("%s %v, chart %v", what, pair[0], pair[1])
		}
	}
	return nil
}

func labelSet(ls model.LabelSet) map[string]string {
	m := map[string]string{}
	for k, v := range ls {
		m[string(k)] = string(v)
	}
	return m
}

// demoChartAlerts renders the chart's PrometheusRule for the release and
// namespace the demo's scrape labels name (scripts/demo.sh).
func demoChartAlerts(t *testing.T) map[string]chartAlert {
	t.Helper()
	script := readFile(t, "../../scripts/demo.sh")
	release := firstMatch(t, script, `(?m)^RULES_RELEASE=(\S+)$`, "RULES_RELEASE in demo.sh")
	namespace := firstMatch(t, script, `(?m)^RULES_NAMESPACE=(\S+)$`, "RULES_NAMESPACE in demo.sh")
	out, err := helm(t, "template", release, chartDir, "--namespace", namespace,
		"--set", "metrics.prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parseManifests(out)
	if err != nil || len(objs) != 1 {
		t.Fatalf("%d objects (%v), want one PrometheusRule:\n%s", len(objs), err, out)
	}
	var pr struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert       string            `yaml:"alert"`
					Expr        string            `yaml:"expr"`
					For         string            `yaml:"for"`
					Labels      map[string]string `yaml:"labels"`
					Annotations map[string]string `yaml:"annotations"`
				} `yaml:"rules"`
			} `yaml:"groups"`
		} `yaml:"spec"`
	}
	objs[0].decode(t, &pr)
	alerts := map[string]chartAlert{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			var forSeconds float64
			if r.For != "" {
				d, err := model.ParseDuration(r.For)
				if err != nil {
					t.Fatalf("%s: for %q: %v", r.Alert, r.For, err)
				}
				forSeconds = time.Duration(d).Seconds()
			}
			if r.Labels == nil {
				r.Labels = map[string]string{}
			}
			alerts[r.Alert] = chartAlert{expr: r.Expr, forSeconds: forSeconds, labels: r.Labels, annotations: r.Annotations}
		}
	}
	if len(alerts) == 0 {
		t.Fatal("the chart renders no alerts")
	}
	return alerts
}
