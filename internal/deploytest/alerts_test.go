package deploytest

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// ruleSpec is the spec of a PrometheusRule: a Prometheus rule file.
type ruleSpec struct {
	Groups []struct {
		Name  string           `yaml:"name"`
		Rules []map[string]any `yaml:"rules"`
	} `yaml:"groups"`
}

// prometheusRule returns the spec of the one PrometheusRule in m.
func prometheusRule(t *testing.T, m manifests) ruleSpec {
	t.Helper()
	objs := m.ofKind("PrometheusRule")
	if len(objs) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(objs))
	}
	var pr struct {
		Spec ruleSpec `yaml:"spec"`
	}
	objs[0].decode(t, &pr)
	return pr.Spec
}

// file marshals the spec into a rule file for Prometheus and promtool.
func (s ruleSpec) file(t *testing.T) []byte {
	t.Helper()
	out, err := yaml.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// alertRules renders the chart's PrometheusRule (production values enable
// it) and returns its spec as a rule file for Prometheus and promtool, and
// its rules by alert name.
func alertRules(t *testing.T) (ruleFile []byte, rules map[string]map[string]any) {
	t.Helper()
	spec := prometheusRule(t, render(t, chartDir+"/ci/production-values.yaml"))
	rules = map[string]map[string]any{}
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			rules[fmt.Sprint(r["alert"])] = r
		}
	}
	return spec.file(t), rules
}

// exporterSelector returns the namespace and a pod name the exporter
// group's matchers select (namespace="…", pod=~"<fullname>-.*").
func exporterSelector(t *testing.T, expr string) (namespace, pod string) {
	t.Helper()
	ns := regexp.MustCompile(`namespace="([^"]+)"`).FindStringSubmatch(expr)
	p := regexp.MustCompile(`pod=~"([^"]+)-\.\*"`).FindStringSubmatch(expr)
	if ns == nil || p == nil {
		t.Fatalf("no namespace/pod matchers in %s", expr)
	}
	return ns[1], p[1] + "-6f9c7d5b8-x2x9z"
}

// promtoolTestRules runs `promtool test rules` on tests (a test file, or
// what marshals into one, whose rule_files is [rules.yml]) against rules.
func promtoolTestRules(t *testing.T, rules []byte, tests any) {
	t.Helper()
	testFile, ok := tests.([]byte)
	if !ok {
		var err error
		if testFile, err = yaml.Marshal(tests); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	for name, b := range map[string][]byte{"rules.yml": rules, "tests.yml": testFile} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(testenv.Promtool(t), "test", "rules", "tests.yml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s\n--- tests.yml ---\n%s\n--- rules.yml ---\n%s", err, out, testFile, rules)
	}
}

// expand fills in the {{ $labels.x }} of an annotation as Prometheus would.
func expand(s string, labels map[string]string) string {
	return regexp.MustCompile(`\{\{ \$labels\.(\w+) \}\}`).ReplaceAllStringFunc(s, func(m string) string {
		return labels[regexp.MustCompile(`\$labels\.(\w+)`).FindStringSubmatch(m)[1]]
	})
}

