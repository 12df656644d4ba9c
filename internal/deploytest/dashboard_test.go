package deploytest

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/edgepipe/edgepipe/internal/rtld/reconcile"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/logtable"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

const dashboardDir = "../../dashboards"

func loadDashboards(t *testing.T) []Dashboard {
	t.Helper()
	ds, err := LoadDashboards(dashboardDir)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// TestDashboardsWellFormed checks what makes a dashboard importable as a file
// and by the Grafana sidecar: unique uid, schema version, datasources as
// variables (no instance-specific uids), every target non-empty and pointing
// at a datasource, unique panel ids, panels not overlapping.
func TestDashboardsWellFormed(t *testing.T) {
	ds := loadDashboards(t)
	if len(ds) != 5 {
		t.Errorf("%d dashboards, want 5 (CDN overview, Origins, Access logs, Pipeline health, Log delivery)", len(ds))
	}
	uids := map[string]string{}
	for _, d := range ds {
		t.Run(d.File, func(t *testing.T) {
			if d.UID == "" || d.Title == "" {
				t.Errorf("uid %q title %q", d.UID, d.Title)
			}
			if prev, dup := uids[d.UID]; dup {
				t.Errorf("uid %s also used by %s", d.UID, prev)
			}
			uids[d.UID] = d.File
			if d.SchemaVersion < 36 {
				t.Errorf("schemaVersion %d: datasource references need >= 36", d.SchemaVersion)
			}
			raw, err := os.ReadFile(filepath.Join(dashboardDir, d.File))
			if err != nil {
				t.Fatal(err)
			}
			var top map[string]any
			if err := json.Unmarshal(raw, &top); err != nil {
				t.Fatal(err)
			}
			if id, ok := top["id"]; ok && id != nil {
				t.Errorf("id %v is set: an imported dashboard must not carry a database id", id)
			}
			ids := map[int]bool{}
			type rect struct{ x, y, w, h int }
			var placed []rect
			for _, p := range d.AllPanels() {
				if ids[p.ID] {
					t.Errorf("panel id %d used twice", p.ID)
				}
				ids[p.ID] = true
				if p.Type == "row" {
					continue
				}
				if len(p.Targets) == 0 {
					t.Errorf("panel %q has no targets", p.Title)
				}
				for _, tg := range p.Targets {
					if strings.TrimSpace(tg.Expr+tg.RawSQL) == "" {
						t.Errorf("panel %q target %s is empty", p.Title, tg.RefID)
					}
					ref := tg.Datasource
					if ref == nil {
						ref = p.Datasource
					}
					if ref == nil {
						t.Errorf("panel %q target %s has no datasource", p.Title, tg.RefID)
					} else if _, ok := variableReference(ref.UID); !ok {
						t.Errorf("panel %q target %s: datasource uid %q is instance-specific; use ${DS_…}", p.Title, tg.RefID, ref.UID)
					}
				}
			}
			// Panel geometry from the raw JSON (not part of the model).
			var geo struct {
				Panels []struct {
					Title   string `json:"title"`
					GridPos struct {
						X int `json:"x"`
						Y int `json:"y"`
						W int `json:"w"`
						H int `json:"h"`
					} `json:"gridPos"`
				} `json:"panels"`
			}
			if err := json.Unmarshal(raw, &geo); err != nil {
				t.Fatal(err)
			}
			for _, p := range geo.Panels {
				r := rect{p.GridPos.X, p.GridPos.Y, p.GridPos.W, p.GridPos.H}
				if r.w <= 0 || r.h <= 0 || r.x+r.w > 24 {
					t.Errorf("panel %q gridPos %+v outside the 24-column grid", p.Title, r)
				}
				for _, o := range placed {
					if r.x < o.x+o.w && o.x < r.x+r.w && r.y < o.y+o.h && o.y < r.y+r.h {
						t.Errorf("panel %q overlaps another at %+v", p.Title, o)
					}
				}
				placed = append(placed, r)
			}
			qs, err := d.Queries()
			if err != nil {
				t.Fatal(err)
			}
			if len(qs) == 0 {
				t.Error("no queries")
			}
		})
	}
}

// TestDashboardContract checks the queries against the public contract of
// DESIGN.md: metric names, labels and tables the pipeline produces.
func TestDashboardContract(t *testing.T) {
	metric := regexp.MustCompile(`\b(cdn_[a-z0-9_]+|edgepipe_[a-z0-9_]+)\b`)
	datasets := []string{"edge_usage_by_country", "edge_errors", "origin_usage_by_country", "origin_usage", "origin_errors", "origin_offload"}
	seen := map[string]bool{}
	for _, d := range loadDashboards(t) {
		qs, err := d.Queries()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			switch q.Language {
			case PromQL:
				for _, m := range metric.FindAllString(q.Text, -1) {
					if strings.HasPrefix(m, "cdn_logs_") {
						// The receiver's live metrics from the records (DESIGN).
						if !slices.Contains(logMetrics, m) {
							t.Errorf("%s %s: %s is not one of the receiver's log metrics %v", q.Dashboard, q.Where, m, logMetrics)
						}
						continue
					}
					if strings.HasPrefix(m, "cdn_") && !slices.Contains(inventoryMetrics, m) {
						ds := ""
						for _, name := range datasets {
							if strings.HasPrefix(m, "cdn_"+name+"_") && len(name) > len(ds) {
								ds = name
							}
						}
						if ds == "" {
							t.Errorf("%s %s: %s names no dataset", q.Dashboard, q.Where, m)
						}
						seen[ds] = true
						if strings.Contains(m, "_ms_") || strings.HasSuffix(m, "_percentile") || strings.Contains(m, "bits_") {
							t.Errorf("%s %s: %s uses the API's name, not the exported one (seconds, bytes)", q.Dashboard, q.Where, m)
						}
					}
				}
				if strings.Contains(q.Text, "quantile=") {
					t.Errorf("%s %s: the percentile label is \"percentile\", not \"quantile\"", q.Dashboard, q.Where)
				}
			case ClickHouseSQL:
				if !strings.Contains(q.Text, "access_logs") && !strings.Contains(q.Text, reconcile.CompletenessTable) {
					t.Errorf("%s %s: reads neither access_logs nor %s", q.Dashboard, q.Where, reconcile.CompletenessTable)
				}
				if !q.Variable && !strings.Contains(q.Text, "$__timeFilter(") {
					t.Errorf("%s %s: no $__timeFilter: the query would scan the whole table", q.Dashboard, q.Where)
				}
			}
		}
	}
	for _, ds := range datasets {
		if !seen[ds] {
			t.Errorf("no dashboard shows dataset %s", ds)
		}
	}
}

