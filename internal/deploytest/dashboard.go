package deploytest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/common/model"
)

// Datasource types the dashboards use.
const (
	TypePrometheus = "prometheus"
	TypeClickHouse = "grafana-clickhouse-datasource"
)

// LogDeliveryDashboard is the dashboard of the receiver's reconciliation,
// whose panels need settled buckets (TestDashboardsEndToEnd leaves it to
// the reconciliation's own end-to-end test).
const LogDeliveryDashboard = "log-delivery.json"

// Language is what a query is written in.
type Language string

// The languages of the dashboards' queries.
const (
	PromQL        Language = "promql"
	ClickHouseSQL Language = "clickhouse-sql"
)

// Dashboard is the part of a Grafana dashboard JSON model the checks read.
type Dashboard struct {
	File          string `json:"-"`
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []Variable `json:"list"`
	} `json:"templating"`
	Panels []Panel `json:"panels"`
}

// DatasourceRef points a panel, target or variable at a datasource.
type DatasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// Variable is a dashboard template variable.
type Variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"` // query, datasource, custom, interval, constant
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *DatasourceRef  `json:"datasource"`
	Multi      bool            `json:"multi"`
	IncludeAll bool            `json:"includeAll"`
	AllValue   string          `json:"allValue"`
	// Regex filters and shapes the options (Grafana's "/…/" form, with the
	// named groups text and value, or a first group).
	Regex string `json:"regex"`
}

// QueryText returns the variable's query: a string, or the "query" member of
// the object form newer Grafana versions write.
func (v Variable) QueryText() string {
	var s string
	if err := json.Unmarshal(v.Query, &s); err == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &o); err == nil {
		return o.Query
	}
	return ""
}

// Panel is a dashboard panel; rows hold nested panels when collapsed.
type Panel struct {
	ID         int            `json:"id"`
	Title      string         `json:"title"`
	Type       string         `json:"type"`
	Datasource *DatasourceRef `json:"datasource"`
	Interval   string         `json:"interval"`
	Targets    []Target       `json:"targets"`
	Panels     []Panel        `json:"panels"`
}

// Target is one query of a panel (Prometheus or ClickHouse plugin fields).
type Target struct {
	RefID      string          `json:"refId"`
	Datasource *DatasourceRef  `json:"datasource"`
	Hide       bool            `json:"hide"`
	Expr       string          `json:"expr"`         // Prometheus
	Instant    bool            `json:"instant"`      // Prometheus
	Legend     string          `json:"legendFormat"` // Prometheus
	RawSQL     string          `json:"rawSql"`       // ClickHouse
	EditorType string          `json:"editorType"`
	Format     json.RawMessage `json:"format"` // "table" (Prometheus) or 0/1 (ClickHouse)
	QueryType  string          `json:"queryType"`
}

// Query is one query a dashboard runs: a panel target or a variable's query.
type Query struct {
	Dashboard string   // file name
	Where     string   // panel title and refId, or "variable NAME"
	Language  Language // PromQL or ClickHouseSQL
	Text      string   // as written in the dashboard, before substitution
	Instant   bool     // an instant query (tables, stats of $__range)
	Variable  bool     // the query of a template variable
	Legend    string   // the legend format of a Prometheus target
}

// LoadDashboards reads every *.json file of dir.
func LoadDashboards(dir string) ([]Dashboard, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, fmt.Errorf("list dashboards: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no dashboards in %s", dir)
	}
	sort.Strings(files)
	out := make([]Dashboard, 0, len(files))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read dashboard: %w", err)
		}
		var d Dashboard
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("parse dashboard %s: %w", f, err)
		}
		d.File = filepath.Base(f)
		out = append(out, d)
	}
	return out, nil
}

