package deploytest

import (
	"context"
	"encoding/json"
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
	dir    string // DEMO_DIR
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
	d := &demoRun{out: filepath.Join(dir, "demo.out"), dir: filepath.Join(dir, "demo"), exited: make(chan struct{}), addrs: map[string]string{}}
	for _, name := range []string{"SIM_ADDR", "EXPORTER_ADDR", "RECEIVER_ADDR", "PROMETHEUS_ADDR", "CLICKHOUSE_ADDR", "CLICKHOUSE_HTTP_ADDR", "KAFKA_ADDR"} {
		d.addrs[name] = testenv.FreeAddr(t)
		env = append(env, name+"="+d.addrs[name])
	}
	out, err := os.Create(d.out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	d.cmd = exec.Command(mk, "--no-print-directory", "-C", "../..", "demo", "BIN="+filepath.Join(dir, "bin"))
	d.cmd.Env = append(os.Environ(), append(env, "DEMO_DIR="+d.dir)...)
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
			for _, log := range []string{"sinks", "platform-sim", "exporter", "rtld-receiver", "prometheus"} {
				if b, err := os.ReadFile(filepath.Join(d.dir, log+".log")); err == nil {
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

// pids returns the programs the demo says it started, by name, and the
// clickhouse-server its sinks started (as "clickhouse-server").
func (d *demoRun) pids(t *testing.T) map[string]int {
	t.Helper()
	pids := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^demo: started (\S+) \(pid (\d+),`).FindAllStringSubmatch(d.output(t), -1) {
		pid, _ := strconv.Atoi(m[2])
		pids[m[1]] = pid
	}
	if b, err := os.ReadFile(filepath.Join(d.dir, "sinks.log")); err == nil {
		if m := regexp.MustCompile(`clickhouse-server \(pid (\d+)\)`).FindSubmatch(b); m != nil {
			pids["clickhouse-server"], _ = strconv.Atoi(string(m[1]))
		}
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

// TestMakeDemo runs `make demo` with Prometheus, helm and ClickHouse
// installed, checks the Prometheus it prints has both programs' targets up
// (the receiver's over TLS, verified against the demo's certificate) and
// exactly the chart's alerts loaded and evaluating, that the chart's alert
// selectors match the demo's targets, that the four queries it prints
// return data and that the binaries carry `make version`'s stamp; runs the
// three ClickHouse queries and the kcat command it prints, which must show
// access-log records in access_logs, rows in a metrics table and records on
// the topic; then stops it and checks nothing it started is left (ClickHouse
// included). A second run without Prometheus and ClickHouse shows the demo
// still needs nothing but Go.
func TestMakeDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the demo")
	}
	prometheus := testenv.Binary(t, "prometheus")
	helmBin := helmBinary(t)
	clickhouse := testenv.Binary(t, "clickhouse-server")
	clients := []string{testenv.Binary(t, "clickhouse-client"), testenv.Kcat(t)}

	t.Run("with prometheus, clickhouse and kafka", func(t *testing.T) {
		d := startDemo(t, "PROMETHEUS_BIN="+prometheus, "HELM_BIN="+helmBin, "CLICKHOUSE_BIN="+clickhouse)
		out := d.output(t)
		if got := d.pids(t); len(got) != 6 {
			t.Errorf("started %v, want sinks (and its clickhouse-server), platform-sim, exporter, rtld-receiver and prometheus", got)
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
		promSection, _, _ := strings.Cut(out[at:], "\n\n") // the ClickHouse queries follow
		queries := regexp.MustCompile(`(?m)^    (\S.*)$`).FindAllStringSubmatch(promSection, -1)
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
		checkDemoSinks(t, out, clients)
		d.stop(t, false)
	})

	t.Run("without prometheus and clickhouse", func(t *testing.T) {
		d := startDemo(t, "PROMETHEUS_BIN="+filepath.Join(t.TempDir(), "prometheus"), "CLICKHOUSE_BIN="+filepath.Join(t.TempDir(), "clickhouse-server"))
		for _, said := range []string{"demo: prometheus not found", "demo: clickhouse-server not found"} {
			if !strings.Contains(d.output(t), said) {
				t.Errorf("the demo does not say %q:\n%s", said, d.output(t))
			}
		}
		for _, name := range []string{"prometheus", "sinks", "clickhouse-server"} {
			if _, ok := d.pids(t)[name]; ok {
				t.Errorf("the demo started %s without the programs it needs", name)
			}
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

// checkDemoSinks runs the ClickHouse queries and the kcat command the demo
// printed (out), as a user would paste them into a shell with the clients
// (their paths) installed, until they show data: access-log records per
// environment in access_logs, edge requests per country from the
// exporter's edge_usage_by_country, both tables among those with rows, and
// records on the topic.
func checkDemoSinks(t *testing.T, out string, clients []string) {
	t.Helper()
	at := strings.Index(out, "\nClickHouse (database ")
	if at < 0 {
		t.Fatalf("the demo prints no ClickHouse queries:\n%s", out)
	}
	section := out[at:]
	if end := strings.Index(section, "Press Ctrl-C"); end >= 0 {
		section = section[:end]
	}
	cmds := regexp.MustCompile(`(?m)^    (\S.*)$`).FindAllStringSubmatch(section, -1)
	if len(cmds) != 4 || !strings.HasPrefix(cmds[3][1], "kcat ") {
		t.Fatalf("the demo prints %d commands, want three clickhouse-client queries and a kcat command:\n%s", len(cmds), section)
	}
	path := os.Getenv("PATH")
	for _, c := range clients {
		path = filepath.Dir(c) + string(os.PathListSeparator) + path
	}
	// run runs one printed command line in a shell and returns its output
	// as rows of tab-separated fields.
	run := func(ctx context.Context, line string) ([][]string, error) {
		cmd := exec.CommandContext(ctx, "bash", "-c", line)
		cmd.Env = append(os.Environ(), "PATH="+path)
		b, err := cmd.CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("%s: %w: %s", line, err, b)
		}
		var rows [][]string
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if l != "" {
				rows = append(rows, strings.Split(l, "\t"))
			}
		}
		return rows, nil
	}
	positive := func(s string) bool { n, err := strconv.ParseFloat(s, 64); return err == nil && n > 0 }
	checks := []func(rows [][]string) error{
		func(rows [][]string) error { // records per environment
			for _, r := range rows {
				if len(r) != 2 || !positive(r[1]) {
					return fmt.Errorf("row %q, want an environment and its records", r)
				}
			}
			if len(rows) == 0 {
				return errors.New("no access-log records in access_logs yet")
			}
			return nil
		},
		func(rows [][]string) error { // requests per country
			if len(rows) == 0 || len(rows[0]) != 2 || !positive(rows[0][1]) {
				return fmt.Errorf("rows %q, want countries and their requests", rows)
			}
			return nil
		},
		func(rows [][]string) error { // rows per table
			tables := map[string]bool{}
			for _, r := range rows {
				tables[r[0]] = len(r) == 2 && positive(r[1])
			}
			if !tables["access_logs"] || !tables["edge_usage_by_country"] {
				return fmt.Errorf("rows per table %q, want access_logs and edge_usage_by_country with rows", rows)
			}
			return nil
		},
		func(rows [][]string) error { // records on the topic
			if len(rows) == 0 {
				return errors.New("no records on the topic yet")
			}
			for _, r := range rows {
				var rec map[string]any
				if err := json.Unmarshal([]byte(strings.Join(r, "\t")), &rec); err != nil {
					return fmt.Errorf("message %q is not JSON: %w", r, err)
				}
				if rec["environment_id"] == nil {
					return fmt.Errorf("message %q is not an access-log record", r)
				}
			}
			return nil
		},
	}
	for i, c := range cmds {
		waitFor(t, 90*time.Second, func(ctx context.Context) error {
			rows, err := run(ctx, c[1])
			if err != nil {
				return err
			}
			return checks[i](rows)
		})
	}
}