// TestAuthFailingAlert is issue 11's auth finding. With promtool test rules
// on the chart's rendered rules: a token endpoint that refuses every
// request fires EdgepipeAuthFailing (and the discovery and dataset alerts),
// a single refused token among successes does not. Then, live: the real
// exporter with a wrong client secret, scraped by a real Prometheus that
// adds the namespace and pod labels as the Prometheus Operator does, makes
// every one of those alert expressions true.
func TestAuthFailingAlert(t *testing.T) {
	ruleFile, rules := alertRules(t)
	for _, name := range []string{"EdgepipeAuthFailing", "EdgepipeDiscoveryFailing", "EdgepipeDatasetPollFailing", "EdgepipeInvalidData"} {
		if rules[name] == nil {
			t.Fatalf("the chart has no %s alert", name)
		}
	}
	ns, pod := exporterSelector(t, fmt.Sprint(rules["EdgepipeAuthFailing"]["expr"]))

	// promtool test rules.
	series := func(name string, labels map[string]string, values string) map[string]string {
		var ls []string
		for _, k := range []string{"namespace", "pod", "service", "method", "status", "dataset"} {
			if v, ok := labels[k]; ok {
				ls = append(ls, fmt.Sprintf("%s=%q", k, v))
			}
		}
		return map[string]string{"series": name + "{" + strings.Join(ls, ",") + "}", "values": values}
	}
	at := func(kv ...string) map[string]string {
		l := map[string]string{"namespace": ns, "pod": pod}
		for i := 0; i+1 < len(kv); i += 2 {
			l[kv[i]] = kv[i+1]
		}
		return l
	}
	alert := func(name string, labels map[string]string) map[string]any {
		exp := map[string]string{}
		for k, v := range labels {
			exp[k] = v
		}
		r := rules[name]
		exp["severity"] = fmt.Sprint(r["labels"].(map[string]any)["severity"])
		ann := map[string]string{}
		for k, v := range r["annotations"].(map[string]any) {
			ann[k] = expand(fmt.Sprint(v), labels)
		}
		return map[string]any{"exp_labels": exp, "exp_annotations": ann}
	}
	wrongSecret := at("service", "auth", "method", "POST", "status", "401")
	tests := map[string]any{
		"rule_files":          []string{"rules.yml"},
		"evaluation_interval": "1m",
		"tests": []map[string]any{
			{
				// A wrong client secret: every token request is refused,
				// nothing is discovered, the configured datasets stay down.
				"interval": "1m",
				"input_series": []map[string]string{
					series("edgepipe_api_requests_total", wrongSecret, "0+1x40"),
					series("edgepipe_discovery_up", at(), "0x40"),
					series("edgepipe_dataset_up", at("dataset", "edge_errors"), "0x40"),
				},
				"alert_rule_test": []map[string]any{
					{"eval_time": "4m", "alertname": "EdgepipeAuthFailing", "exp_alerts": []any{}}, // pending: for 5m
					{"eval_time": "20m", "alertname": "EdgepipeAuthFailing",
						"exp_alerts": []any{alert("EdgepipeAuthFailing", at("service", "auth"))}},
					{"eval_time": "20m", "alertname": "EdgepipeDiscoveryFailing",
						"exp_alerts": []any{alert("EdgepipeDiscoveryFailing", at())}},
					{"eval_time": "20m", "alertname": "EdgepipeDatasetPollFailing",
						"exp_alerts": []any{alert("EdgepipeDatasetPollFailing", at("dataset", "edge_errors"))}},
				},
			},
			{
				// Healthy, with one token that expired in flight (a 401,
				// then a new token and success): no alert.
				"interval": "1m",
				"input_series": []map[string]string{
					series("edgepipe_api_requests_total", at("service", "auth", "method", "POST", "status", "200"), "0+1x40"),
					series("edgepipe_api_requests_total", at("service", "metrics", "method", "POST", "status", "200"), "0+30x40"),
					series("edgepipe_api_requests_total", at("service", "metrics", "method", "POST", "status", "401"), "0x10 1x30"),
					series("edgepipe_discovery_up", at(), "1x40"),
					series("edgepipe_dataset_up", at("dataset", "edge_errors"), "1x40"),
				},
				"alert_rule_test": []map[string]any{
					{"eval_time": "20m", "alertname": "EdgepipeAuthFailing", "exp_alerts": []any{}},
					{"eval_time": "20m", "alertname": "EdgepipeDiscoveryFailing", "exp_alerts": []any{}},
				},
			},
			{
				// A platform that sends values that are not numbers for
				// over half an hour.
				"interval": "1m",
				"input_series": []map[string]string{
					series("edgepipe_invalid_values_total", at("dataset", "edge_errors", "reason", "null"), "0+5x90"),
					series("edgepipe_invalid_rows_total", at("dataset", "edge_errors", "reason", "arity"), "0x90"),
				},
				"alert_rule_test": []map[string]any{
					{"eval_time": "20m", "alertname": "EdgepipeInvalidData", "exp_alerts": []any{}},
					{"eval_time": "70m", "alertname": "EdgepipeInvalidData",
						"exp_alerts": []any{alert("EdgepipeInvalidData", at("dataset", "edge_errors"))}},
				},
			},
		},
	}
	promtoolTestRules(t, ruleFile, tests)

	// Live: the exporter with a wrong client secret.
	bins := buildCommands(t, "exporter", "platform-sim")
	simAddr, exporterAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	startProgramEnv(t, bins["platform-sim"], []string{"EDGEPIPE_SIM_CLIENT_SECRET=the-right-secret"},
		"--web.listen-address="+simAddr)
	startProgramEnv(t, bins["exporter"], []string{
		"EDGEPIPE_CLIENT_ID=" + platformsim.DemoClientID, "EDGEPIPE_CLIENT_SECRET=not-the-secret",
	}, "--api.url=http://"+simAddr, "--organization-id="+platformsim.DemoOrganizationID,
		"--dataset=edge_errors", "--dataset=origin_errors", "--web.listen-address="+exporterAddr)
	prom := testenv.PrometheusScrape(t, testenv.ScrapeJob{Name: "edgepipe-exporter", Targets: []string{exporterAddr},
		Labels: map[string]string{"namespace": ns, "pod": pod}})
	prom.WaitTargetsUp(t, 60*time.Second)
	want := map[string]int{"EdgepipeAuthFailing": 1, "EdgepipeDiscoveryFailing": 1, "EdgepipeDatasetPollFailing": 2}
	deadline := time.Now().Add(90 * time.Second)
	for {
		got := map[string]int{}
		for name := range want {
			got[name] = len(prom.QueryVector(t, fmt.Sprint(rules[name]["expr"])))
		}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alert expressions true for %v series, want %v", got, want)
		}
		time.Sleep(time.Second)
	}
	vec := prom.QueryVector(t, fmt.Sprint(rules["EdgepipeAuthFailing"]["expr"]))
	if vec[0].Metric["service"] != "auth" {
		t.Errorf("EdgepipeAuthFailing for %v, want the token endpoint (service auth)", vec[0].Metric)
	}
	for _, s := range prom.QueryVector(t, fmt.Sprint(rules["EdgepipeDatasetPollFailing"]["expr"])) {
		t.Logf("EdgepipeDatasetPollFailing: %v", s.Metric)
	}
	if resp, err := http.Get("http://" + exporterAddr + "/readyz"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz: %v %v, want 503", resp, err)
	} else {
		resp.Body.Close()
	}
}

