package receiver_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"go.yaml.in/yaml/v3"

	"github.com/edgepipe/edgepipe/internal/deploytest"
	chsink "github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// The views of a reconciliation run: the chart's alert and the Log delivery
// dashboard, evaluated on the data a real run produced.

// chartNamespace and chartPod are the labels the Prometheus Operator would
// add to the receiver's series in a release "ci" in namespace "edgepipe":
// the chart's alert expressions select on them.
const (
	chartNamespace = "edgepipe"
	chartPod       = "ci-edgepipe-receiver-0"
)

// chartAlertExpr renders the chart's PrometheusRule (helm template, as an
// install in namespace edgepipe) and returns the expression of alert.
func chartAlertExpr(t *testing.T, alert string) string {
	t.Helper()
	out, err := exec.Command(testenv.Binary(t, "helm"), "template", "ci", "../../../deploy/helm/edgepipe", "--namespace", chartNamespace,
		"--set", "metrics.prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	var pr struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `yaml:"alert"`
					Expr  string `yaml:"expr"`
				} `yaml:"rules"`
			} `yaml:"groups"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(out, &pr); err != nil {
		t.Fatal(err)
	}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == alert {
				return r.Expr
			}
		}
	}
	t.Fatalf("the chart has no alert %s", alert)
	return ""
}

// startExporter runs the exporter binary at addr polling the simulator
// every 2 seconds for the run's environments (the Metrics API's view of the
// dashboard, and cdn_environment_info with their names).
func (r *reconcileRun) startExporter(t *testing.T, addr string) {
	t.Helper()
	args := []string{"--api.url=" + r.apiURL, "--auth.url=" + r.apiURL, "--web.listen-address=" + addr,
		"--poll-interval=2s", "--poll.jitter=0s", "--dataset=edge_usage_by_country"}
	for _, e := range r.envs {
		args = append(args, "--environment-id="+e)
	}
	p := &receiverProcess{t: t, bin: testenv.GoBuild(t, "github.com/edgepipe/edgepipe/cmd/exporter"),
		log: filepath.Join(t.TempDir(), "exporter.log"), args: args, env: receiverEnv}
	p.start()
	t.Cleanup(func() {
		p.kill9()
		if t.Failed() {
			t.Logf("exporter log (tail):\n%s", p.logs())
		}
	})
}

// checkDashboard runs every query of the Log delivery dashboard against
// the run's Prometheus (wall-clock range) and ClickHouse (the simulated
// range), with every environment and with one: each must run, and return
// data unless it reads metrics this build does not produce (the cdn_logs_*
// metrics of issue 19's live log metrics, until they are merged: then the
// check requires their data too).
func (r *reconcileRun) checkDashboard(t *testing.T, prom *testenv.PrometheusServer, wallFrom time.Time, simFrom, simTo time.Time) {
	t.Helper()
	ds, err := deploytest.LoadDashboards("../../../dashboards")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ds, func(d deploytest.Dashboard) bool { return d.File == deploytest.LogDeliveryDashboard })
	if i < 0 {
		t.Fatalf("no %s", deploytest.LogDeliveryDashboard)
	}
	d := ds[i]
	qs, err := d.Queries()
	if err != nil {
		t.Fatal(err)
	}
	opts, err := clickhouse.ParseDSN(r.ch.DSN(r.db))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r.nameEnvironments(t)
	ran := 0
	for _, sel := range []struct {
		name string
		envs []string
		all  bool
	}{{"all", r.envs, true}, {"one", r.envs[:1], false}} {
		prv := deploytest.Values{From: wallFrom, To: time.Now(), Interval: 5 * time.Second, RateInterval: 5 * time.Second,
			Vars: map[string][]string{"environment_id": sel.envs}, All: map[string]bool{"environment_id": sel.all}}
		sqv := prv
		sqv.From, sqv.To = simFrom, simTo
		for _, q := range qs {
			if q.Variable {
				continue
			}
			var n int
			switch q.Language {
			case deploytest.PromQL:
				text, err := deploytest.Expand(d, q, prv)
				if err != nil {
					t.Fatalf("%s: %v", q.Where, err)
				}
				n, _, err = deploytest.RunPromQL(prom.API(), text, q.Instant, prv)
				if err != nil {
					t.Errorf("%s (%s): %v\n%s", q.Where, sel.name, err, text)
					continue
				}
			case deploytest.ClickHouseSQL:
				text, err := deploytest.Expand(d, q, sqv)
				if err != nil {
					t.Fatalf("%s: %v", q.Where, err)
				}
				rows, err := conn.Query(context.Background(), text)
				if err != nil {
					t.Errorf("%s (%s): %v\n%s", q.Where, sel.name, err, text)
					continue
				}
				for rows.Next() {
					n++
				}
				rows.Close()
			}
			if n == 0 {
				t.Errorf("%s (%s): no data", q.Where, sel.name)
			}
			ran++
		}
	}
	t.Logf("%d dashboard queries returned data", ran)
}

// nameEnvironments creates the exporter's environments table as its sink
// does, naming the run's environments (what the dashboard's SQL joins).
func (r *reconcileRun) nameEnvironments(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	db, err := chsink.Open(ctx, r.ch.DSN(r.db))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	spec := inventorytables.EnvironmentsTable()
	for _, stmt := range chsink.CreateStatements(db.Database(), "", db.Version(), spec) {
		if err := db.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	var rows [][]any
	for i, env := range r.envs {
		rows = append(rows, []any{env, fmt.Sprintf("env-%d", i), "p-1", "shop", "o-1", simStart, uint64(1)})
	}
	if err := db.Insert(ctx, spec.Name, []string{"environment_id", "environment", "property_id", "property", "organization_id", "seen_at", "version"}, rows); err != nil {
		t.Fatal(err)
	}
}
