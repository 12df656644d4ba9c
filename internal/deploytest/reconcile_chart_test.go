package deploytest

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// receiverArgs renders the chart with the production values and extra
// values, and returns the receiver container's arguments.
func receiverArgs(t *testing.T, values string) []string {
	t.Helper()
	m := render(t, chartDir+"/ci/production-values.yaml", valuesFile(t, values))
	return workloadOf(t, m, "StatefulSet", releaseName+"-edgepipe-receiver").Spec.Template.Spec.Containers[0].Args
}

// TestChartReconcileArgs: with ClickHouse the receiver's replicas count
// records in access_logs and the first one compares; several replicas
// without ClickHouse turn reconciliation off (each sees part of a bucket);
// one replica counts its spool; simulate mode reconciles each replica's own
// simulator; the downsampling percent reaches the flag.
func TestChartReconcileArgs(t *testing.T) {
	leader := "--reconcile.leader=" + releaseName + "-edgepipe-receiver-0"
	for _, tc := range []struct {
		name   string
		values string
		want   []string
		absent []string
	}{
		{"ClickHouse and autoscaling", "{}", []string{"--reconcile.delay=30m", "--reconcile.counts=clickhouse", leader}, nil},
		{"ClickHouse with one replica and another delay", "receiver: {replicas: 1, autoscaling: {enabled: false}, reconcile: {delay: 12m}}",
			[]string{"--reconcile.delay=12m", "--reconcile.counts=clickhouse", leader}, nil},
		{"several replicas without ClickHouse", "clickhouse: {enabled: false}\nreceiver: {replicas: 2, autoscaling: {enabled: false}}",
			[]string{"--reconcile.delay=0s"}, []string{"--reconcile.counts=clickhouse", leader}},
		{"autoscaled without ClickHouse", "clickhouse: {enabled: false}", []string{"--reconcile.delay=0s"}, nil},
		{"one replica without ClickHouse", "clickhouse: {enabled: false}\nreceiver: {replicas: 1, autoscaling: {enabled: false}}",
			[]string{"--reconcile.delay=30m"}, []string{"--reconcile.counts=clickhouse", leader}},
		{"turned off", "receiver: {reconcile: {delay: 0s}}", []string{"--reconcile.delay=0s"}, []string{"--reconcile.counts=clickhouse"}},
		{"simulated with two replicas", "simulate: true\nclickhouse: {enabled: false}\nreceiver: {replicas: 2, autoscaling: {enabled: false}}",
			[]string{"--reconcile.delay=30m"}, []string{"--reconcile.counts=clickhouse"}},
		{"downsampled", "receiver: {downsamplingPercent: 25}", []string{"--profile.downsampling-percent=25"}, nil},
		{"downsampled a tenth of a percent", "receiver: {downsamplingPercent: 0.1}", []string{"--profile.downsampling-percent=0.1"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := receiverArgs(t, tc.values)
			for _, w := range tc.want {
				if !slices.Contains(args, w) {
					t.Errorf("no %s in %v", w, args)
				}
			}
			for _, a := range tc.absent {
				if slices.Contains(args, a) {
					t.Errorf("%s in %v", a, args)
				}
			}
			if n := len(slices.DeleteFunc(slices.Clone(args), func(a string) bool { return !strings.HasPrefix(a, "--reconcile.delay=") })); n != 1 {
				t.Errorf("%d --reconcile.delay flags", n)
			}
		})
	}
	for _, tc := range []struct{ name, set, want string }{
		{"a downsampling percent the platform refuses", "receiver.downsamplingPercent=10", "downsamplingPercent"},
		{"a delay that is no duration", "receiver.reconcile.delay=half an hour", "delay"},
		{"a completeness ratio above 1", "metrics.prometheusRule.logCompletenessRatio=2", "logCompletenessRatio"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helm(t, "template", releaseName, chartDir, "--kube-version", kubeVersion, "--set", tc.set)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm template with %s: %v, want an error about %s", tc.set, err, tc.want)
			}
		})
	}
}

// TestChartLogDeliveryAlert runs EdgepipeLogDeliveryIncomplete through
// `promtool test rules` on series shaped like the receiver's over two hours
// of five-minute comparisons: an environment losing 10% of its batches and
// one losing 5% of its records fire; an exact one, a sampled one
// (reconciled at its share) and one whose single bucket was short until
// its late records came do not; neither does an environment with no bucket
// compared, nor the second replica of a ClickHouse-counted set, which
// publishes nothing.
func TestChartLogDeliveryAlert(t *testing.T) {
	_, rules := alertRules(t)
	r := rules["EdgepipeLogDeliveryIncomplete"]
	if r == nil {
		t.Fatal("the chart has no EdgepipeLogDeliveryIncomplete alert")
	}
	const pod = `namespace="edgepipe",pod="ci-edgepipe-receiver-0"`
	// counter returns 25 samples (2 hours, one per 5 minutes) of a counter
	// growing by the per-bucket values, the last one repeating.
	counter := func(per ...int) string {
		var out []string
		sum := 0
		for i := range 25 {
			sum += per[min(i, len(per)-1)]
			out = append(out, strconv.Itoa(sum))
		}
		return strings.Join(out, " ")
	}
	series := func(metric, env string, values string) map[string]string {
		return map[string]string{"series": metric + `{` + pod + `,environment_id="` + env + `"}`, "values": values}
	}
	rec, api := "edgepipe_rtld_reconciled_log_records_total", "edgepipe_rtld_reconciled_api_requests_total"
	// The late environment: the bucket compared at 30m short by 60 records
	// (5% of an hour's), which arrive 10 minutes later.
	late := make([]int, 25)
	for i := range late {
		late[i] = 100
	}
	late[6], late[8] = 40, 160
	input := []map[string]string{
		series(api, "lost-batches", counter(1000)), series(rec, "lost-batches", counter(900)),
		series(api, "dropped-records", counter(1000)), series(rec, "dropped-records", counter(950)),
		series(api, "exact", counter(1000)), series(rec, "exact", counter(1000)),
		series(api, "sampled", counter(250)), series(rec, "sampled", counter(250)),
		series(api, "late", counter(100)), series(rec, "late", counter(late...)),
		series(api, "nothing-compared", counter(0)), series(rec, "nothing-compared", counter(0)),
	}
	alert := func(env string) map[string]any {
		return map[string]any{"exp_labels": map[string]string{"severity": "warning", "namespace": "edgepipe", "environment_id": env}}
	}
	tests := map[string]any{
		"rule_files":          []string{"rules.yml"},
		"evaluation_interval": "1m",
		"tests": []map[string]any{{
			"interval":     "5m",
			"input_series": input,
			"alert_rule_test": []map[string]any{
				{"eval_time": "10m", "alertname": "EdgepipeLogDeliveryIncomplete", "exp_alerts": []any{}}, // pending: for 15m
				// The late environment's dip (30m to 40m) stays pending.
				{"eval_time": "38m", "alertname": "EdgepipeLogDeliveryIncomplete", "exp_alerts": []any{alert("dropped-records"), alert("lost-batches")}},
				{"eval_time": "2h", "alertname": "EdgepipeLogDeliveryIncomplete", "exp_alerts": []any{alert("dropped-records"), alert("lost-batches")}},
			},
		}},
	}
	// Drop the annotations from the comparison (promtool check rules
	// validates them in assertAlertRules).
	spec := prometheusRule(t, render(t, chartDir+"/ci/production-values.yaml"))
	for _, g := range spec.Groups {
		for _, rule := range g.Rules {
			delete(rule, "annotations")
		}
	}
	promtoolTestRules(t, spec.file(t), tests)
}