// TestStateNotSavedAlert: with promtool test rules on the chart's rendered
// rules, a dataset whose state cannot be saved fires EdgepipeStateNotSaved
// at once, and stops firing 15 minutes after saving works again.
func TestStateNotSavedAlert(t *testing.T) {
	ruleFile, rules := alertRules(t)
	r := rules["EdgepipeStateNotSaved"]
	if r == nil {
		t.Fatal("the chart has no EdgepipeStateNotSaved alert")
	}
	ns, pod := exporterSelector(t, fmt.Sprint(r["expr"]))
	labels := map[string]string{"namespace": ns, "pod": pod, "dataset": "edge_errors"}
	ann := map[string]string{}
	for k, v := range r["annotations"].(map[string]any) {
		ann[k] = expand(fmt.Sprint(v), labels)
	}
	exp := map[string]string{"severity": fmt.Sprint(r["labels"].(map[string]any)["severity"])}
	for k, v := range labels {
		exp[k] = v
	}
	firing := []any{map[string]any{"exp_labels": exp, "exp_annotations": ann}}
	tests := map[string]any{
		"rule_files":          []string{"rules.yml"},
		"evaluation_interval": "1m",
		"tests": []map[string]any{{
			"interval": "1m",
			"input_series": []map[string]string{{
				// Saved fine for 10 minutes, then 5 failed saves, then fine.
				"series": fmt.Sprintf(`edgepipe_state_save_failures_total{namespace=%q,pod=%q,dataset="edge_errors"}`, ns, pod),
				"values": "0x10 1+1x4 5x40",
			}},
			"alert_rule_test": []map[string]any{
				{"eval_time": "9m", "alertname": "EdgepipeStateNotSaved", "exp_alerts": []any{}},
				{"eval_time": "13m", "alertname": "EdgepipeStateNotSaved", "exp_alerts": firing},
				{"eval_time": "40m", "alertname": "EdgepipeStateNotSaved", "exp_alerts": []any{}},
			},
		}},
	}
	promtoolTestRules(t, ruleFile, tests)
}