// AllPanels returns every panel, rows' nested panels included, in order.
func (d Dashboard) AllPanels() []Panel {
	var out []Panel
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// Variable returns the template variable name.
func (d Dashboard) Variable(name string) (Variable, bool) {
	for _, v := range d.Templating.List {
		if v.Name == name {
			return v, true
		}
	}
	return Variable{}, false
}

// datasourceType resolves a datasource reference to a plugin type: a
// reference to a datasource variable (uid "${DS_X}") takes the variable's
// plugin type (its query).
func (d Dashboard) datasourceType(ref *DatasourceRef) (string, error) {
	if ref == nil {
		return "", errors.New("no datasource")
	}
	if name, ok := variableReference(ref.UID); ok {
		v, found := d.Variable(name)
		if !found || v.Type != "datasource" {
			return "", fmt.Errorf("datasource uid %q names no datasource variable", ref.UID)
		}
		if t := v.QueryText(); ref.Type != "" && ref.Type != t {
			return "", fmt.Errorf("datasource type %q disagrees with variable %s (%s)", ref.Type, name, t)
		}
		return v.QueryText(), nil
	}
	if ref.Type == "" {
		return "", fmt.Errorf("datasource %q has no type", ref.UID)
	}
	return ref.Type, nil
}

// variableReference reports the variable name of "$x" or "${x}".
func variableReference(s string) (string, bool) {
	if n, ok := strings.CutPrefix(s, "${"); ok && strings.HasSuffix(n, "}") {
		return strings.TrimSuffix(n, "}"), true
	}
	if n, ok := strings.CutPrefix(s, "$"); ok && n != "" {
		return n, true
	}
	return "", false
}

func languageOf(dsType string) (Language, error) {
	switch dsType {
	case TypePrometheus:
		return PromQL, nil
	case TypeClickHouse:
		return ClickHouseSQL, nil
	}
	return "", fmt.Errorf("unsupported datasource type %q", dsType)
}

// Queries lists every query of the dashboard: each visible panel target and
// each query variable. A target without a datasource takes its panel's.
func (d Dashboard) Queries() ([]Query, error) {
	var out []Query
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		t, err := d.datasourceType(v.Datasource)
		if err != nil {
			return nil, fmt.Errorf("%s variable %s: %w", d.File, v.Name, err)
		}
		lang, err := languageOf(t)
		if err != nil {
			return nil, fmt.Errorf("%s variable %s: %w", d.File, v.Name, err)
		}
		out = append(out, Query{Dashboard: d.File, Where: "variable " + v.Name, Language: lang, Text: v.QueryText(), Variable: true})
	}
	for _, p := range d.AllPanels() {
		for _, tg := range p.Targets {
			if tg.Hide {
				continue
			}
			ref := tg.Datasource
			if ref == nil {
				ref = p.Datasource
			}
			where := fmt.Sprintf("panel %q target %s", p.Title, tg.RefID)
			t, err := d.datasourceType(ref)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", d.File, where, err)
			}
			lang, err := languageOf(t)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", d.File, where, err)
			}
			q := Query{Dashboard: d.File, Where: where, Language: lang, Instant: tg.Instant, Legend: tg.Legend}
			switch lang {
			case PromQL:
				q.Text = tg.Expr
			case ClickHouseSQL:
				q.Text = tg.RawSQL
				q.Instant = string(tg.Format) == clickHouseFormatTable
			}
			out = append(out, q)
		}
	}
	return out, nil
}

// clickHouseFormatTable is the ClickHouse plugin's "format" value of a table
// query (0 is time series).
const clickHouseFormatTable = "1"

var (
	labelValuesOf = regexp.MustCompile(`^\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$`)
	labelValues   = regexp.MustCompile(`^\s*label_values\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$`)
	queryResult   = regexp.MustCompile(`^\s*query_result\((.*)\)\s*$`)
)

// LabelValuesQuery splits Grafana's label_values(selector, label) into its
// parts; selector is empty for label_values(label). ok is false for any
// other variable query.
func LabelValuesQuery(q string) (selector, label string, ok bool) {
	if m := labelValuesOf.FindStringSubmatch(q); m != nil {
		return strings.TrimSpace(m[1]), m[2], true
	}
	if m := labelValues.FindStringSubmatch(q); m != nil {
		return "", m[1], true
	}
	return "", "", false
}

