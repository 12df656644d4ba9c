package deploytest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/edgepipe/edgepipe/internal/doclinks"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// valuesFile writes a values file for render and returns its path.
func valuesFile(t *testing.T, values string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// generic decodes the object's document into nested maps and slices.
func (o object) generic(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	o.decode(t, &m)
	return m
}

// dig returns the value at path in nested maps (nil when absent).
func dig(v any, path ...string) any {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// yamlValue decodes a YAML snippet into nested maps and slices.
func yamlValue(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	return v
}

// The scrape settings the monitor tests set, in the Prometheus Operator's
// spelling; each is rendered verbatim into the endpoint.
const (
	monitorTLSConfig = `
ca:
  secret: {name: edgepipe-tls, key: ca.crt}
serverName: edgepipe.example.internal`
	monitorBasicAuth = `
username: {name: edgepipe-scrape, key: username}
password: {name: edgepipe-scrape, key: password}`
	monitorRelabelings = `
- action: replace
  sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node`
	monitorMetricRelabelings = `
- action: drop
  sourceLabels: [__name__]
  regex: cdn_.*_ttfb_.*`
)

// indent indents every line of s by n spaces.
func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(strings.TrimPrefix(s, "\n"), "\n", "\n"+pad)
}

// TestChartMonitorSettings renders both kinds of monitor with every scrape
// setting, for programs serving TLS with basic auth, and checks each
// endpoint carries them as given, lives in the chosen namespace, still
// selects the release namespace's Services or pods, and has the extra labels.
func TestChartMonitorSettings(t *testing.T) {
	monitor := fmt.Sprintf(`
    enabled: true
    namespace: monitoring
    labels:
      release: kube-prometheus-stack
    tlsConfig:
%s
    basicAuth:
%s
    relabelings:
%s
    metricRelabelings:
%s
`, indent(monitorTLSConfig, 6), indent(monitorBasicAuth, 6), indent(monitorRelabelings, 6), indent(monitorMetricRelabelings, 6))
	m := render(t, valuesFile(t, `
webConfig:
  enabled: true
  tls: true
  basicAuth: true
  tlsSecretName: edgepipe-tls
  config:
    tls_server_config:
      cert_file: /etc/edgepipe/tls/tls.crt
      key_file: /etc/edgepipe/tls/tls.key
    basic_auth_users:
      prometheus: $2y$10$dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0dGVzdHRlc3Q
metrics:
  serviceMonitor:`+monitor+`
  podMonitor:`+monitor))

	want := map[string]any{
		"scheme":            "https",
		"tlsConfig":         yamlValue(t, monitorTLSConfig),
		"basicAuth":         yamlValue(t, monitorBasicAuth),
		"relabelings":       yamlValue(t, monitorRelabelings),
		"metricRelabelings": yamlValue(t, monitorMetricRelabelings),
	}
	ws := m.workloads(t)
	for _, kind := range []string{"ServiceMonitor", "PodMonitor"} {
		objs := m.ofKind(kind)
		if len(objs) != 2 {
			t.Fatalf("%d %ss, want 2 (one per program)", len(objs), kind)
		}
		for _, o := range objs {
			where := kind + " " + o.Metadata.Name
			if o.Metadata.Namespace != "monitoring" {
				t.Errorf("%s: namespace %q, want monitoring", where, o.Metadata.Namespace)
			}
			component := o.Metadata.Labels["app.kubernetes.io/component"]
			if o.Metadata.Labels["release"] != "kube-prometheus-stack" || component == "" {
				t.Errorf("%s: labels %v lack release or component", where, o.Metadata.Labels)
			}
			g := o.generic(t)
			if got := dig(g, "spec", "namespaceSelector", "matchNames"); !reflect.DeepEqual(got, []any{"edgepipe"}) {
				t.Errorf("%s: namespaceSelector.matchNames %v, want [edgepipe] (the release namespace)", where, got)
			}
			key := map[string]string{"ServiceMonitor": "endpoints", "PodMonitor": "podMetricsEndpoints"}[kind]
			eps, _ := dig(g, "spec", key).([]any)
			if len(eps) != 1 {
				t.Fatalf("%s: %d %s, want 1", where, len(eps), key)
			}
			for field, w := range want {
				if got := dig(eps[0], field); !reflect.DeepEqual(got, w) {
					t.Errorf("%s: endpoint %s = %v, want %v", where, field, got, w)
				}
			}
			if dig(eps[0], "port") != "http" {
				t.Errorf("%s: endpoint port %v, want http", where, dig(eps[0], "port"))
			}
			// The selector still finds this program's pods (PodMonitor) or
			// Service (ServiceMonitor, checked on production values).
			if kind == "PodMonitor" {
				var sel map[string]string
				for k, v := range dig(g, "spec", "selector", "matchLabels").(map[string]any) {
					if sel == nil {
						sel = map[string]string{}
					}
					sel[k] = fmt.Sprint(v)
				}
				var matched []string
				for key, w := range ws {
					if selects(sel, w.Spec.Template.Metadata.Labels) {
						matched = append(matched, key)
					}
				}
				if len(matched) != 1 || !strings.HasSuffix(matched[0], "-"+component) {
					t.Errorf("%s selects workloads %v, want the %s", where, matched, component)
				}
			}
		}
	}
}

// TestChartRejectsUnscrapableMonitors checks the values a monitor cannot
// scrape with, or that the Prometheus Operator would refuse or ignore, fail
// at install time.
func TestChartRejectsUnscrapableMonitors(t *testing.T) {
	tls := []string{"webConfig.enabled=true", "webConfig.tls=true", "webConfig.config.tls_server_config.cert_file=/x"}
	for _, tc := range []struct {
		name string
		set  []string
		want string
	}{
		{"https ServiceMonitor without tlsConfig", append(tls, "metrics.serviceMonitor.enabled=true"), "metrics.serviceMonitor.tlsConfig"},
		{"https PodMonitor without tlsConfig", append(tls, "metrics.podMonitor.enabled=true"), "metrics.podMonitor.tlsConfig"},
		{"basic auth without credentials", []string{"webConfig.enabled=true", "webConfig.basicAuth=true", "metrics.serviceMonitor.enabled=true"}, "metrics.serviceMonitor.basicAuth"},
		{"Prometheus spelling of a relabeling", []string{"metrics.serviceMonitor.relabelings[0].source_labels[0]=__name__"}, "source_labels"},
		{"unknown relabel action", []string{"metrics.podMonitor.metricRelabelings[0].action=delete"}, "action"},
		{"basic auth without password", []string{"metrics.serviceMonitor.basicAuth.username.name=s", "metrics.serviceMonitor.basicAuth.username.key=u"}, "password"},
		{"unknown tlsConfig key", []string{"metrics.podMonitor.tlsConfig.caFile=/etc/ca.crt"}, "caFile"}, // files only on a ServiceMonitor
		{"runbook URL with an anchor", []string{"metrics.prometheusRule.runbookBaseURL=https://example.com/runbooks#top"}, "runbookBaseURL"},
		{"image digest that is not one", []string{"image.digest=latest"}, "digest"},
		{"commonLabels overriding a chart label", []string{"commonLabels.app\\.kubernetes\\.io/name=other"}, "commonLabels"},
		{"network policy peer with a typo", []string{"networkPolicy.ingest.from[0].namespace=ingress-nginx"}, "namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", releaseName, chartDir, "--kube-version", kubeVersion}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			_, err := helm(t, args...)
			if err == nil {
				t.Fatalf("helm template accepted %v", tc.set)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not mention %q:\n%v", tc.want, err)
			}
		})
	}
}