// TestSeriesLimitAlert: with promtool test rules on the chart's rendered
// rules, label sets refused by the series budget for 15 minutes fire
// EdgepipeSeriesLimitReached for their dataset, and a budget reached once
// and then no longer does not. Then, live: the real exporter with
// --prometheus.max-series far below the need, scraped by a real Prometheus
// with the Operator's labels, makes the alert expression true.
func TestSeriesLimitAlert(t *testing.T) {
	ruleFile, rules := alertRules(t)
	r := rules["EdgepipeSeriesLimitReached"]
	if r == nil {
		t.Fatal("the chart has no EdgepipeSeriesLimitReached alert")
	}
	ns, pod := exporterSelector(t, fmt.Sprint(r["expr"]))
	series := func(dataset, values string) map[string]string {
		return map[string]string{"series": fmt.Sprintf(`edgepipe_series_limit_dropped_total{namespace=%q,pod=%q,dataset=%q}`, ns, pod, dataset),
			"values": values}
	}
	labels := map[string]string{"namespace": ns, "pod": pod, "dataset": "edge_usage_by_country"}
	ann := map[string]string{}
	for k, v := range r["annotations"].(map[string]any) {
		ann[k] = expand(fmt.Sprint(v), labels)
	}
	exp := map[string]string{"severity": fmt.Sprint(r["labels"].(map[string]any)["severity"])}
	for k, v := range labels {
		exp[k] = v
	}
	tests := map[string]any{
		"rule_files":          []string{"rules.yml"},
		"evaluation_interval": "1m",
		"tests": []map[string]any{{
			"interval": "1m",
			"input_series": []map[string]string{
				series("edge_usage_by_country", "0+31x60"), // refused at every poll
				series("edge_errors", "0 5 5x58"),          // once, then room
			},
			"alert_rule_test": []map[string]any{
				{"eval_time": "10m", "alertname": "EdgepipeSeriesLimitReached", "exp_alerts": []any{}}, // pending
				{"eval_time": "40m", "alertname": "EdgepipeSeriesLimitReached",
					"exp_alerts": []any{map[string]any{"exp_labels": exp, "exp_annotations": ann}}},
			},
		}},
	}
	promtoolTestRules(t, ruleFile, tests)

	// Live: a budget of 2,000 series for an organization that needs ~40,000.
	bins := buildCommands(t, "exporter")
	exporterAddr := testenv.FreeAddr(t)
	startProgram(t, bins["exporter"], "--simulate", "--web.listen-address="+exporterAddr,
		"--prometheus.max-series=2000", "--poll-interval=2s", "--poll.jitter=0s")
	prom := testenv.PrometheusScrape(t, testenv.ScrapeJob{Name: "edgepipe-exporter", Targets: []string{exporterAddr},
		Labels: map[string]string{"namespace": ns, "pod": pod}})
	prom.WaitTargetsUp(t, 60*time.Second)
	deadline := time.Now().Add(90 * time.Second)
	for {
		vec := prom.QueryVector(t, fmt.Sprint(r["expr"]))
		if len(vec) > 0 {
			t.Logf("EdgepipeSeriesLimitReached for %d datasets, e.g. %v", len(vec), vec[0].Metric)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the alert expression stayed false with the budget far below the need")
		}
		time.Sleep(time.Second)
	}
	// The budget bounds the datasets' series; the inventory's (one per
	// environment, three per certificate) come on top.
	if v := prom.QueryVector(t, `count({__name__=~"cdn_.+", __name__!~"cdn_environment_info|cdn_tls_certificate_.+"})`); len(v) != 1 || v[0].Value > 2000 {
		t.Errorf("Prometheus stored %v cdn series of datasets, budget 2000", v)
	}
}
