package deploytest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// The inventory's metric names the dashboards use besides the datasets'
// (DESIGN.md, names added for the inventory).
var inventoryMetrics = []string{
	"cdn_environment_info",
	"cdn_tls_certificate_expiry_timestamp_seconds",
	"cdn_tls_certificate_info",
	"cdn_tls_certificate_activation_failed",
}

// unnamedSeries says which series of a query's result carries an
// environment_id without showing the environment's name, "" when none: a
// table needs an environment column (label), a time series also a legend
// that shows {{environment}}.
func unnamedSeries(series []model.Metric, q Query) string {
	for _, m := range series {
		if _, ok := m["environment_id"]; !ok {
			continue
		}
		if m["environment"] == "" {
			return fmt.Sprintf("series %v has no environment label", m)
		}
		if !q.Instant && !strings.Contains(q.Legend, "{{environment}}") {
			return fmt.Sprintf("legend %q does not show {{environment}} of %v", q.Legend, m)
		}
	}
	return ""
}

// countNamedRows runs sql and counts its rows; the second result says why
// the environments are not named ("" when they are): a column
// environment_id without a column environment, or an empty name.
func countNamedRows(conn driver.Conn, sql string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return 0, "", err
	}
	defer rows.Close()
	cols := rows.Columns()
	unnamed := ""
	name := slices.Index(cols, "environment")
	if slices.Contains(cols, "environment_id") && name < 0 {
		unnamed = fmt.Sprintf("columns %v: environment_id without environment", cols)
	}
	n := 0
	for rows.Next() {
		n++
		if name < 0 {
			continue
		}
		vals := make([]any, len(cols))
		for i, ct := range rows.ColumnTypes() {
			vals[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(vals...); err != nil {
			return 0, "", err
		}
		if s, ok := vals[name].(*string); ok && *s == "" && unnamed == "" {
			unnamed = "a row with an empty environment"
		}
	}
	return n, unnamed, rows.Err()
}

// promQueryResultValues resolves a query_result(expr) variable the way
// Grafana does: expr evaluated at the end of the range, each sample made
// an option by the variable's regex; it returns the options' values.
func promQueryResultValues(api promv1.API, q, regex string, v Values) ([]string, error) {
	opts, err := promQueryResultOptions(api, q, regex, v)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, o := range opts {
		if !slices.Contains(out, o.Value) {
			out = append(out, o.Value)
		}
	}
	return out, nil
}

func promQueryResultOptions(api promv1.API, q, regex string, v Values) ([]Option, error) {
	expr, ok := QueryResultExpr(q)
	if !ok {
		return nil, fmt.Errorf("not a query_result query: %q", q)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	val, _, _, err := api.Query(ctx, expr, v.To)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", expr, err)
	}
	vec, ok := val.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("%s: a %s, not a vector", expr, val.Type())
	}
	return QueryResultOptions(vec, regex)
}

// promBusiestOption returns the value among vals of a variable whose
// regex takes its value from a label (`label="(?<value>…)"`) that carries
// the most traffic: the largest sum of the cdn_ counters with that label
// value at the end of the range.
func promBusiestOption(api promv1.API, regex string, vals []string, v Values) ([]string, error) {
	m := regexp.MustCompile(`(\w+)="\(\?<value>`).FindStringSubmatch(regex)
	if m == nil {
		return nil, fmt.Errorf("regex %s takes its value from no label", regex)
	}
	quoted := make([]string, len(vals))
	for i, s := range vals {
		quoted[i] = regexp.QuoteMeta(s)
	}
	expr := fmt.Sprintf(`sort_desc(sum by (%s) (last_over_time({__name__=~"cdn_.+_total", %s=~"%s"}[%s])))`,
		m[1], m[1], strings.Join(quoted, "|"), promDuration(v.To.Sub(v.From)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	val, _, _, err := api.Query(ctx, expr, v.To)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", expr, err)
	}
	vec, ok := val.(model.Vector)
	if !ok || len(vec) == 0 {
		return vals[:1], nil // no traffic anywhere: any one
	}
	return []string{string(vec[0].Metric[model.LabelName(m[1])])}, nil
}

// TestDashboardNamesStatic checks what can be checked without data: every
// dashboard with an environment variable offers names and expands to IDs,
// no legend shows a bare environment ID, and every join of the names takes
// one info series per environment. TestDashboardNamesLive checks with data
// that every result that carries an environment shows its name.
func TestDashboardNamesStatic(t *testing.T) {
	for _, d := range loadDashboards(t) {
		if v, ok := d.Variable("environment_id"); ok {
			q := v.QueryText()
			switch {
			case strings.HasPrefix(q, "query_result("):
				if !strings.Contains(q, "cdn_environment_info") || !strings.Contains(v.Regex, "(?<text>") || !strings.Contains(v.Regex, `environment_id="(?<value>`) {
					t.Errorf("%s: variable environment_id shows no names: %s %s", d.File, q, v.Regex)
				}
			case strings.HasPrefix(q, "SELECT environment_id, "):
				if !strings.Contains(q, "environments FINAL") {
					t.Errorf("%s: variable environment_id does not name environments from the environments table: %s", d.File, q)
				}
			default:
				t.Errorf("%s: variable environment_id offers IDs, not names: %s", d.File, q)
			}
		}
		qs, err := d.Queries()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Variable || q.Language != PromQL {
				continue
			}
			if strings.Contains(q.Legend, "{{environment_id}}") {
				t.Errorf("%s %s: legend %q shows the environment's ID", q.Dashboard, q.Where, q.Legend)
			}
			// Two cdn_environment_info series of one environment (replicas,
			// a rename between scrapes) make a bare group_left fail.
			if strings.Count(q.Text, "cdn_environment_info") != strings.Count(q.Text, "topk by (environment_id) (1, cdn_environment_info") {
				t.Errorf("%s %s: joins cdn_environment_info without topk by (environment_id) (1, …)", q.Dashboard, q.Where)
			}
		}
	}
}