// TestChartCommonLabels checks commonLabels reach every object the chart
// renders and every pod, but no selector and no volumeClaimTemplate (both
// immutable after install), and that a pod's own podLabels win.
func TestChartCommonLabels(t *testing.T) {
	common := map[string]string{"team": "cdn", "example.com/cost-center": "42"}
	extra := valuesFile(t, `
commonLabels:
  team: cdn
  example.com/cost-center: "42"
exporter:
  podLabels:
    team: exporter-team
networkPolicy:
  enabled: true
extraManifests:
  - |
    apiVersion: v1
    kind: ConfigMap
    metadata:
      name: extra
      labels:
        {{- include "edgepipe.labels" . | nindent 8 }}
`)
	kinds := map[string]bool{}
	// Production values (sharded exporter, Ingress, HPA, monitors, rules)
	// and the defaults (exporter Deployment), with a chart-made Secret.
	for _, values := range [][]string{
		{chartDir + "/ci/production-values.yaml", extra},
		{extra, valuesFile(t, "credentials: {clientId: id, clientSecret: secret}")},
	} {
		m := render(t, values...)
		for _, o := range m {
			kinds[o.Kind] = true
			for k, v := range common {
				if o.Metadata.Labels[k] != v {
					t.Errorf("%s %s: label %s=%q, want %q", o.Kind, o.Metadata.Name, k, o.Metadata.Labels[k], v)
				}
			}
		}
		for key, w := range m.workloads(t) {
			pod := w.Spec.Template.Metadata.Labels
			wantTeam := "cdn"
			if strings.HasSuffix(key, "-exporter") {
				wantTeam = "exporter-team"
			}
			if pod["team"] != wantTeam || pod["example.com/cost-center"] != "42" {
				t.Errorf("%s: pod labels %v, want team=%s and the common cost-center", key, pod, wantTeam)
			}
			if !selects(w.Spec.Selector.MatchLabels, pod) {
				t.Errorf("%s: selector %v does not select its pods", key, w.Spec.Selector.MatchLabels)
			}
			for k := range common {
				if _, ok := w.Spec.Selector.MatchLabels[k]; ok {
					t.Errorf("%s: commonLabel %s in the selector (immutable: changing it would break upgrades)", key, k)
				}
				for _, vct := range w.Spec.VolumeClaimTemplates {
					if _, ok := vct.Metadata.Labels[k]; ok {
						t.Errorf("%s: commonLabel %s in volumeClaimTemplate %s (immutable)", key, k, vct.Metadata.Name)
					}
				}
			}
		}
	}
	for _, kind := range []string{"Deployment", "StatefulSet", "Service", "ServiceMonitor", "PrometheusRule", "NetworkPolicy",
		"ConfigMap", "Secret", "HorizontalPodAutoscaler", "Ingress", "PodDisruptionBudget", "ServiceAccount"} {
		if !kinds[kind] {
			t.Errorf("no %s rendered: the test does not cover it", kind)
		}
	}
}