// logMetrics are the receiver's live metrics from the records (DESIGN,
// "Names added for logs meeting metrics"), as PromQL reads them.
var logMetrics = []string{"cdn_logs_requests_total", "cdn_logs_response_bytes_total",
	"cdn_logs_total_time_seconds", "cdn_logs_total_time_seconds_bucket", "cdn_logs_total_time_seconds_sum", "cdn_logs_total_time_seconds_count"}

// testValues are the substitutions of the offline tests.
func testValues() Values {
	to := time.Now().Truncate(time.Second)
	return Values{
		From: to.Add(-time.Hour), To: to,
		Interval: time.Minute, RateInterval: 4 * time.Minute,
		Vars: map[string][]string{
			"environment_id": {"env-a", "env-b"},
			"country_code":   {"us"},
			"origin_name":    {"origin-1"},
			"exporter_job":   {"edgepipe-exporter"},
			"receiver_job":   {"edgepipe-receiver"},
		},
		All: map[string]bool{"exporter_job": true},
	}
}

func TestExpand(t *testing.T) {
	d := Dashboard{File: "t.json"}
	d.Templating.List = []Variable{
		{Name: "DS", Type: "datasource", Query: json.RawMessage(`"prometheus"`)},
		{Name: "env", Type: "query", Multi: true, IncludeAll: true, AllValue: ".*"},
		{Name: "single", Type: "custom"},
		{Name: "envs", Type: "query", Multi: true, IncludeAll: true},
	}
	from := time.Unix(1700000000, 0)
	v := Values{
		From: from, To: from.Add(90 * time.Minute), Interval: 30 * time.Second, RateInterval: 2 * time.Minute,
		Vars: map[string][]string{"env": {"a.b", "c"}, "single": {"x"}, "envs": {"e1", "e2"}},
		All:  map[string]bool{},
	}
	all := v
	all.All = map[string]bool{"env": true, "envs": true}
	prom := func(s string) Query { return Query{Dashboard: "t.json", Language: PromQL, Text: s} }
	sql := func(s string) Query { return Query{Dashboard: "t.json", Language: ClickHouseSQL, Text: s} }
	for _, tc := range []struct {
		name string
		q    Query
		v    Values
		want string
		err  string
	}{
		{"multi regex", prom(`x{e=~"$env"}`), v, `x{e=~"(a\\.b|c)"}`, ""},
		{"braces", prom(`x{e=~"${env}"}`), v, `x{e=~"(a\\.b|c)"}`, ""},
		{"all value", prom(`x{e=~"$env"}`), all, `x{e=~".*"}`, ""},
		{"single", prom(`x{s="$single"}`), v, `x{s="x"}`, ""},
		{"rate interval", prom(`rate(x[$__rate_interval])`), v, `rate(x[2m])`, ""},
		{"interval and range", prom(`increase(x[$__range]) / $__interval_ms`), v, `increase(x[90m]) / 30000`, ""},
		{"unknown variable", prom(`x{e="$nope"}`), v, "", "unknown variable $nope"},
		{"unknown builtin", prom(`x[$__nope]`), v, "", "unexpanded"},
		{"time filter", sql(`SELECT 1 FROM t WHERE $__timeFilter(ts)`), v,
			`SELECT 1 FROM t WHERE ts >= toDateTime(1700000000) AND ts <= toDateTime(1700005400)`, ""},
		{"from to interval_s", sql(`SELECT $__fromTime, $__toTime, $__interval_s`), v,
			`SELECT toDateTime(1700000000), toDateTime(1700005400), 30`, ""},
		{"time interval", sql(`SELECT $__timeInterval(ts)`), v, `SELECT toStartOfInterval(toDateTime(ts), INTERVAL 30 second)`, ""},
		{"date filter", sql(`WHERE $__dateFilter(d)`), v, `WHERE d >= toDate('2023-11-14') AND d <= toDate('2023-11-14')`, ""},
		{"singlequote", sql(`WHERE e IN (${envs:singlequote})`), v, `WHERE e IN ('e1','e2')`, ""},
		{"conditionalAll selected", sql(`WHERE $__conditionalAll(e IN (${envs:singlequote}), $envs)`), v, `WHERE e IN ('e1','e2')`, ""},
		{"conditionalAll all", sql(`WHERE $__conditionalAll(e IN (${envs:singlequote}), $envs)`), all, `WHERE 1=1`, ""},
		{"multi without format in SQL", sql(`WHERE e IN ($envs)`), v, "", "needs a format"},
		{"unknown macro", sql(`WHERE $__timeFilterX(ts)`), v, "", "unknown macro"},
		{"unbalanced macro", sql(`WHERE $__timeFilter(ts`), v, "", "unbalanced"},
		{"datasource variable in query", prom(`x{a="$DS"}`), v, "", "datasource variable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Expand(d, tc.q, tc.v)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Expand(%q) = %q, %v; want error containing %q", tc.q.Text, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Expand(%q) = %q, %v; want %q", tc.q.Text, got, err, tc.want)
			}
		})
	}
}

