package deploytest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/edgepipe/edgepipe/internal/sinks/otel/otlptest"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// leanConfig is the example config of a large organization: most
// dimensions aggregated away by the API.
const leanConfig = "../../examples/lean.yaml"

// staleRetries is how often TestDashboardsEndToEnd runs a query again that
// returned no data, two scrape intervals later each time: a scrape that timed
// out on a loaded machine leaves the target's series stale until the next
// good one.
const staleRetries = 10

// TestDashboardsEndToEnd runs every query of every dashboard against the
// real pipeline: `exporter --simulate` and `rtld-receiver --simulate` (built
// from this tree) scraped by a real Prometheus, the receiver writing into a
// real ClickHouse. Variables are resolved the way Grafana resolves them, by
// running the variables' own queries; every target then runs twice, with
// every variable on "All" and with each variable on its busiest value, and
// must succeed and return data. It does so twice: with the exporter's
// default selection, and with the lean example config (examples/lean.yaml),
// where panels by a dimension that config aggregates away show the total.
func TestDashboardsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole pipeline")
	}
	bins := buildCommands(t, "exporter", "rtld-receiver")
	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)

	receiverAddr := testenv.FreeAddr(t)
	startProgram(t, bins["rtld-receiver"],
		"--simulate",
		"--web.listen-address="+receiverAddr,
		"--spool.dir="+filepath.Join(t.TempDir(), "spool"),
		"--clickhouse.dsn="+ch.DSN(db),
	)
	// One exporter (and one Prometheus) per selection. Each writes to
	// ClickHouse and OTLP too, so the dashboards' sink panels have data.
	lean, err := filepath.Abs(leanConfig) // the programs run in a directory of their own
	if err != nil {
		t.Fatal(err)
	}
	type pipeline struct {
		name string
		prom *testenv.PrometheusServer
	}
	var pipelines []pipeline
	for i, sel := range []struct {
		name string
		args []string
	}{{"default selection", nil}, {"lean config", []string{"--config.file=" + lean}}} {
		_, otlpAddr := otlptest.StartGRPC(t)
		exporterAddr := testenv.FreeAddr(t)
		// The first exporter shares the receiver's database, as the
		// chart's one DSN does: the access logs dashboard names
		// environments from its environments table.
		chDB := db
		if i > 0 {
			chDB = ch.NewDatabase(t)
		}
		startProgram(t, bins["exporter"], append([]string{
			"--simulate",
			"--web.listen-address=" + exporterAddr,
			"--clickhouse.dsn=" + ch.DSN(chDB),
			"--otlp.endpoint=http://" + otlpAddr,
			// As the chart runs it: a first start counts its first poll, so
			// counters and OTLP sums have data at once.
			"--state.dir=" + filepath.Join(t.TempDir(), "state"),
			// Poll often: the simulator's counts grow between polls (late
			// data), so counters move and rates are non-zero within seconds.
			"--poll-interval=2s",
			"--poll.jitter=0s",
		}, sel.args...)...)
		prom := testenv.PrometheusScrape(t,
			testenv.ScrapeJob{Name: "edgepipe-exporter", Targets: []string{exporterAddr}},
			testenv.ScrapeJob{Name: "edgepipe-receiver", Targets: []string{receiverAddr}},
		)
		pipelines = append(pipelines, pipeline{sel.name, prom})
	}
	for _, p := range pipelines {
		p.prom.WaitTargetsUp(t, 90*time.Second)
	}

	opts, err := clickhouse.ParseDSN(ch.DSN(db))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// Data flowing: exporter series, receiver records in ClickHouse, and a
	// few scrapes after both so rates have two samples.
	started := time.Now()
	waitFor(t, 3*time.Minute, func(ctx context.Context) error {
		for _, p := range pipelines {
			for _, q := range []string{
				`count(cdn_edge_usage_by_country_requests_edge_total) > 0`,
				`count(cdn_origin_errors_requests_origin_total) > 0`,
				`sum(edgepipe_rtld_records_received_total{status="accepted"}) > 0`,
				`sum(edgepipe_clickhouse_rows_written_total) > 0`,
				`sum(edgepipe_otlp_exported_points_total) > 0`,
				`count(cdn_tls_certificate_expiry_timestamp_seconds) > 0`,
			} {
				v, err := p.prom.Query(ctx, q)
				if err != nil {
					return err
				}
				if vec, ok := v.(model.Vector); !ok || len(vec) == 0 {
					return fmt.Errorf("%s: no data yet for %s", p.name, q)
				}
			}
		}
		for _, table := range []string{"access_logs", "environments"} {
			n, err := countRows(conn, "SELECT 1 FROM "+table+" LIMIT 1")
			if err != nil {
				return fmt.Errorf("%s: %w", table, err)
			}
			if n == 0 {
				return errors.New(table + " empty yet")
			}
		}
		return nil
	})
	t.Logf("pipeline data in Prometheus and ClickHouse after %s", time.Since(started).Round(time.Second))
	time.Sleep(10 * testenv.PrometheusScrapeInterval)
	// The lean config really aggregates: no country label on edge usage.
	if v, err := pipelines[1].prom.Query(context.Background(), `count(cdn_edge_usage_by_country_requests_edge_total{country_code!=""})`); err != nil {
		t.Fatal(err)
	} else if vec, _ := v.(model.Vector); len(vec) > 0 {
		t.Fatalf("the lean exporter still exports country_code: %v", vec)
	}

	ds := loadDashboards(t)
	now := time.Now()
	base := Values{
		From: now.Add(-10 * time.Minute), To: now,
		// What Grafana computes for a 10-minute range on a ~1000 px panel
		// with the panels' 5m minimum interval; $__rate_interval is
		// max($__interval + scrape interval, 4 × scrape interval).
		Interval:     time.Minute,
		RateInterval: 5 * time.Minute,
		Vars:         map[string][]string{},
		All:          map[string]bool{},
	}
	for _, p := range pipelines {
		for _, d := range ds {
			if d.File == LogDeliveryDashboard {
				// Its reconciliation panels need FIVE_MINUTES buckets that
				// settled: it runs against a simulated hour in
				// internal/rtld/receiver (TestReconcileTenEnvironments).
				continue
			}
			t.Run(p.name+"/"+d.File, func(t *testing.T) {
				all, one := resolveVariables(t, d, base, p.prom, conn)
				qs, err := d.Queries()
				if err != nil {
					t.Fatal(err)
				}
				ran := 0
				defer func() { t.Logf("%d queries run and returned data", ran) }()
				for _, q := range qs {
					if q.Variable {
						continue // ran while resolving
					}
					for _, sel := range []struct {
						name string
						v    Values
					}{{"all", all}, {"one value", one}} {
						v := sel.v
						text, err := Expand(d, q, v)
						if err != nil {
							t.Errorf("%s: %v", q.Where, err)
							continue
						}
						var n int
						var unnamed string
						for try := 0; ; try++ {
							switch q.Language {
							case PromQL:
								n, unnamed, err = runPromQL(p.prom.API(), text, q, v)
							case ClickHouseSQL:
								n, unnamed, err = countNamedRows(conn, text)
							}
							if (err == nil && n > 0) || try == staleRetries {
								break
							}
							// Ask again at a later time: a query evaluated where
							// a scrape failed finds stale series however often
							// it runs.
							time.Sleep(2 * testenv.PrometheusScrapeInterval)
							shift := time.Since(v.To)
							v.From, v.To = v.From.Add(shift), v.To.Add(shift)
							if text, err = Expand(d, q, v); err != nil {
								break
							}
						}
						switch {
						case err != nil:
							t.Errorf("%s (%s): %v\n%s", q.Where, sel.name, err, text)
						case n == 0:
							t.Errorf("%s (%s): no data\n%s", q.Where, sel.name, text)
						case unnamed != "":
							t.Errorf("%s (%s): environments not named: %s\n%s", q.Where, sel.name, unnamed, text)
						default:
							ran++
						}
					}
				}
			})
		}
	}
}