// Option is one option of a template variable: what the picker shows and
// what the variable expands to.
type Option struct {
	Text, Value string
}

// QueryResultOptions returns the options Grafana makes of the samples of a
// query_result(expr) variable: each sample is the line
// `name{label="value",…} value timestamp_ms` (labels in the order
// Prometheus returns them: sorted), filtered and shaped by the variable's
// regex ("/…/"; named groups text and value, else the first group is both,
// else the whole line). Options are de-duplicated by text, as Grafana does.
func QueryResultOptions(samples model.Vector, regex string) ([]Option, error) {
	re, err := variableRegex(regex)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []Option
	for _, s := range samples {
		o, ok := lineOption(sampleLine(s), re)
		if !ok || seen[o.Text] {
			continue
		}
		seen[o.Text] = true
		out = append(out, o)
	}
	return out, nil
}

// variableRegex compiles a variable's regex ("/…/"), or returns nil for
// none.
func variableRegex(regex string) (*regexp.Regexp, error) {
	if regex == "" {
		return nil, nil
	}
	expr := strings.TrimPrefix(strings.TrimSuffix(regex, "/"), "/")
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("variable regex %s: %w", regex, err)
	}
	return re, nil
}

// sampleLine returns the line query_result makes of a sample:
// `name{label="value",…} value timestamp_ms`, labels sorted.
func sampleLine(s *model.Sample) string {
	names := make([]string, 0, len(s.Metric))
	for k := range s.Metric {
		if k != model.MetricNameLabel {
			names = append(names, string(k))
		}
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = k + `="` + string(s.Metric[model.LabelName(k)]) + `"`
	}
	return fmt.Sprintf("%s{%s} %s %d", s.Metric[model.MetricNameLabel], strings.Join(parts, ","), s.Value, int64(s.Timestamp))
}

// lineOption returns the option the variable regex re (nil: none) makes of
// line, or false when re does not match it.
func lineOption(line string, re *regexp.Regexp) (Option, bool) {
	if re == nil {
		return Option{Text: line, Value: line}, true
	}
	m := re.FindStringSubmatch(line)
	if m == nil {
		return Option{}, false
	}
	text, value := re.SubexpIndex("text"), re.SubexpIndex("value")
	switch {
	case text > 0 || value > 0:
		return namedGroupsOption(m, text, value), true
	case len(m) > 1:
		return Option{Text: m[1], Value: m[1]}, true
	}
	return Option{Text: line, Value: line}, true
}

// namedGroupsOption returns the option of the match m of a regex with a
// group named text (index text, or <= 0 when none) or value, or both: a
// missing one is the other.
func namedGroupsOption(m []string, text, value int) Option {
	switch {
	case text <= 0:
		return Option{Text: m[value], Value: m[value]}
	case value <= 0:
		return Option{Text: m[text], Value: m[text]}
	}
	return Option{Text: m[text], Value: m[value]}
}

// QueryResultExpr returns the expression of a query_result(expr) variable
// query, and false for any other query.
func QueryResultExpr(q string) (string, bool) {
	if m := queryResult.FindStringSubmatch(q); m != nil {
		return strings.TrimSpace(m[1]), true
	}
	return "", false
}

// PromQLOfVariable turns a Prometheus variable query (Grafana's
// label_values(selector, label), label_values(label), query_result(expr))
// into a PromQL query with the same series: what Grafana asks the label
// values API, as a query that can be run and checked for results.
func PromQLOfVariable(q string) string {
	if m := labelValuesOf.FindStringSubmatch(q); m != nil {
		return fmt.Sprintf("count by (%s) (%s)", m[2], strings.TrimSpace(m[1]))
	}
	if m := labelValues.FindStringSubmatch(q); m != nil {
		return fmt.Sprintf(`count by (%s) ({%s!=""})`, m[1], m[1])
	}
	if m := queryResult.FindStringSubmatch(q); m != nil {
		return strings.TrimSpace(m[1])
	}
	return q
}