func TestPromQLOfVariable(t *testing.T) {
	for in, want := range map[string]string{
		`label_values(up, job)`:                           `count by (job) (up)`,
		`label_values(x{e=~"a|b"}, country_code)`:         `count by (country_code) (x{e=~"a|b"})`,
		`label_values({__name__=~"edgepipe_.+"}, job)`:    `count by (job) ({__name__=~"edgepipe_.+"})`,
		`label_values(job)`:                               `count by (job) ({job!=""})`,
		`query_result(topk(5, sum by (a) (rate(x[5m]))))`: `topk(5, sum by (a) (rate(x[5m])))`,
		`sum by (a) (x)`:                                  `sum by (a) (x)`,
	} {
		if got := PromQLOfVariable(in); got != want {
			t.Errorf("PromQLOfVariable(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDashboardQueriesExpand expands every query of every dashboard with
// sample values: each must expand without an unknown variable or macro.
func TestDashboardQueriesExpand(t *testing.T) {
	n := 0
	for _, d := range loadDashboards(t) {
		qs, err := d.Queries()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if _, err := Expand(d, q, testValues()); err != nil {
				t.Errorf("%s %s: %v", q.Dashboard, q.Where, err)
			}
			n++
		}
	}
	t.Logf("%d queries expanded", n)
}

// TestDashboardPromQLParses runs every PromQL query (variables and macros
// substituted) against a real Prometheus with an empty TSDB: the server
// parses and evaluates it, so a syntax or type error fails here.
func TestDashboardPromQLParses(t *testing.T) {
	prom := testenv.Prometheus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := 0
	for _, d := range loadDashboards(t) {
		qs, err := d.Queries()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Language != PromQL {
				continue
			}
			expr, err := Expand(d, q, testValues())
			if err != nil {
				t.Errorf("%s %s: %v", q.Dashboard, q.Where, err)
				continue
			}
			if q.Variable {
				expr = PromQLOfVariable(expr)
			}
			if _, err := prom.Query(ctx, expr); err != nil {
				t.Errorf("%s %s: %v", q.Dashboard, q.Where, err)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatal("no PromQL queries found")
	}
	t.Logf("%d PromQL queries run", n)
}

// TestDashboardSQLRuns runs every ClickHouse query (macros and variables
// substituted) against a real ClickHouse 18.16 holding the access_logs table
// exactly as the receiver's sink creates it (logtable.DDL), filled with rows
// in the time range: each must run and return rows, so a wrong column or a
// function newer than the server (toStartOfInterval, DateTime64) fails here.
func TestDashboardSQLRuns(t *testing.T) {
	ch := testenv.ClickHouse(t)
	dbName := ch.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := clickhouse.Open(ctx, ch.DSN(dbName))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	createAccessLogs(ctx, t, db)
	end := time.Now().Truncate(time.Second)
	if err := db.Exec(ctx, accessLogRows(db, 400, end)); err != nil {
		t.Fatal(err)
	}
	createLogCompleteness(ctx, t, db, end)
	n := runSQLQueries(t, db.Conn(), loadDashboards(t), []Values{testValues(), allSelected(testValues())})
	if n == 0 {
		t.Fatal("no ClickHouse queries found")
	}
	t.Logf("%d SQL queries run", n)
	receiverOnly(ctx, t, ch.DSN(ch.NewDatabase(t)))
}

// receiverOnly runs every ClickHouse query of the dashboards on a database
// only the receiver writes (no exporter ClickHouse sink: nothing writes the
// environments table): the tables as the receiver's sink makes them at its
// start (logtable.Sink.Check), filled with access logs. Every query must
// run and return rows, and environments show their IDs.
func receiverOnly(ctx context.Context, t *testing.T, dsn string) {
	t.Helper()
	sink, err := logtable.New(logtable.Config{DSN: dsn, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if err := sink.Check(ctx); err != nil {
		t.Fatal(err)
	}
	db, err := clickhouse.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	end := time.Now().Truncate(time.Second)
	if err := db.Exec(ctx, accessLogRows(db, 400, end)); err != nil {
		t.Fatal(err)
	}
	createLogCompleteness(ctx, t, db, end) // the reconciliation's table (it is on by default)
	n := runSQLQueries(t, db.Conn(), loadDashboards(t), []Values{testValues(), allSelected(testValues())})
	if n == 0 {
		t.Fatal("no ClickHouse queries found")
	}
	var names uint64
	if err := db.Conn().QueryRow(ctx, "SELECT count() FROM "+db.Table(inventorytables.TableEnvironments)).Scan(&names); err != nil || names != 0 {
		t.Errorf("receiver-only environments table: %d rows, %v; want it there and empty", names, err)
	}
	// Names fall back to the IDs.
	d := dashboardFile(t, "access-logs.json")
	qs, err := d.Queries()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if q.Where != "variable environment_id" {
			continue
		}
		sql, err := Expand(d, q, allSelected(testValues()))
		if err != nil {
			t.Fatal(err)
		}
		got, err := resultText(ctx, db.Conn(), sql)
		if err != nil {
			t.Fatal(err)
		}
		// Each environment's option is its ID, shown as its ID.
		var want []string
		for _, id := range []string{"env-a", "env-b"} {
			want = append(want, id+"\t"+id)
		}
		if got != strings.Join(want, "\n") {
			t.Errorf("receiver only: %s gives\n%s\nwant\n%s", q.Where, got, strings.Join(want, "\n"))
		}
	}
	t.Logf("receiver only: %d SQL queries run on ClickHouse %s", n, db.Version())
}

// createLogCompleteness creates log_completeness as the receiver's
// reconciliation does and fills it with the hour before end: two
// environments, every bucket written twice (a late record rewrote it), one
// bucket incomplete.
func createLogCompleteness(ctx context.Context, t *testing.T, db *clickhouse.DB, end time.Time) {
	t.Helper()
	for _, stmt := range clickhouse.CreateStatements(db.Database(), "", db.Version(), reconcile.Completeness()) {
		if err := db.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	var rows [][]any
	for b := end.Add(-time.Hour).Truncate(5 * time.Minute); b.Before(end); b = b.Add(5 * time.Minute) {
		for i, env := range []string{"env-a", "env-b"} {
			recs := uint64(1000 + i)
			if i == 1 && b.Minute() == 30 {
				recs = 900
			}
			at := b.Add(35 * time.Minute)
			rows = append(rows, []any{env, b.UTC(), uint64(1000 + i), recs - 1, 1.0, at.UTC()}, []any{env, b.UTC(), uint64(1000 + i), recs, 1.0, at.Add(time.Second).UTC()})
		}
	}
	if err := db.Insert(ctx, reconcile.CompletenessTable, []string{"environment_id", "time", "api_requests", "log_records", "sampling", "reconciled_at"}, rows); err != nil {
		t.Fatal(err)
	}
}

// TestDashboardSQLRuns26 is TestDashboardSQLRuns on ClickHouse 26.x (chDB
// behind testenv's HTTP server), with access_logs in the layout the sink
// gives it there (DateTime64, LowCardinality, codecs).
func TestDashboardSQLRuns26(t *testing.T) {
	srv := testenv.ChDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := clickhouse.Open(ctx, srv.DSN("dashboards"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if !db.Version().AtLeast(26, 1) {
		t.Fatalf("chDB is ClickHouse %s, want 26.x", db.Version())
	}
	createAccessLogs(ctx, t, db)
	end := time.Now().Truncate(time.Second)
	if err := db.Exec(ctx, accessLogRows(db, 400, end)); err != nil {
		t.Fatal(err)
	}
	createLogCompleteness(ctx, t, db, end)
	n := runSQLQueries(t, db.Conn(), loadDashboards(t), []Values{testValues(), allSelected(testValues())})
	if n == 0 {
		t.Fatal("no ClickHouse queries found")
	}
	t.Logf("%d SQL queries run on ClickHouse %s", n, db.Version())
	receiverOnly(ctx, t, srv.DSN("dashboards_receiver_only"))
}

// dashboardFile returns the dashboard of file name.
func dashboardFile(t *testing.T, name string) Dashboard {
	t.Helper()
	for _, d := range loadDashboards(t) {
		if d.File == name {
			return d
		}
	}
	t.Fatalf("no dashboard %s", name)
	return Dashboard{}
}

// allSelected returns v with every variable in "All".
func allSelected(v Values) Values {
	v.All = map[string]bool{}
	for k := range v.Vars {
		v.All[k] = true
	}
	return v
}

// TestQueryResultOptions pins how a query_result variable's regex shapes
// and filters the options, as Grafana does.
func TestQueryResultOptions(t *testing.T) {
	sample := func(id, name string, v float64) *model.Sample {
		return &model.Sample{
			Metric:    model.Metric{model.MetricNameLabel: "edgepipe_up", "environment_id": model.LabelValue(id), "environment_name": model.LabelValue(name)},
			Value:     model.SampleValue(v),
			Timestamp: 1000,
		}
	}
	samples := model.Vector{sample("env-1", "Shop", 1), sample("env-2", "Blog", 1), sample("env-1", "Shop2", 2)}
	line := func(id, name, v string) string {
		return `edgepipe_up{environment_id="` + id + `",environment_name="` + name + `"} ` + v + ` 1000`
	}
	opt := func(text, value string) Option { return Option{Text: text, Value: value} }
	for _, tc := range []struct {
		name, regex string
		want        []Option
	}{
		{"no regex: the whole lines", "", []Option{
			opt(line("env-1", "Shop", "1"), line("env-1", "Shop", "1")),
			opt(line("env-2", "Blog", "1"), line("env-2", "Blog", "1")),
			opt(line("env-1", "Shop2", "2"), line("env-1", "Shop2", "2")),
		}},
		{"first group, de-duplicated by text", `/environment_id="([^"]+)"/`, []Option{opt("env-1", "env-1"), opt("env-2", "env-2")}},
		{"text and value groups", `/environment_id="(?P<value>[^"]+)".*environment_name="(?P<text>[^"]+)"/`,
			[]Option{opt("Shop", "env-1"), opt("Blog", "env-2"), opt("Shop2", "env-1")}},
		{"text group only", `/environment_name="(?P<text>[^"]+)"/`, []Option{opt("Shop", "Shop"), opt("Blog", "Blog"), opt("Shop2", "Shop2")}},
		{"value group only", `/environment_id="(?P<value>[^"]+)"/`, []Option{opt("env-1", "env-1"), opt("env-2", "env-2")}},
		{"no group: the whole matching line", `/env-2/`, []Option{opt(line("env-2", "Blog", "1"), line("env-2", "Blog", "1"))}},
		{"no match", `/nowhere/`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := QueryResultOptions(samples, tc.regex)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := QueryResultOptions(samples, "/(/"); err == nil || !strings.Contains(err.Error(), "variable regex /(/") {
		t.Errorf("invalid regex: got error %v", err)
	}
}