// TestChartImageDigest checks image.digest pins the image by digest,
// overriding the tag, and that the tag defaults to the chart's appVersion.
func TestChartImageDigest(t *testing.T) {
	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, chartDir+"/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name, values, want string
	}{
		{"default", "", "ghcr.io/edgepipe/edgepipe:" + chart.AppVersion},
		{"tag", "image: {tag: v9.9.9}", "ghcr.io/edgepipe/edgepipe:v9.9.9"},
		{"digest", "image: {repository: registry.example.com/edgepipe, tag: v9.9.9, digest: " + digest + "}", "registry.example.com/edgepipe@" + digest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := render(t, valuesFile(t, tc.values))
			ws := m.workloads(t)
			if len(ws) != 2 {
				t.Fatalf("%d workloads, want 2", len(ws))
			}
			for key, w := range ws {
				for _, c := range w.Spec.Template.Spec.Containers {
					if c.Image != tc.want {
						t.Errorf("%s container %s: image %q, want %q", key, c.Name, c.Image, tc.want)
					}
				}
			}
		})
	}
}

// TestChartImageIsMakeImage checks the chart deploys by default the image
// `make image` tags at a release (VERSION, which is the chart's
// appVersion): the same repository, and the version without its "v".
func TestChartImageIsMakeImage(t *testing.T) {
	cmd := exec.Command(testenv.Binary(t, "make"), "-s", "--no-print-directory", "-C", "../..", "image-ref", "VERSION=v"+releaseVersion(t))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make image-ref: %v", err)
	}
	ref := strings.TrimSpace(string(out))
	for key, w := range render(t).workloads(t) {
		for _, c := range w.Spec.Template.Spec.Containers {
			if c.Image != ref {
				t.Errorf("%s container %s: image %q, `make image` tags %q", key, c.Name, c.Image, ref)
			}
		}
	}
}

