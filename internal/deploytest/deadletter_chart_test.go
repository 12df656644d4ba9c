package deploytest

import (
	"fmt"
	"testing"
)

// TestChartDeadLetterAlerts runs the chart's dead-letter alerts through
// `promtool test rules` (Debian's prometheus package) on series shaped like
// the receiver's: any stored dead letter fires EdgepipeDeadLetters (and it
// clears once they are replayed), a store over 80% fires
// EdgepipeDeadLetterStoreFilling, and records dropped by a full store fire
// EdgepipeDeadLetterStoreFull. Annotations are left out of the comparison
// (promtool check rules validates them in assertAlertRules).
func TestChartDeadLetterAlerts(t *testing.T) {
	spec := prometheusRule(t, render(t, chartDir+"/ci/production-values.yaml"))
	found := map[string]bool{}
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			delete(r, "annotations")
			if name, _ := r["alert"].(string); name != "" {
				found[name] = true
			}
		}
	}
	for _, name := range []string{"EdgepipeDeadLetters", "EdgepipeDeadLetterStoreFilling", "EdgepipeDeadLetterStoreFull"} {
		if !found[name] {
			t.Fatalf("alert %s missing from the PrometheusRule", name)
		}
	}
	out := spec.file(t)
	const pod = `namespace="edgepipe",pod="ci-edgepipe-receiver-0"`
	tests := `rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # One record set aside at 2m, replayed at 5m.
      - series: 'edgepipe_rtld_dead_letter_stored_records{` + pod + `,sink="kafka"}'
        values: '0 0 1 1 1 0 0'
      - series: 'edgepipe_rtld_dead_letter_bytes{` + pod + `,sink="kafka"}'
        values: '0 0 100 100 900 0 0'
      - series: 'edgepipe_rtld_dead_letter_max_bytes{` + pod + `}'
        values: '1000x6'
      # The store full at 3m: three records dropped.
      - series: 'edgepipe_rtld_dead_letter_dropped_records_total{` + pod + `,sink="clickhouse",reason="code_395"}'
        values: '0 0 0 3 3 3 3'
      # Another namespace's receiver is not ours.
      - series: 'edgepipe_rtld_dead_letter_stored_records{namespace="other",pod="ci-edgepipe-receiver-0",sink="kafka"}'
        values: '5x6'
    alert_rule_test:
      - eval_time: 1m
        alertname: EdgepipeDeadLetters
        exp_alerts: []
      - eval_time: 3m
        alertname: EdgepipeDeadLetters
        exp_alerts:
          - exp_labels: {severity: warning, namespace: edgepipe, pod: ci-edgepipe-receiver-0, sink: kafka}
      - eval_time: 6m
        alertname: EdgepipeDeadLetters
        exp_alerts: []
      - eval_time: 3m
        alertname: EdgepipeDeadLetterStoreFilling
        exp_alerts: []
      - eval_time: 4m
        alertname: EdgepipeDeadLetterStoreFilling
        exp_alerts:
          - exp_labels: {severity: warning, namespace: edgepipe, pod: ci-edgepipe-receiver-0}
      - eval_time: 2m
        alertname: EdgepipeDeadLetterStoreFull
        exp_alerts: []
      - eval_time: 4m
        alertname: EdgepipeDeadLetterStoreFull
        exp_alerts:
          - exp_labels: {severity: critical, namespace: edgepipe, pod: ci-edgepipe-receiver-0, sink: clickhouse}
`
	promtoolTestRules(t, out, []byte(tests))
}

// TestChartLogMetricsSeriesLimitAlert: records left out of the log metrics
// by the series budget for 15 minutes fire
// EdgepipeLogMetricsSeriesLimitReached for their environment; a budget
// reached once, then no longer, does not; another namespace's receiver is
// not ours.
func TestChartLogMetricsSeriesLimitAlert(t *testing.T) {
	ruleFile, rules := alertRules(t)
	r := rules["EdgepipeLogMetricsSeriesLimitReached"]
	if r == nil {
		t.Fatal("the chart has no EdgepipeLogMetricsSeriesLimitReached alert")
	}
	series := func(ns, env, values string) map[string]string {
		return map[string]string{"series": fmt.Sprintf(`edgepipe_rtld_log_metrics_dropped_records_total{namespace=%q,pod="ci-edgepipe-receiver-0",environment_id=%q}`, ns, env),
			"values": values}
	}
	labels := map[string]string{"namespace": "edgepipe", "pod": "ci-edgepipe-receiver-0", "environment_id": "env-a"}
	ann := map[string]string{}
	for k, v := range r["annotations"].(map[string]any) {
		ann[k] = expand(fmt.Sprint(v), labels)
	}
	exp := map[string]string{"severity": "warning"}
	for k, v := range labels {
		exp[k] = v
	}
	tests := map[string]any{
		"rule_files":          []string{"rules.yml"},
		"evaluation_interval": "1m",
		"tests": []map[string]any{{
			"interval": "1m",
			"input_series": []map[string]string{
				series("edgepipe", "env-a", "0+40x60"), // refused at every scrape
				series("edgepipe", "env-b", "0 7x59"),  // once, then room
				series("other", "env-a", "0+40x60"),
			},
			"alert_rule_test": []map[string]any{
				{"eval_time": "10m", "alertname": "EdgepipeLogMetricsSeriesLimitReached", "exp_alerts": []any{}}, // pending
				{"eval_time": "40m", "alertname": "EdgepipeLogMetricsSeriesLimitReached",
					"exp_alerts": []any{map[string]any{"exp_labels": exp, "exp_annotations": ann}}},
			},
		}},
	}
	promtoolTestRules(t, ruleFile, tests)
}
