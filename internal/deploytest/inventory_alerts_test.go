package deploytest

import (
	"fmt"
	"strings"
	"testing"
)

// TestTLSCertificateAlerts runs promtool test rules on the chart's rendered
// rules with the exporter's inventory series, from two replicas (every
// cdn_environment_info twice, which a bare group_left refuses as
// many-to-many): a certificate 20 days from expiry fires
// EdgepipeTLSCertificateExpiringSoon with its environment's name and the
// time left, one 30 days away does not, nor one 20 days away that was
// renewed; a certificate whose activation failed fires
// EdgepipeTLSCertificateActivationFailed under its environment's new name
// after a rename, one that activated does not. Certificates of env-c, which
// has no cdn_environment_info (not discovered yet, the inventory failing,
// relabelling), fire both alerts too, the environment named by its ID.
func TestTLSCertificateAlerts(t *testing.T) {
	ruleFile, rules := alertRules(t)
	for _, name := range []string{"EdgepipeTLSCertificateExpiringSoon", "EdgepipeTLSCertificateActivationFailed"} {
		if rules[name] == nil {
			t.Fatalf("the chart has no %s alert", name)
		}
	}
	ns, pod := exporterSelector(t, fmt.Sprint(rules["EdgepipeTLSCertificateExpiringSoon"]["expr"]))
	pod2 := strings.TrimSuffix(pod, "x2x9z") + "q7w4k"
	day := 86400
	in := func(name string, values string, kv ...string) map[string]string {
		ls := []string{fmt.Sprintf("namespace=%q", ns)}
		for i := 0; i+1 < len(kv); i += 2 {
			ls = append(ls, fmt.Sprintf("%s=%q", kv[i], kv[i+1]))
		}
		return map[string]string{"series": name + "{" + strings.Join(ls, ",") + "}", "values": values}
	}
	info := func(p, env, name, values string) map[string]string {
		return in("cdn_environment_info", values, "pod", p, "environment_id", env, "environment", name, "property_id", "p-1", "property", "shop", "organization_id", "o-1")
	}
	expiry := func(p, env, cert string, values string) map[string]string {
		return in("cdn_tls_certificate_expiry_timestamp_seconds", values, "pod", p, "environment_id", env, "certificate_id", cert, "common_name", cert+".example.com")
	}
	certInfo := func(p, env, cert, status string) map[string]string {
		return in("cdn_tls_certificate_info", "1x60", "pod", p, "environment_id", env, "certificate_id", cert, "common_name", cert+".example.com",
			"serial", "0A", "status", status, "generated", "true")
	}
	failed := func(p, env, cert, values string) map[string]string {
		return in("cdn_tls_certificate_activation_failed", values, "pod", p, "environment_id", env, "certificate_id", cert)
	}
	alert := func(name, value string, labels map[string]string) map[string]any {
		r := rules[name]
		exp := map[string]string{"severity": fmt.Sprint(r["labels"].(map[string]any)["severity"])}
		for k, v := range labels {
			exp[k] = v
		}
		ann := map[string]string{}
		for k, v := range r["annotations"].(map[string]any) {
			ann[k] = strings.ReplaceAll(expand(fmt.Sprint(v), labels), "{{ $value | humanizeDuration }}", value)
		}
		return map[string]any{"exp_labels": exp, "exp_annotations": ann}
	}
	twice := func(f func(p string) map[string]string) []map[string]string {
		return []map[string]string{f(pod), f(pod2)}
	}
	var series []map[string]string
	series = append(series, twice(func(p string) map[string]string { return info(p, "env-a", "alpha", "1x60") })...)
	// env-b is renamed at 20m (one replica serves it).
	series = append(series, info(pod, "env-b", "beta", "1x19 _x40"), info(pod, "env-b", "beta-eu", "_x20 1x40"))
	series = append(series, twice(func(p string) map[string]string { return expiry(p, "env-a", "soon", fmt.Sprintf("%dx60", 20*day)) })...)
	series = append(series, twice(func(p string) map[string]string { return expiry(p, "env-a", "later", fmt.Sprintf("%dx60", 30*day)) })...)
	// Renewed at 5m: 20 days left, then a year.
	series = append(series, twice(func(p string) map[string]string {
		return expiry(p, "env-a", "renewed", fmt.Sprintf("%dx4 %dx55", 20*day, 365*day))
	})...)
	series = append(series, expiry(pod, "env-b", "broken", fmt.Sprintf("%dx60", 90*day)), expiry(pod, "env-b", "fine", fmt.Sprintf("%dx60", 90*day)))
	series = append(series, certInfo(pod, "env-b", "broken", "failed"), certInfo(pod, "env-b", "fine", "active"),
		failed(pod, "env-b", "broken", "1x60"), failed(pod, "env-b", "fine", "0x60"))
	series = append(series, twice(func(p string) map[string]string { return expiry(p, "env-c", "c-soon", fmt.Sprintf("%dx60", 20*day)) })...)
	series = append(series, twice(func(p string) map[string]string { return certInfo(p, "env-c", "c-broken", "failed") })...)
	series = append(series, twice(func(p string) map[string]string { return failed(p, "env-c", "c-broken", "1x60") })...)

	soon := map[string]string{"namespace": ns, "environment_id": "env-a", "certificate_id": "soon", "common_name": "soon.example.com",
		"environment": "alpha", "property": "shop"}
	broken := map[string]string{"namespace": ns, "environment_id": "env-b", "certificate_id": "broken", "common_name": "broken.example.com",
		"status": "failed", "environment": "beta-eu", "property": "shop"}
	unnamedSoon := map[string]string{"namespace": ns, "environment_id": "env-c", "certificate_id": "c-soon", "common_name": "c-soon.example.com",
		"environment": "env-c"}
	unnamedBroken := map[string]string{"namespace": ns, "environment_id": "env-c", "certificate_id": "c-broken", "common_name": "c-broken.example.com",
		"status": "failed", "environment": "env-c"}
	tests := map[string]any{
		"rule_files":          []string{"rules.yml"},
		"evaluation_interval": "1m",
		"tests": []map[string]any{{
			"interval":     "1m",
			"input_series": series,
			"alert_rule_test": []map[string]any{
				{"eval_time": "5m", "alertname": "EdgepipeTLSCertificateExpiringSoon", "exp_alerts": []any{}}, // pending: for 10m
				// 20 days minus the 40 minutes gone by.
				{"eval_time": "40m", "alertname": "EdgepipeTLSCertificateExpiringSoon",
					"exp_alerts": []any{alert("EdgepipeTLSCertificateExpiringSoon", "19d 23h 20m 0s", soon),
						alert("EdgepipeTLSCertificateExpiringSoon", "19d 23h 20m 0s", unnamedSoon)}},
				{"eval_time": "5m", "alertname": "EdgepipeTLSCertificateActivationFailed", "exp_alerts": []any{}},
				// Both names are visible from 20m to 24m (the lookback): one
				// is taken; from 25m on only the new one.
				{"eval_time": "40m", "alertname": "EdgepipeTLSCertificateActivationFailed",
					"exp_alerts": []any{alert("EdgepipeTLSCertificateActivationFailed", "", broken),
						alert("EdgepipeTLSCertificateActivationFailed", "", unnamedBroken)}},
			},
		}},
	}
	promtoolTestRules(t, ruleFile, tests)
}