// TestChartNetworkPolicy checks the NetworkPolicies: ingress only, only the
// program's http port, the exporter's open to the metrics peers (by default
// the monitoring namespace), the receiver's to any source by default (the
// platform posts from the internet) or to the listed ingest peers plus the
// metrics peers.
func TestChartNetworkPolicy(t *testing.T) {
	monitoringNS := yamlValue(t, `[{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]`)
	ingressNS := `[{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: ingress-nginx}}}, {ipBlock: {cidr: 203.0.113.0/24}}]`
	for _, tc := range []struct {
		name, values           string
		exporterFrom, recvFrom any // nil: any source
	}{
		{"defaults", "networkPolicy: {enabled: true}", monitoringNS, nil},
		{"ingest peers", "networkPolicy: {enabled: true, ingest: {from: " + ingressNS + "}}",
			monitoringNS, append(yamlValue(t, ingressNS).([]any), monitoringNS.([]any)...)},
		{"metrics from anywhere", "networkPolicy: {enabled: true, metrics: {from: []}, ingest: {from: " + ingressNS + "}}", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := render(t, valuesFile(t, tc.values))
			ws := m.workloads(t)
			pols := m.ofKind("NetworkPolicy")
			if len(pols) != 2 {
				t.Fatalf("%d NetworkPolicies, want 2", len(pols))
			}
			for _, o := range pols {
				g := o.generic(t)
				component := o.Metadata.Labels["app.kubernetes.io/component"]
				if types := dig(g, "spec", "policyTypes"); !reflect.DeepEqual(types, []any{"Ingress"}) {
					t.Errorf("%s: policyTypes %v, want [Ingress] (egress to the platform and sinks unrestricted)", o.Metadata.Name, types)
				}
				sel := map[string]string{}
				for k, v := range dig(g, "spec", "podSelector", "matchLabels").(map[string]any) {
					sel[k] = fmt.Sprint(v)
				}
				var selected []workload
				for key, w := range ws {
					if selects(sel, w.Spec.Template.Metadata.Labels) {
						if !strings.HasSuffix(key, "-"+component) {
							t.Errorf("%s selects %s", o.Metadata.Name, key)
						}
						selected = append(selected, w)
					}
				}
				if len(selected) != 1 {
					t.Fatalf("%s selects %d workloads, want 1", o.Metadata.Name, len(selected))
				}
				rules, _ := dig(g, "spec", "ingress").([]any)
				if len(rules) != 1 {
					t.Fatalf("%s: %d ingress rules, want 1", o.Metadata.Name, len(rules))
				}
				ports, _ := dig(rules[0], "ports").([]any)
				c := selected[0].Spec.Template.Spec.Containers[0]
				if len(ports) != 1 || dig(ports[0], "port") != "http" || len(c.Ports) != 1 || c.Ports[0].Name != "http" {
					t.Errorf("%s: ports %v, want the container's only port, http (%+v)", o.Metadata.Name, ports, c.Ports)
				}
				want := map[string]any{"exporter": tc.exporterFrom, "receiver": tc.recvFrom}[component]
				if got := dig(rules[0], "from"); !reflect.DeepEqual(got, want) {
					t.Errorf("%s: from %v, want %v", o.Metadata.Name, got, want)
				}
			}
		})
	}
	if n := len(render(t).ofKind("NetworkPolicy")); n != 0 {
		t.Errorf("%d NetworkPolicies with default values, want none", n)
	}
}

// TestChartExtraManifests checks extraManifests are rendered with tpl, as
// YAML objects and as strings.
func TestChartExtraManifests(t *testing.T) {
	m := render(t, valuesFile(t, `
extraManifests:
  - apiVersion: v1
    kind: ConfigMap
    metadata:
      name: '{{ include "edgepipe.fullname" . }}-extra'
    data:
      release: '{{ .Release.Name }}'
  - |
    apiVersion: v1
    kind: Secret
    metadata:
      name: {{ .Release.Name }}-from-string
      labels:
        {{- include "edgepipe.labels" . | nindent 4 }}
    stringData:
      namespace: {{ .Release.Namespace }}
`))
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	m.get(t, "ConfigMap", "ci-edgepipe-extra").decode(t, &cm)
	if cm.Data["release"] != "ci" {
		t.Errorf("extra ConfigMap data %v, want release=ci", cm.Data)
	}
	sec := m.get(t, "Secret", "ci-from-string")
	if dig(sec.generic(t), "stringData", "namespace") != "edgepipe" {
		t.Errorf("extra Secret from a string: %s", sec.text)
	}
	if sec.Metadata.Labels["app.kubernetes.io/instance"] != "ci" {
		t.Errorf("extra Secret labels %v: the chart's helpers did not render", sec.Metadata.Labels)
	}
}

