package deploytest

import (
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