// exposition is what a fake exporter serves: it changes over time.
type exposition struct {
	mu   sync.Mutex
	body string
}

func (e *exposition) set(s string) {
	e.mu.Lock()
	e.body = s
	e.mu.Unlock()
}

func (e *exposition) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprint(w, e.body)
}

// dashboardMetrics returns every cdn_ metric the dashboards' PromQL names.
func dashboardMetrics(t *testing.T, ds []Dashboard) []string {
	re := regexp.MustCompile(`\bcdn_[a-z0-9_]+\b`)
	var out []string
	for _, d := range ds {
		qs, err := d.Queries()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Language == PromQL {
				for _, m := range re.FindAllString(q.Text, -1) {
					if !slices.Contains(out, m) && !slices.Contains(inventoryMetrics, m) {
						out = append(out, m)
					}
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestDashboardNamesLive is the dashboards' name test with data: two
// exporter replicas scraped by a real Prometheus serve every metric the
// dashboards query for three environments: env-b is renamed while the
// replicas disagree about its name for a while (two info series of one
// environment at the same instants, which a plain group_left refuses as
// many-to-many), and env-c has no cdn_environment_info at all (deleted or
// moved since, not discovered yet, the inventory failing, or served by
// another exporter). Every PromQL query of every dashboard runs over the
// whole time, with every variable on All: none fails, every series that
// carries an environment shows its name (legend or table column), every
// query that returns environments returns env-c too, named by its ID, the
// renamed environment appears under both names, and the environment
// variable offers names that expand to the IDs behind them, env-c by its
// ID, with All covering env-c.
func TestDashboardNamesLive(t *testing.T) {
	ds := loadDashboards(t)
	metrics := dashboardMetrics(t, ds)
	start := time.Now()
	labels := `environment_id="%s",country_code="us",origin_name="o1",http_method="GET",content_type="text/html",http_status_code="503"`
	series := func(env string) string {
		var b strings.Builder
		grow := time.Since(start).Seconds()
		for _, m := range metrics {
			l := fmt.Sprintf(labels, env)
			switch {
			case strings.HasSuffix(m, "_seconds"):
				for _, p := range []string{"50", "95", "99"} {
					fmt.Fprintf(&b, "%s{%s,percentile=%q} 0.05\n", m, l, p)
				}
			case strings.HasSuffix(m, "_total"):
				fmt.Fprintf(&b, "%s{%s} %g\n", m, l, 1000+grow*100)
			default:
				fmt.Fprintf(&b, "%s{%s} 0.5\n", m, l)
			}
		}
		exp := start.Add(10 * 24 * time.Hour).Unix()
		fmt.Fprintf(&b, "cdn_tls_certificate_expiry_timestamp_seconds{environment_id=%q,certificate_id=\"c-%s\",common_name=\"%s.example.com\"} %d\n", env, env, env, exp)
		fmt.Fprintf(&b, "cdn_tls_certificate_info{environment_id=%q,certificate_id=\"c-%s\",common_name=\"%s.example.com\",serial=\"0A\",status=\"active\",generated=\"true\"} 1\n", env, env, env)
		fmt.Fprintf(&b, "cdn_tls_certificate_activation_failed{environment_id=%q,certificate_id=\"c-%s\"} 0\n", env, env)
		return b.String()
	}
	info := func(env, name string) string {
		return fmt.Sprintf("cdn_environment_info{environment_id=%q,environment=%q,property_id=\"p-1\",property=\"shop\",organization_id=\"o-1\"} 1\n", env, name)
	}
	a, b := &exposition{}, &exposition{}
	phase := func(nameA, nameB string) {
		body := series("env-a") + series("env-b") + series("env-c")
		a.set(body + info("env-a", "alpha") + info("env-b", nameA))
		b.set(body + info("env-a", "alpha") + info("env-b", nameB))
	}
	phase("beta", "beta")
	srvA, srvB := httptest.NewServer(a), httptest.NewServer(b)
	defer srvA.Close()
	defer srvB.Close()
	prom := testenv.PrometheusScrape(t, testenv.ScrapeJob{Name: "edgepipe-exporter",
		Targets: []string{strings.TrimPrefix(srvA.URL, "http://"), strings.TrimPrefix(srvB.URL, "http://")}})
	prom.WaitTargetsUp(t, 60*time.Second)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // keep the counters moving
		defer wg.Done()
		names := [][2]string{{"beta", "beta"}, {"beta-renamed", "beta"}, {"beta-renamed", "beta-renamed"}}
		for i := 0; ; i++ {
			phase(names[min(i/6, 2)][0], names[min(i/6, 2)][1])
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	time.Sleep(20 * time.Second)
	close(stop)
	wg.Wait()
	time.Sleep(2 * testenv.PrometheusScrapeInterval)

	now := time.Now()
	v := Values{From: now.Add(-25 * time.Second), To: now, Interval: time.Second, RateInterval: 4 * time.Second,
		Vars: map[string][]string{}, All: map[string]bool{}}
	ran := 0
	for _, d := range ds {
		ran += checkDashboardLive(t, prom.API(), d, v)
	}
	t.Logf("%d PromQL queries returned data, every environment named, env-c by its ID", ran)
	// The renamed environment shows under both names over the time range.
	byEnv := `sum by (environment_id) (rate(cdn_edge_usage_by_country_requests_edge_total[4s])) * on (environment_id) group_left (environment, property) topk by (environment_id) (1, cdn_environment_info)`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	val, _, _, err := prom.API().QueryRange(ctx, byEnv, promv1.Range{Start: v.From, End: v.To, Step: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range val.(model.Matrix) {
		names[string(s.Metric["environment_id"])+"="+string(s.Metric["environment"])] = true
	}
	for _, want := range []string{"env-a=alpha", "env-b=beta", "env-b=beta-renamed"} {
		if !names[want] {
			t.Errorf("no series named %s over the range; got %v", want, names)
		}
	}
}

// unnamedEnvironment is the environment the live test serves series for
// without a cdn_environment_info series.
const unnamedEnvironment = "env-c"

// checkDashboardLive runs every PromQL query of d (its variables on All)
// and reports each that fails, leaves an environment unnamed, or returns
// environments but not unnamedEnvironment under its ID; it returns how many
// returned data.
func checkDashboardLive(t *testing.T, api promv1.API, d Dashboard, v Values) int {
	t.Helper()
	for _, variable := range d.Templating.List {
		if variable.Type == "query" {
			v.Vars[variable.Name], v.All[variable.Name] = nil, true
		}
	}
	qs, err := d.Queries()
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, q := range qs { // variables come first
		if q.Language != PromQL {
			continue
		}
		text, err := Expand(d, q, v)
		if err != nil {
			t.Fatalf("%s %s: %v", d.File, q.Where, err)
		}
		if q.Variable {
			if q.Where == "variable environment_id" {
				// Grafana expands All to the options when the variable
				// has no allValue: the panels then see those values.
				v.Vars["environment_id"] = checkEnvironmentOptions(t, api, d, text, v)
			}
			continue
		}
		n, series, err := RunPromQL(api, text, q.Instant, v)
		if err != nil {
			t.Errorf("%s %s: %v\n%s", d.File, q.Where, err, text)
			continue
		}
		if problem := cmp.Or(unnamedSeries(series, q), missingEnvironment(series, unnamedEnvironment)); problem != "" {
			t.Errorf("%s %s: %s\n%s", d.File, q.Where, problem, text)
		}
		if n > 0 {
			ran++
		}
	}
	return ran
}

// missingEnvironment says why series, when some carry an environment_id,
// do not show the environment id by its ID (a series with environment_id
// and environment both id), "" when they do or carry no environment.
func missingEnvironment(series []model.Metric, id string) string {
	var envs []string
	for _, m := range series {
		env, ok := m["environment_id"]
		if !ok {
			continue
		}
		if string(env) == id && string(m["environment"]) == id {
			return ""
		}
		envs = append(envs, fmt.Sprintf("%s=%s", env, m["environment"]))
	}
	if envs == nil {
		return ""
	}
	return fmt.Sprintf("environment %s (no cdn_environment_info) is missing or not shown by its ID: got %v", id, envs)
}

// checkEnvironmentOptions resolves a dashboard's environment variable: its
// options show property/name and expand to the IDs, the renamed
// environment under both names, the one without info by its ID; its All
// covers that one too. It returns the options' values.
func checkEnvironmentOptions(t *testing.T, api promv1.API, d Dashboard, q string, v Values) []string {
	t.Helper()
	variable, _ := d.Variable("environment_id")
	opts, err := promQueryResultOptions(api, q, variable.Regex, v)
	if err != nil {
		t.Fatalf("%s: %v", d.File, err)
	}
	got := make([]string, len(opts))
	var vals []string
	for i, o := range opts {
		got[i] = o.Text + "=" + o.Value
		if !slices.Contains(vals, o.Value) {
			vals = append(vals, o.Value)
		}
	}
	sort.Strings(got)
	if want := []string{"env-c=env-c", "shop/alpha=env-a", "shop/beta-renamed=env-b", "shop/beta=env-b"}; !slices.Equal(got, want) {
		t.Errorf("%s: environment options %v, want %v", d.File, got, want)
	}
	v.Vars = maps.Clone(v.Vars)
	v.Vars["environment_id"] = vals
	all, err := variableValue(d, Query{Language: PromQL}, "environment_id", "", v)
	if err != nil {
		t.Fatal(err)
	}
	re, err := regexp.Compile("^(?:" + strings.ReplaceAll(all, `\\`, `\`) + ")$")
	if err != nil {
		t.Fatalf("%s: All expands to %q: %v", d.File, all, err)
	}
	if !re.MatchString(unnamedEnvironment) {
		t.Errorf("%s: All expands to %q, which leaves out %s", d.File, all, unnamedEnvironment)
	}
	return vals
}

// TestDashboardSQLNames: on a real ClickHouse 18.16, the access logs
// dashboard names environments from the exporter's environments table by
// their latest row (a renamed environment under its new name), and shows
// the ID of an environment the table does not name, in its variable and in
// its table of requests.
func TestDashboardSQLNames(t *testing.T) {
	ch := testenv.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := clickhouse.Open(ctx, ch.DSN(ch.NewDatabase(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, stmt := range accessLogsDDL(t, db.Database(), db.Version(), accesslog.Fields()) {
		if err := db.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Exec(ctx, accessLogRows(db, 200, time.Now().Truncate(time.Second))); err != nil {
		t.Fatal(err)
	}
	spec := inventorytables.EnvironmentsTable()
	for _, stmt := range clickhouse.CreateStatements(db.Database(), "", db.Version(), spec) {
		if err := db.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	cols := []string{"environment_id", "environment", "property_id", "property", "organization_id", "seen_at", "version"}
	at := time.Now().UTC().Truncate(time.Second)
	for _, row := range [][]any{{"env-a", "production", "p-1", "shop", "o-1", at, uint64(1)}, {"env-a", "production-eu", "p-1", "shop", "o-1", at, uint64(2)}} {
		if err := db.Insert(ctx, spec.Name, cols, [][]any{row}); err != nil {
			t.Fatal(err)
		}
	}
	d := dashboardFile(t, "access-logs.json")
	qs, err := d.Queries()
	if err != nil {
		t.Fatal(err)
	}
	v := allSelected(testValues())
	for _, q := range qs {
		var want []string
		switch q.Where {
		case "variable environment_id":
			want = []string{"env-a=shop/production-eu", "env-b=env-b"}
		case `panel "Slowest requests" target A`:
			want = []string{"env-b", "shop/production-eu"}
		default:
			continue
		}
		sql, err := Expand(d, q, v)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := db.Conn().Query(ctx, sql)
		if err != nil {
			t.Fatalf("%s: %v\n%s", q.Where, err, sql)
		}
		seen := map[string]bool{}
		names := slices.Index(rows.Columns(), "environment")
		for rows.Next() {
			vals := make([]any, len(rows.Columns()))
			for i, ct := range rows.ColumnTypes() {
				vals[i] = reflect.New(ct.ScanType()).Interface()
			}
			if err := rows.Scan(vals...); err != nil {
				t.Fatal(err)
			}
			name := *vals[names].(*string)
			if q.Variable {
				name = *vals[0].(*string) + "=" + name
			}
			seen[name] = true
		}
		rows.Close()
		got := slices.Sorted(maps.Keys(seen))
		if !slices.Equal(got, want) {
			t.Errorf("%s: environments %v, want %v", q.Where, got, want)
		}
	}
}