// TestChartAlertRunbooks checks every alert the chart renders has a
// runbook_url <runbookBaseURL>#<alert in lower case> that resolves (with
// internal/doclinks, GitHub's anchors) to a heading of the document the
// default base URL names in this repository, every runbook heading of that
// document's "## Runbooks" section names an alert, and the base URL can be
// changed or turned off. When this fails for a new alert, add a
// "### <AlertName>" section under "## Runbooks" in that document.
func TestChartAlertRunbooks(t *testing.T) {
	var defaults struct {
		Metrics struct {
			PrometheusRule struct {
				RunbookBaseURL string `yaml:"runbookBaseURL"`
			} `yaml:"prometheusRule"`
		} `yaml:"metrics"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, chartDir+"/values.yaml")), &defaults); err != nil {
		t.Fatal(err)
	}
	base := defaults.Metrics.PrometheusRule.RunbookBaseURL
	home := firstMatch(t, readFile(t, chartDir+"/Chart.yaml"), `(?m)^home:\s*(\S+)`, "home in Chart.yaml")
	runbooks, ok := strings.CutPrefix(base, home+"/blob/main/")
	if !ok || !strings.HasSuffix(runbooks, ".md") {
		t.Fatalf("default runbookBaseURL %q is not a Markdown document of the repository of Chart.yaml's home (%s/blob/main/….md)", base, home)
	}
	links := &doclinks.Checker{Root: "../..", RepoURL: home}

	_, rules := alertRules(t)
	if len(rules) == 0 {
		t.Fatal("no alerts rendered")
	}
	var missing []string
	for name, r := range rules {
		ann, _ := r["annotations"].(map[string]any)
		url, _ := ann["runbook_url"].(string)
		want := base + "#" + strings.ToLower(name)
		if url != want {
			t.Errorf("%s: runbook_url %q, want %q", name, url, want)
		}
		if err := links.Resolve("", want); err != nil {
			missing = append(missing, fmt.Sprintf("%s (%v)", name, err))
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("alerts without a runbook section (### <AlertName> under ## Runbooks in %s):\n%s", runbooks, strings.Join(missing, "\n"))
	}
	doc := readFile(t, "../../"+runbooks)
	start := strings.Index(doc, "\n## Runbooks\n")
	if start < 0 {
		t.Fatalf("%s has no Runbooks section", runbooks)
	}
	section := doc[start:]
	if i := strings.Index(section[1:], "\n## "); i >= 0 {
		section = section[:i+1]
	}
	for _, h := range regexp.MustCompile(`(?m)^### (\S+)\s*$`).FindAllStringSubmatch(section, -1) {
		if rules[h[1]] == nil {
			t.Errorf("runbook section %q names no alert the chart renders", h[1])
		}
	}

	for _, tc := range []struct{ name, values, want string }{
		{"own base URL", "metrics: {prometheusRule: {runbookBaseURL: 'https://wiki.example.com/edgepipe'}}", "https://wiki.example.com/edgepipe#"},
		{"no runbooks", "metrics: {prometheusRule: {runbookBaseURL: ''}}", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := render(t, chartDir+"/ci/production-values.yaml", valuesFile(t, tc.values))
			var pr struct {
				Spec struct {
					Groups []struct {
						Rules []struct {
							Alert       string            `yaml:"alert"`
							Annotations map[string]string `yaml:"annotations"`
						} `yaml:"rules"`
					} `yaml:"groups"`
				} `yaml:"spec"`
			}
			m.get(t, "PrometheusRule", "ci-edgepipe").decode(t, &pr)
			n := 0
			for _, g := range pr.Spec.Groups {
				for _, r := range g.Rules {
					n++
					url, ok := r.Annotations["runbook_url"]
					switch {
					case tc.want == "" && ok:
						t.Errorf("%s: runbook_url %q with runbookBaseURL empty", r.Alert, url)
					case tc.want != "" && url != tc.want+strings.ToLower(r.Alert):
						t.Errorf("%s: runbook_url %q, want %s%s", r.Alert, url, tc.want, strings.ToLower(r.Alert))
					}
					if r.Annotations["summary"] == "" {
						t.Errorf("%s: lost its summary", r.Alert)
					}
				}
			}
			if n != len(rules) {
				t.Errorf("%d alerts, want %d", n, len(rules))
			}
		})
	}
}