// resolveVariables runs the dashboard's query variables in order, the way
// Grafana does: a variable's query sees the values chosen for the variables
// before it. It returns two selections: every variable on All, and every
// variable on one value (the busiest one: the largest sum of the variable's
// metric, so the selection shows traffic). A variable whose query finds no
// value (its label aggregated away by the exporter's config) offers only
// All, as in Grafana, and is on All in both.
func resolveVariables(t *testing.T, d Dashboard, base Values, prom *testenv.PrometheusServer, conn driver.Conn) (all, one Values) {
	t.Helper()
	all, one = base, base
	all.Vars, all.All = map[string][]string{}, map[string]bool{}
	one.Vars, one.All = map[string][]string{}, map[string]bool{}
	qs, err := d.Queries()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if !q.Variable {
			continue
		}
		name := strings.TrimPrefix(q.Where, "variable ")
		variable, _ := d.Variable(name)
		for _, sel := range []struct {
			v   *Values
			all bool
		}{{&all, true}, {&one, false}} {
			text, err := Expand(d, q, *sel.v)
			if err != nil {
				t.Fatalf("%s: %v", q.Where, err)
			}
			var vals []string
			_, isQueryResult := QueryResultExpr(text)
			switch {
			case q.Language == ClickHouseSQL:
				vals, err = sqlFirstColumn(conn, text)
			case isQueryResult:
				vals, err = promQueryResultValues(prom.API(), text, variable.Regex, base)
				if err == nil && len(vals) > 0 && !sel.all {
					vals, err = promBusiestOption(prom.API(), variable.Regex, vals, base)
				}
			default:
				vals, err = promLabelValues(prom.API(), text, base)
				if err == nil && len(vals) > 0 && !sel.all {
					vals, err = promBusiestValue(prom.API(), text, base)
				}
			}
			if err != nil {
				t.Fatalf("%s: %v\n%s", q.Where, err, text)
			}
			if len(vals) == 0 {
				if !variable.IncludeAll || variable.AllValue == "" {
					t.Fatalf("%s: no values, and no All value to fall back to\n%s", q.Where, text)
				}
				sel.v.Vars[name], sel.v.All[name] = nil, true
				continue
			}
			if !sel.all {
				vals = vals[:1]
			}
			sel.v.Vars[name], sel.v.All[name] = vals, sel.all
		}
		if one.All[name] {
			t.Logf("$%s: no values; All", name)
		} else {
			t.Logf("$%s: %d values; single selection %s", name, len(all.Vars[name]), one.Vars[name][0])
		}
	}
	return all, one
}

// promBusiestValue returns the value of a label_values(selector, label)
// variable whose series have the largest sum at the end of the range (their
// last sample in it, so a failed scrape's staleness does not hide them).
func promBusiestValue(api promv1.API, q string, v Values) ([]string, error) {
	selector, label, ok := LabelValuesQuery(q)
	if !ok || selector == "" {
		return nil, fmt.Errorf("not label_values(selector, label): %q", q)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	expr := fmt.Sprintf("sort_desc(sum by (%s) (last_over_time(%s[%s])))", label, selector, promDuration(v.To.Sub(v.From)))
	val, _, _, err := api.Query(ctx, expr, v.To)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", expr, err)
	}
	vec, ok := val.(model.Vector)
	if !ok || len(vec) == 0 {
		return nil, fmt.Errorf("no series for %s", expr)
	}
	return []string{string(vec[0].Metric[model.LabelName(label)])}, nil
}

// promLabelValues resolves label_values(selector, label) the way Grafana
// does: the label's values among the series that exist in the dashboard's
// time range (/api/v1/series, or /api/v1/label/…/values without selector).
func promLabelValues(api promv1.API, q string, v Values) ([]string, error) {
	selector, label, ok := LabelValuesQuery(q)
	if !ok {
		return nil, fmt.Errorf("not a label_values query: %q", q)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if selector == "" {
		vals, _, _, err := api.LabelValues(ctx, label, nil, v.From, v.To)
		if err != nil {
			return nil, err
		}
		out := make([]string, len(vals))
		for i, s := range vals {
			out[i] = string(s)
		}
		return out, nil
	}
	series, _, _, err := api.Series(ctx, []string{selector}, v.From, v.To)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range series {
		if l := string(s[model.LabelName(label)]); l != "" && !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out, nil
}

// sqlFirstColumn returns the first column of every row as a string: a
// variable's values (the ClickHouse plugin takes a second column as the
// text shown).
func sqlFirstColumn(conn driver.Conn, sql string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals := make([]any, len(rows.Columns()))
		var s string
		vals[0] = &s
		for i, ct := range rows.ColumnTypes()[1:] {
			vals[i+1] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(vals...); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// runPromQL runs expr as Grafana would (see RunPromQL) and returns the
// number of finite samples, and a series that carries an environment_id
// without showing its name ("": none): a table without an environment
// column, or a legend without {{environment}}.
func runPromQL(api promv1.API, expr string, q Query, v Values) (int, string, error) {
	n, series, err := RunPromQL(api, expr, q.Instant, v)
	if err != nil {
		return 0, "", err
	}
	return n, unnamedSeries(series, q), nil
}

func TestMain(m *testing.M) { testenv.Main(m) }

// buildCommands returns the executable of ./cmd/<name> for each name, keyed
// by name: built once per test binary the way `make build` does, or taken
// from EDGEPIPE_TEST_BIN_DIR (e.g. the bin/ of `make build`) when that is set
// (see testenv.GoBuild).
func buildCommands(t *testing.T, names ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range names {
		out[name] = testenv.GoBuild(t, "github.com/edgepipe/edgepipe/cmd/"+name)
	}
	return out
}

// startProgram runs one of our binaries until the test ends (SIGTERM, then
// SIGKILL after 10 s); its output goes to a log file shown when the test
// fails.
func startProgram(t *testing.T, bin string, args ...string) {
	t.Helper()
	_ = startProgramEnv(t, bin, nil, args...)
}

// startProgramEnv is startProgram with the environment env (nil: inherit).
// The returned channel is closed when the program ends.
func startProgramEnv(t *testing.T, bin string, env []string, args ...string) <-chan struct{} {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), filepath.Base(bin)+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = t.TempDir()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", bin, err)
	}
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		close(exited)
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		err := <-done
		logf.Close()
		var exit *exec.ExitError
		if err != nil && !(errors.As(err, &exit) && !exit.Exited()) && !errors.Is(err, context.Canceled) {
			t.Logf("%s ended: %v", filepath.Base(bin), err)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("--- %s log (tail) ---\n%s", filepath.Base(bin), b)
		}
	})
	return exited
}

// waitFor polls ready until it returns nil, failing the test after timeout
// with the last error.
func waitFor(t *testing.T, timeout time.Duration, ready func(context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := ready(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after %s: %v", timeout, err)
		}
		time.Sleep(time.Second)
	}
}
