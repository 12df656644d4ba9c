package deploytest

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/exportconfig"
	"github.com/edgepipe/edgepipe/internal/inventory"
	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

const (
	chartDir    = "../../deploy/helm/edgepipe"
	releaseName = "ci"
	// kubeVersion is passed to helm: the sharded exporter needs >= 1.28.
	kubeVersion = "1.30.0"
)

// secretEnv are the variables that carry credentials: they must reach a pod
// only through a secretKeyRef.
var secretEnv = []string{
	"EDGEPIPE_CLIENT_ID", "EDGEPIPE_CLIENT_SECRET",
	"EDGEPIPE_RTLD_USERNAME", "EDGEPIPE_RTLD_PASSWORD",
	"EDGEPIPE_CLICKHOUSE_DSN", "EDGEPIPE_CLICKHOUSE_PASSWORD",
}

// helmBinary finds helm on PATH, in GOPATH/bin (where `go install
// helm.sh/helm/v3/cmd/helm@v3.22.0` puts it), or through testenv (which
// skips, or fails under CI=true, when it is nowhere).
func helmBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	gobin := os.Getenv("GOBIN")
	if gobin == "" {
		gobin = filepath.Join(build.Default.GOPATH, "bin")
	}
	p := filepath.Join(gobin, "helm")
	if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
		return p
	}
	return testenv.Binary(t, "helm")
}

// helm runs helm with args and returns stdout; stderr is returned on failure.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, helmBinary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Keep helm away from the user's repositories and cache.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), &helmError{args: args, err: err, stderr: stderr.String()}
	}
	return stdout.Bytes(), nil
}

type helmError struct {
	args   []string
	err    error
	stderr string
}

func (e *helmError) Error() string {
	return "helm " + strings.Join(e.args, " ") + ": " + e.err.Error() + "\n" + e.stderr
}

// render lints the chart with the values files and renders it.
func render(t *testing.T, values ...string) manifests {
	t.Helper()
	args := []string{"--kube-version", kubeVersion}
	for _, v := range values {
		args = append(args, "--values", v)
	}
	if out, err := helm(t, append([]string{"lint", "--strict", chartDir}, args...)...); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	out, err := helm(t, append([]string{"template", releaseName, chartDir, "--namespace", "edgepipe"}, args...)...)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	objs, err := parseManifests(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(objs) == 0 {
		t.Fatal("helm template rendered nothing")
	}
	return objs
}

func TestChartDefaults(t *testing.T) {
	m := render(t)

	kinds := map[string]int{}
	for _, o := range m {
		kinds[o.Kind]++
	}
	dashboards, err := filepath.Glob("../../dashboards/*.json")
	if err != nil || len(dashboards) == 0 {
		t.Fatalf("no dashboards found in ../../dashboards (%v)", err)
	}
	want := map[string]int{
		"Deployment": 1, "StatefulSet": 1, "Service": 3, "PodDisruptionBudget": 2,
		"ServiceAccount": 1, "ConfigMap": len(dashboards), "PersistentVolumeClaim": 1,
	}
	for kind, n := range want {
		if kinds[kind] != n {
			t.Errorf("%d %s objects rendered, want %d (all: %v)", kinds[kind], kind, n, m.names())
		}
	}
	for _, absent := range []string{"Ingress", "HorizontalPodAutoscaler", "ServiceMonitor", "PodMonitor"} {
		if kinds[absent] != 0 {
			t.Errorf("%s rendered with default values", absent)
		}
	}

	exporter := workloadOf(t, m, "Deployment", "ci-edgepipe-exporter")
	if exporter.Spec.Replicas == nil || *exporter.Spec.Replicas != 1 {
		t.Errorf("exporter replicas = %v, want 1", exporter.Spec.Replicas)
	}
	c := exporter.Spec.Template.Spec.Containers[0]
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--shard.") {
			t.Errorf("unsharded exporter has shard argument %q", a)
		}
	}
	if !c.hasArg("--simulate") {
		t.Errorf("default values (simulate: true) do not pass --simulate: %v", c.Args)
	}
	for _, flag := range []string{"--config.file", "--prometheus.max-series"} {
		if v, ok := c.argValue(flag); ok {
			t.Errorf("default values pass %s=%s: the exporter's default must apply", flag, v)
		}
	}
	if v, _ := c.argValue("--inventory.interval"); v == "" || mustDuration(t, v) != inventory.DefaultInterval {
		t.Errorf("--inventory.interval = %q, want the exporter's default %s", v, inventory.DefaultInterval)
	}
	assertExporterState(t, m, exporter, false)
	if got := logMetricsArgs(workloadOf(t, m, "StatefulSet", "ci-edgepipe-receiver").Spec.Template.Spec.Containers[0]); len(got) != 0 {
		t.Errorf("default values pass %v: the receiver's defaults must apply", got)
	}
	assertReceiverSpool(t, m, 2)
	assertReceiverSizes(t, m)
	assertPods(t, m, "HTTP")
	assertDashboardConfigMaps(t, m, dashboards)
}

func TestChartProduction(t *testing.T) {
	m := render(t, chartDir+"/ci/production-values.yaml")

	// Sharded exporter: a StatefulSet whose ordinal is the shard index.
	exporter := workloadOf(t, m, "StatefulSet", "ci-edgepipe-exporter")
	if exporter.Spec.Replicas == nil || *exporter.Spec.Replicas != 3 {
		t.Fatalf("exporter replicas = %v, want 3", exporter.Spec.Replicas)
	}
	if exporter.Spec.ServiceName == "" {
		t.Error("sharded exporter StatefulSet has no serviceName")
	} else {
		var svc service
		m.get(t, "Service", exporter.Spec.ServiceName).decode(t, &svc)
		if svc.Spec.ClusterIP != "None" {
			t.Errorf("governing Service %s is not headless", exporter.Spec.ServiceName)
		}
	}
	c := exporter.Spec.Template.Spec.Containers[0]
	if v, _ := c.argValue("--shard.count"); v != "3" {
		t.Errorf("--shard.count = %q, want 3 (args %v)", v, c.Args)
	}
	idx, ok := c.argValue("--shard.index")
	if !ok {
		t.Fatalf("no --shard.index in %v", c.Args)
	}
	ref := regexp.MustCompile(`^\$\(([A-Z_][A-Z0-9_]*)\)$`).FindStringSubmatch(idx)
	if ref == nil {
		t.Fatalf("--shard.index=%s is not a $(VAR) reference Kubernetes expands", idx)
	}
	ev := c.env(ref[1])
	if ev == nil || ev.ValueFrom == nil || ev.ValueFrom.FieldRef == nil ||
		ev.ValueFrom.FieldRef.FieldPath != "metadata.labels['apps.kubernetes.io/pod-index']" {
		t.Errorf("%s does not come from the pod-index label: %+v", ref[1], ev)
	}
	for _, name := range []string{"EDGEPIPE_ORGANIZATION_ID", "EDGEPIPE_API_URL", "EDGEPIPE_AUTH_URL", "EDGEPIPE_ENVIRONMENT_ID"} {
		if ev := c.env(name); ev == nil || ev.Value == nil || *ev.Value == "" {
			t.Errorf("exporter has no %s value", name)
		}
	}
	assertClickHouseClusterArgs(t, "exporter", c)
	assertExporterConfig(t, m, exporter)
	if v, _ := c.argValue("--prometheus.max-series"); v != "200000" {
		t.Errorf("--prometheus.max-series = %q, want 200000", v)
	}
	if v, _ := c.argValue("--otlp.temporality"); v != "cumulative" {
		t.Errorf("--otlp.temporality = %q, want cumulative (the default)", v)
	}
	assertExporterState(t, m, exporter, true)

	// Credentials come from the existing Secret, and the chart makes none.
	if n := len(m.ofKind("Secret")); n != 0 {
		t.Errorf("%d Secrets rendered with credentials.existingSecret", n)
	}
	for key, w := range m.workloads(t) {
		for _, c := range w.Spec.Template.Spec.Containers {
			for _, name := range []string{"EDGEPIPE_CLIENT_ID", "EDGEPIPE_CLIENT_SECRET", "EDGEPIPE_CLICKHOUSE_DSN", "EDGEPIPE_CLICKHOUSE_PASSWORD"} {
				ev := c.env(name)
				if ev == nil || ev.ValueFrom == nil || ev.ValueFrom.SecretKeyRef == nil || ev.ValueFrom.SecretKeyRef.Name != "edgepipe-credentials" {
					t.Errorf("%s container %s: %s not from Secret edgepipe-credentials: %+v", key, c.Name, name, ev)
				}
			}
		}
	}

	// Receiver: autoscaled StatefulSet behind an Ingress with TLS.
	receiver := workloadOf(t, m, "StatefulSet", "ci-edgepipe-receiver")
	if receiver.Spec.Replicas != nil {
		t.Errorf("autoscaled receiver sets replicas %d (the HPA owns it)", *receiver.Spec.Replicas)
	}
	rc := receiver.Spec.Template.Spec.Containers[0]
	assertClickHouseClusterArgs(t, "receiver", rc)
	if ev := rc.env("EDGEPIPE_PUBLIC_URL"); ev == nil || ev.Value == nil || *ev.Value != "https://rtld.cdn.example.net" {
		t.Errorf("EDGEPIPE_PUBLIC_URL = %+v, want https://rtld.cdn.example.net", ev)
	}
	if ev := rc.env("EDGEPIPE_KAFKA_BROKERS"); ev == nil || ev.Value == nil || !strings.Contains(*ev.Value, "kafka-0.kafka:9092") {
		t.Errorf("EDGEPIPE_KAFKA_BROKERS = %+v", ev)
	}
	for _, name := range []string{"EDGEPIPE_RTLD_USERNAME", "EDGEPIPE_RTLD_PASSWORD"} {
		if ev := rc.env(name); ev == nil || ev.ValueFrom == nil || ev.ValueFrom.SecretKeyRef == nil {
			t.Errorf("receiver %s not from a Secret: %+v", name, ev)
		}
	}
	assertReceiverSpool(t, m, -1)
	assertReceiverSizes(t, m)
	if got := strings.Join(logMetricsArgs(rc), " "); got != "--log-metrics.labels=pop,host --log-metrics.top-n=10 --log-metrics.max-series=100000" {
		t.Errorf("receiver log metrics arguments %q", got)
	}

	var hpa struct {
		Spec struct {
			ScaleTargetRef struct{ Kind, Name string } `yaml:"scaleTargetRef"`
			MinReplicas    int                         `yaml:"minReplicas"`
			MaxReplicas    int                         `yaml:"maxReplicas"`
		} `yaml:"spec"`
	}
	m.get(t, "HorizontalPodAutoscaler", "ci-edgepipe-receiver").decode(t, &hpa)
	if hpa.Spec.ScaleTargetRef.Kind != "StatefulSet" || hpa.Spec.ScaleTargetRef.Name != "ci-edgepipe-receiver" || hpa.Spec.MinReplicas != 3 || hpa.Spec.MaxReplicas != 12 {
		t.Errorf("HPA = %+v", hpa.Spec)
	}

	var ing struct {
		Spec struct {
			IngressClassName string `yaml:"ingressClassName"`
			TLS              []struct {
				Hosts      []string `yaml:"hosts"`
				SecretName string   `yaml:"secretName"`
			} `yaml:"tls"`
			Rules []struct {
				Host string `yaml:"host"`
				HTTP struct {
					Paths []struct {
						Backend struct {
							Service struct {
								Name string `yaml:"name"`
								Port struct {
									Name string `yaml:"name"`
								} `yaml:"port"`
							} `yaml:"service"`
						} `yaml:"backend"`
					} `yaml:"paths"`
				} `yaml:"http"`
			} `yaml:"rules"`
		} `yaml:"spec"`
	}
	m.get(t, "Ingress", "ci-edgepipe-receiver").decode(t, &ing)
	if len(ing.Spec.TLS) != 1 || ing.Spec.TLS[0].SecretName != "rtld-tls" || !slices.Contains(ing.Spec.TLS[0].Hosts, "rtld.cdn.example.net") {
		t.Errorf("ingress TLS = %+v", ing.Spec.TLS)
	}
	if len(ing.Spec.Rules) != 1 || len(ing.Spec.Rules[0].HTTP.Paths) != 1 {
		t.Fatalf("ingress rules = %+v", ing.Spec.Rules)
	}
	be := ing.Spec.Rules[0].HTTP.Paths[0].Backend.Service
	var rsvc service
	m.get(t, "Service", be.Name).decode(t, &rsvc)
	if !slices.ContainsFunc(rsvc.Spec.Ports, func(p servicePort) bool { return p.Name == be.Port.Name }) {
		t.Errorf("ingress backend port %q not on Service %s", be.Port.Name, be.Name)
	}
	if !selects(rsvc.Spec.Selector, receiver.Spec.Template.Metadata.Labels) {
		t.Errorf("ingress backend Service %s does not select the receiver pods", be.Name)
	}

	// One ServiceMonitor per program, each selecting exactly that program's
	// non-headless Service.
	sms := m.ofKind("ServiceMonitor")
	if len(sms) != 2 {
		t.Fatalf("%d ServiceMonitors, want 2", len(sms))
	}
	for _, o := range sms {
		var sm struct {
			Spec struct {
				Selector struct {
					MatchLabels      map[string]string `yaml:"matchLabels"`
					MatchExpressions []struct {
						Key, Operator string
					} `yaml:"matchExpressions"`
				} `yaml:"selector"`
				Endpoints []struct{ Port, Path, Scheme string } `yaml:"endpoints"`
			} `yaml:"spec"`
		}
		o.decode(t, &sm)
		if o.Metadata.Labels["release"] != "kube-prometheus-stack" {
			t.Errorf("ServiceMonitor %s lacks the configured release label", o.Metadata.Name)
		}
		var matched []string
		for _, s := range m.ofKind("Service") {
			if !selects(sm.Spec.Selector.MatchLabels, s.Metadata.Labels) {
				continue
			}
			if _, headless := s.Metadata.Labels["edgepipe.io/headless"]; headless {
				continue // excluded by the DoesNotExist expression
			}
			matched = append(matched, s.Metadata.Name)
		}
		if len(matched) != 1 || matched[0] != o.Metadata.Name {
			t.Errorf("ServiceMonitor %s selects Services %v, want [%s]", o.Metadata.Name, matched, o.Metadata.Name)
		}
		if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" || sm.Spec.Endpoints[0].Path != "/metrics" || sm.Spec.Endpoints[0].Scheme != "http" {
			t.Errorf("ServiceMonitor %s endpoints = %+v", o.Metadata.Name, sm.Spec.Endpoints)
		}
	}
	assertPods(t, m, "HTTP")
	assertAlertRules(t, m)
}

// assertExporterConfig checks that exporter.config becomes a ConfigMap the
// exporter reads as --config.file from a read-only mount, that its content
// is a valid config file, and that a change of it rolls the pods.
func assertExporterConfig(t *testing.T, m manifests, w workload) {
	t.Helper()
	c := w.Spec.Template.Spec.Containers[0]
	path, ok := c.argValue("--config.file")
	if !ok {
		t.Fatalf("exporter.config set, but no --config.file in %v", c.Args)
	}
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	m.get(t, "ConfigMap", "ci-edgepipe-exporter-config").decode(t, &cm)
	cfg, err := exportconfig.Parse([]byte(cm.Data[filepath.Base(path)]), "exporter.config")
	if err != nil {
		t.Fatalf("the rendered config file is not valid: %v", err)
	}
	if len(cfg.Datasets) != 6 || len(cfg.Exclude) != 1 || cfg.Datasets[0].Dimensions == nil {
		t.Errorf("the rendered config file lost something: %+v", cfg)
	}
	found := false
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != filepath.Dir(path) {
			continue
		}
		for _, v := range w.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil && v.ConfigMap.Name == "ci-edgepipe-exporter-config" && vm.ReadOnly {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("%s is not on a read-only mount of ConfigMap ci-edgepipe-exporter-config", path)
	}
	if w.Spec.Template.Metadata.Annotations["checksum/config"] == "" {
		t.Error("no checksum/config annotation: a changed config would not roll the pods")
	}
}

// assertAlertRules checks the PrometheusRule with promtool (Debian's
// prometheus package): every expression parses, every alert is well formed.
func assertAlertRules(t *testing.T, m manifests) {
	t.Helper()
	spec := prometheusRule(t, m)
	alerts := 0
	for _, g := range spec.Groups {
		alerts += len(g.Rules)
	}
	if len(spec.Groups) != 2 || alerts < 10 {
		t.Errorf("%d groups with %d alerts, want the exporter and receiver groups", len(spec.Groups), alerts)
	}
	out := spec.file(t)
	path := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := exec.Command(testenv.Promtool(t), "check", "rules", path).CombinedOutput()
	if err != nil {
		t.Errorf("promtool check rules: %v\n%s\n%s", err, res, out)
	}
}

func TestChartWebConfigAndChartSecret(t *testing.T) {
	m := render(t, chartDir+"/ci/webconfig-values.yaml")

	// The chart-created Secret holds the credentials...
	secretValues := []string{
		"ci-client-id-value", "ci-client-secret-value", "ci-rtld-user-value", "ci-rtld-password-value",
		"clickhouse://ci-user@clickhouse:9000/cdn", "ci-clickhouse-password-value",
	}
	var sec struct {
		Data map[string]string `yaml:"data"`
	}
	m.get(t, "Secret", "ci-edgepipe").decode(t, &sec)
	for i, name := range secretEnv {
		got, err := base64.StdEncoding.DecodeString(sec.Data[name])
		if err != nil || string(got) != secretValues[i] {
			t.Errorf("Secret key %s = %q (%v), want %q", name, got, err, secretValues[i])
		}
	}
	// ...and no other object contains any of them, in clear or base64.
	for _, o := range m {
		if o.Kind == "Secret" {
			continue
		}
		for _, v := range secretValues {
			for _, form := range []string{v, base64.StdEncoding.EncodeToString([]byte(v))} {
				if strings.Contains(o.text, form) {
					t.Errorf("%s %s contains a credential (%q)", o.Kind, o.Metadata.Name, form)
				}
			}
		}
	}
	for key, w := range m.workloads(t) {
		ps := w.Spec.Template.Spec
		c := ps.Containers[0]
		if v, _ := c.argValue("--web.config.file"); v == "" {
			t.Errorf("%s: no --web.config.file", key)
		} else if !mounted(c, filepath.Dir(v)) {
			t.Errorf("%s: web config %s is not on a mounted volume", key, v)
		}
		if !mounted(c, "/etc/edgepipe/tls") {
			t.Errorf("%s: TLS secret not mounted at /etc/edgepipe/tls", key)
		}
		var fromSecret []string
		for _, v := range ps.Volumes {
			if v.Secret != nil {
				fromSecret = append(fromSecret, v.Secret.SecretName)
			}
		}
		if !slices.Contains(fromSecret, "ci-edgepipe-web-config") || !slices.Contains(fromSecret, "edgepipe-tls") {
			t.Errorf("%s: secret volumes %v, want ci-edgepipe-web-config and edgepipe-tls", key, fromSecret)
		}
	}
	m.get(t, "Secret", "ci-edgepipe-web-config")
	if n := len(m.ofKind("PodMonitor")); n != 2 {
		t.Errorf("%d PodMonitors, want 2", n)
	}
	assertPods(t, m, "HTTPS")
}

// TestChartRejectsBadValues checks that a misconfiguration fails at install
// time with a message, not at run time in a crash-looping pod.
func TestChartRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []string
		want string // in helm's error output
	}{
		{"live without credentials", []string{"simulate=false", "receiver.publicUrl=https://rtld.example.com"}, "credentials.clientId"},
		{"receiver without public URL", []string{"simulate=false", "credentials.existingSecret=x"}, "receiver.publicUrl is required"},
		{"plain http public URL", []string{"receiver.publicUrl=http://rtld.example.com"}, "publicUrl"},
		{"clickhouse without DSN", []string{"clickhouse.enabled=true"}, "clickhouseDsn"},
		{"unknown granularity", []string{"exporter.granularity=MINUTE"}, "granularity"},
		{"zero replicas", []string{"exporter.replicas=0"}, "replicas"},
		{"spool size without binary unit", []string{"receiver.spool.size=10G"}, "receiver.spool.size"},
		{"dead-letter bound not a size", []string{"receiver.deadLetter.maxBytes=lots"}, "maxBytes"},
		{"Kafka message limit not a size", []string{"receiver.kafka.maxMessageBytes=1M"}, "maxMessageBytes"},
		{"Kafka write timeout not a duration", []string{"receiver.kafka.writeTimeout=30"}, "writeTimeout"},
		// A spool smaller than two segments with room for the largest batch
		// would answer 503 forever.
		{"spool too small for the largest batch", []string{"receiver.spool.size=50Mi"}, "too small for batches of up to receiver.ingest.maxDecodedBytes=32MiB"},
		{"ingest memory below one request", []string{"receiver.ingest.maxMemoryBytes=32MiB"}, "receiver.ingest.maxMemoryBytes=32MiB cannot hold one request"},
		{"memory limit without binary unit", []string{"receiver.resources.limits.memory=1G"}, "receiver.resources.limits.memory"},
		{"unknown value", []string{"exporter.pollIntervall=1m"}, "pollIntervall"},
		{"unknown config key", []string{"exporter.config.datasets.edge_errors.dimensons[0]=country_code"}, "dimensons"},
		{"config percentile out of range", []string{"exporter.config.datasets.edge_errors.percentiles[0]=100"}, "percentiles"},
		{"empty environment selector", []string{"exporter.config.environments.exclude[0].nam=qa"}, "nam"},
		{"config and existing ConfigMap", []string{"exporter.config.prefix=cdn", "exporter.existingConfigMap=mine"}, "not both"},
		{"negative series budget", []string{"exporter.maxSeries=-1"}, "maxSeries"},
		{"inventory interval not a duration", []string{"exporter.inventoryInterval=1 hour"}, "inventoryInterval"},
		{"unknown log metrics label", []string{"receiver.logMetrics.labels={pop,path}"}, "logMetrics/labels"},
		{"log metrics top 0", []string{"receiver.logMetrics.topN=0"}, "topN"},
		{"negative log metrics budget", []string{"receiver.logMetrics.maxSeries=-1"}, "maxSeries"},
		{"log metrics TTL not a duration", []string{"receiver.logMetrics.seriesTTL=1d"}, "seriesTTL"},
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
	t.Run("sharding on old Kubernetes", func(t *testing.T) {
		_, err := helm(t, "template", releaseName, chartDir, "--kube-version", "1.27.0", "--set", "exporter.replicas=2")
		if err == nil || !strings.Contains(err.Error(), "1.28") {
			t.Errorf("sharding accepted on Kubernetes 1.27 (err %v)", err)
		}
	})
}

// TestChartLogMetrics: receiver.logMetrics becomes the --log-metrics.*
// flags; empty values leave the receiver's defaults.
func TestChartLogMetrics(t *testing.T) {
	for _, tc := range []struct {
		name, values, want string
	}{
		{"off", "enabled: false\nlabels: [host]", "--no-log-metrics.enabled"},
		{"no optional label", "labels: []", "--log-metrics.labels="},
		{"every setting", "labels: [client_country_code]\ntopN: 5\ntopNWindow: 30m\nmaxSeries: 0\nseriesTTL: 6h",
			"--log-metrics.labels=client_country_code --log-metrics.top-n=5 --log-metrics.top-n-window=30m --log-metrics.max-series=0 --log-metrics.series-ttl=6h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := render(t, valuesFile(t, "receiver:\n  logMetrics:\n"+indent(tc.values, 4)+"\n"))
			c := workloadOf(t, m, "StatefulSet", "ci-edgepipe-receiver").Spec.Template.Spec.Containers[0]
			if got := strings.Join(logMetricsArgs(c), " "); got != tc.want {
				t.Errorf("arguments %q, want %q", got, tc.want)
			}
		})
	}
}

// logMetricsArgs returns the container's --log-metrics.* arguments.
func logMetricsArgs(c container) []string {
	var out []string
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--log-metrics.") || strings.HasPrefix(a, "--no-log-metrics.") {
			out = append(out, a)
		}
	}
	return out
}

// TestChartDashboardsMatchSources checks the chart's copy of the dashboards
// (Helm cannot read files outside the chart) against dashboards/.
func TestChartDashboardsMatchSources(t *testing.T) {
	src, err := filepath.Glob("../../dashboards/*.json")
	if err != nil || len(src) == 0 {
		t.Fatalf("no dashboards in ../../dashboards (%v)", err)
	}
	copies, err := filepath.Glob(chartDir + "/files/dashboards/*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(copies) != len(src) {
		t.Errorf("chart has %d dashboards, dashboards/ has %d: run `cp dashboards/*.json deploy/helm/edgepipe/files/dashboards/`", len(copies), len(src))
	}
	for _, s := range src {
		want, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(chartDir, "files/dashboards", filepath.Base(s)))
		if err != nil {
			t.Errorf("chart copy of %s: %v", filepath.Base(s), err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("deploy/helm/edgepipe/files/dashboards/%s differs from dashboards/%[1]s: copy it again", filepath.Base(s))
		}
	}
}

func workloadOf(t *testing.T, m manifests, kind, name string) workload {
	t.Helper()
	var w workload
	m.get(t, kind, name).decode(t, &w)
	if len(w.Spec.Template.Spec.Containers) == 0 {
		t.Fatalf("%s %s has no containers", kind, name)
	}
	return w
}

func mounted(c container, dir string) bool {
	for _, vm := range c.VolumeMounts {
		if vm.MountPath == dir {
			return true
		}
	}
	return false
}

// assertExporterState checks the exporter keeps --state.dir on a volume
// that outlives its pods: the Deployment on one claim the chart creates,
// with the Recreate strategy (two pods must never share the directory); the
// sharded StatefulSet on a claim per replica, deleted when it scales down.
func assertExporterState(t *testing.T, m manifests, w workload, sharded bool) {
	t.Helper()
	c := w.Spec.Template.Spec.Containers[0]
	dir, ok := c.argValue("--state.dir")
	if !ok {
		t.Fatalf("exporter has no --state.dir: %v", c.Args)
	}
	var name string
	for _, vm := range c.VolumeMounts {
		if vm.MountPath == dir {
			name = vm.Name
		}
	}
	if name == "" {
		t.Fatalf("--state.dir=%s is not a volume mount", dir)
	}
	var podVolume map[string]any
	for _, v := range w.Spec.Template.Spec.Volumes {
		if v.Name == name {
			podVolume = v.PersistentVolumeClaim
			if v.EmptyDir != nil {
				t.Errorf("state volume %q is an emptyDir: a new pod would take the empty directory for a first start and count its first poll again", name)
			}
		}
	}
	if sharded {
		found := false
		for _, vct := range w.Spec.VolumeClaimTemplates {
			if vct.Metadata.Name == name {
				found = true
				if _, err := quantityBytes(vct.Spec.Resources.Requests["storage"]); err != nil || len(vct.Spec.AccessModes) == 0 {
					t.Errorf("state claim template %s: storage %v (%v), access modes %v", name, vct.Spec.Resources.Requests, err, vct.Spec.AccessModes)
				}
			}
		}
		if !found || podVolume != nil {
			t.Errorf("state volume %q of the StatefulSet: claim template %v, pod volume %v; want a claim per replica", name, found, podVolume)
		}
		if p := w.Spec.PersistentVolumeClaimRetentionPolicy; p["whenScaled"] != "Delete" {
			t.Errorf("state claims survive a scale-down (%v): a later scale-up would resume from a stale state", p)
		}
		return
	}
	claim, _ := podVolume["claimName"].(string)
	if claim == "" {
		t.Fatalf("state volume %q is not a PersistentVolumeClaim", name)
	}
	var pvc struct {
		Spec struct {
			AccessModes []string `yaml:"accessModes"`
			Resources   struct {
				Requests map[string]string `yaml:"requests"`
			} `yaml:"resources"`
		} `yaml:"spec"`
	}
	m.get(t, "PersistentVolumeClaim", claim).decode(t, &pvc)
	if _, err := quantityBytes(pvc.Spec.Resources.Requests["storage"]); err != nil || len(pvc.Spec.AccessModes) == 0 {
		t.Errorf("state claim %s: storage %v (%v), access modes %v", claim, pvc.Spec.Resources.Requests, err, pvc.Spec.AccessModes)
	}
	if w.Spec.Strategy.Type != "Recreate" {
		t.Errorf("exporter Deployment strategy %q, want Recreate (a rolling update would run two exporters on one state directory)", w.Spec.Strategy.Type)
	}
}

// TestChartWithoutState: exporter.state.enabled=false passes no
// --state.dir and creates no claim (an emptyDir would be worse than none).
func TestChartWithoutState(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte("exporter:\n  state:\n    enabled: false\n    size: 1Gi\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := render(t, values)
	w := workloadOf(t, m, "Deployment", "ci-edgepipe-exporter")
	c := w.Spec.Template.Spec.Containers[0]
	if _, ok := c.argValue("--state.dir"); ok || mounted(c, "/var/lib/edgepipe/state") {
		t.Errorf("state disabled, yet args %v mounts %v", c.Args, c.VolumeMounts)
	}
	if n := len(m.ofKind("PersistentVolumeClaim")); n != 0 || w.Spec.Strategy.Type == "Recreate" {
		t.Errorf("state disabled, yet %d claims and strategy %q", n, w.Spec.Strategy.Type)
	}
}

// assertReceiverSpool checks the receiver StatefulSet keeps its spool on a
// per-replica PersistentVolumeClaim mounted where --spool.dir points.
// replicas < 0 means "not set" (autoscaled).
func assertReceiverSpool(t *testing.T, m manifests, replicas int) {
	t.Helper()
	w := workloadOf(t, m, "StatefulSet", "ci-edgepipe-receiver")
	if replicas >= 0 && (w.Spec.Replicas == nil || *w.Spec.Replicas != replicas) {
		t.Errorf("receiver replicas = %v, want %d", w.Spec.Replicas, replicas)
	}
	c := w.Spec.Template.Spec.Containers[0]
	dir, ok := c.argValue("--spool.dir")
	if !ok {
		t.Fatalf("receiver has no --spool.dir: %v", c.Args)
	}
	var claim string
	for _, vm := range c.VolumeMounts {
		if vm.MountPath == dir {
			claim = vm.Name
		}
	}
	if claim == "" {
		t.Fatalf("--spool.dir=%s is not a volume mount", dir)
	}
	found := false
	for _, vct := range w.Spec.VolumeClaimTemplates {
		if vct.Metadata.Name != claim {
			continue
		}
		found = true
		size, err := quantityBytes(vct.Spec.Resources.Requests["storage"])
		if err != nil {
			t.Errorf("spool claim %s storage: %v", claim, err)
		}
		maxArg, _ := c.argValue("--spool.max-bytes")
		bound, err := quantityBytes(maxArg)
		switch {
		case err != nil:
			t.Errorf("--spool.max-bytes=%q: %v", maxArg, err)
		case bound <= 0 || bound >= size:
			t.Errorf("--spool.max-bytes=%s is not below the spool volume's %s: the disk would fill before ingest answers 503",
				maxArg, vct.Spec.Resources.Requests["storage"])
		}
		// The dead-letter store lives on the same volume.
		dlArg, _ := c.argValue("--dead-letter.max-bytes")
		if dl, err := quantityBytes(dlArg); err != nil || dl <= 0 || bound+dl >= size {
			t.Errorf("--spool.max-bytes=%s plus --dead-letter.max-bytes=%s (%v) do not fit the spool volume's %s",
				maxArg, dlArg, err, vct.Spec.Resources.Requests["storage"])
		}
		if len(vct.Spec.AccessModes) == 0 {
			t.Errorf("spool claim %s has no access modes", claim)
		}
	}
	if !found {
		t.Errorf("spool mount %q is not a volumeClaimTemplate (an emptyDir would lose accepted batches)", claim)
	}
	for _, v := range w.Spec.Template.Spec.Volumes {
		if v.Name == claim {
			t.Errorf("spool volume %q is a pod volume, not a claim template", claim)
		}
	}
	if p := w.Spec.PersistentVolumeClaimRetentionPolicy; p["whenScaled"] != "Retain" {
		t.Errorf("spool claims are not retained on scale-down: %v", p)
	}
}

// assertPods checks what every pod of the chart must satisfy: hardened
// security context, resource requests, probes on the right paths, container
// ports from DESIGN.md, credentials only through secretKeyRef, every $(VAR)
// in args defined.
func assertPods(t *testing.T, m manifests, scheme string) {
	t.Helper()
	ports := map[string]int{"exporter": 9780, "receiver": 9781}
	ws := m.workloads(t)
	if len(ws) != 2 {
		t.Errorf("%d workloads rendered, want 2", len(ws))
	}
	for key, w := range ws {
		ps := w.Spec.Template.Spec
		if !selects(w.Spec.Selector.MatchLabels, w.Spec.Template.Metadata.Labels) {
			t.Errorf("%s: selector %v does not match the pod labels", key, w.Spec.Selector.MatchLabels)
		}
		if ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot || ps.SecurityContext.SeccompProfile.Type != "RuntimeDefault" {
			t.Errorf("%s: pod security context %+v is not non-root with RuntimeDefault seccomp", key, ps.SecurityContext)
		}
		if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
			t.Errorf("%s: mounts a service account token it does not need", key)
		}
		for _, c := range append(ps.InitContainers, ps.Containers...) {
			where := key + " container " + c.Name
			sc := c.SecurityContext
			switch {
			case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
				t.Errorf("%s: runAsNonRoot not set", where)
			case sc.RunAsUser == nil || *sc.RunAsUser == 0:
				t.Errorf("%s: runAsUser not a non-root UID", where)
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("%s: root filesystem is writable", where)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("%s: privilege escalation allowed", where)
			case sc.Privileged != nil && *sc.Privileged:
				t.Errorf("%s: privileged", where)
			case !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0:
				t.Errorf("%s: capabilities %+v, want drop ALL", where, sc.Capabilities)
			case sc.SeccompProfile.Type != "RuntimeDefault":
				t.Errorf("%s: seccomp %q", where, sc.SeccompProfile.Type)
			}
			if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
				t.Errorf("%s: resources %+v lack cpu/memory requests or a memory limit", where, c.Resources)
			}
			component := w.Spec.Template.Metadata.Labels["app.kubernetes.io/component"]
			if len(c.Ports) != 1 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != ports[component] {
				t.Errorf("%s: ports %+v, want http %d", where, c.Ports, ports[component])
			}
			if v, _ := c.argValue("--web.listen-address"); v != ":"+strconv.Itoa(ports[component]) {
				t.Errorf("%s: --web.listen-address=%q", where, v)
			}
			for name, pr := range map[string]struct {
				p    *probe
				path string
			}{"liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}} {
				switch {
				case pr.p == nil || pr.p.HTTPGet == nil:
					t.Errorf("%s: no HTTP %s probe", where, name)
				case pr.p.HTTPGet.Path != pr.path || pr.p.HTTPGet.Port != "http" || pr.p.HTTPGet.Scheme != scheme:
					t.Errorf("%s: %s probe %+v, want %s %s on port http", where, name, *pr.p.HTTPGet, scheme, pr.path)
				}
			}
			if len(c.EnvFrom) > 0 {
				for _, ef := range c.EnvFrom {
					if ef.ConfigMapRef != nil {
						t.Errorf("%s: envFrom a ConfigMap could carry credentials in clear", where)
					}
				}
			}
			defined := map[string]bool{}
			for _, ev := range c.Env {
				defined[ev.Name] = true
				if slices.Contains(secretEnv, ev.Name) {
					if ev.Value != nil || ev.ValueFrom == nil || ev.ValueFrom.SecretKeyRef == nil || ev.ValueFrom.SecretKeyRef.Name == "" || ev.ValueFrom.SecretKeyRef.Key == "" {
						t.Errorf("%s: %s is not a secretKeyRef: %+v", where, ev.Name, ev)
					}
				}
			}
			for _, a := range c.Args {
				for _, ref := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(a, -1) {
					if !defined[ref[1]] {
						t.Errorf("%s: argument %q refers to undefined variable %s (Kubernetes would pass it literally)", where, a, ref[1])
					}
				}
				if strings.Contains(strings.ToLower(a), "secret") || strings.Contains(strings.ToLower(a), "password") {
					t.Errorf("%s: argument %q looks like a credential in a flag", where, a)
				}
			}
		}
	}
}

// assertDashboardConfigMaps checks one ConfigMap per dashboard file, labelled
// for the Grafana sidecar, holding the file verbatim.
func assertDashboardConfigMaps(t *testing.T, m manifests, files []string) {
	t.Helper()
	byFile := map[string]string{}
	for _, o := range m.ofKind("ConfigMap") {
		if o.Metadata.Labels["grafana_dashboard"] != "1" {
			t.Errorf("ConfigMap %s lacks the label grafana_dashboard: \"1\"", o.Metadata.Name)
		}
		var cm struct {
			Data map[string]string `yaml:"data"`
		}
		o.decode(t, &cm)
		for k, v := range cm.Data {
			byFile[k] = v
		}
	}
	for _, f := range files {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := byFile[filepath.Base(f)]
		if !ok {
			t.Errorf("no ConfigMap carries %s", filepath.Base(f))
			continue
		}
		if strings.TrimRight(got, "\n") != strings.TrimRight(string(want), "\n") {
			t.Errorf("ConfigMap data for %s differs from the file", filepath.Base(f))
		}
	}
}

// quantityBytes parses a Kubernetes quantity (10Gi) or a kingpin byte size
// (9216MiB) with a binary unit.
func quantityBytes(s string) (int64, error) {
	m := regexp.MustCompile(`^([0-9]+)(Ki|Mi|Gi|Ti|KiB|MiB|GiB|TiB)$`).FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q is not a size with a binary unit", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, err
	}
	shift := map[byte]uint{'K': 10, 'M': 20, 'G': 30, 'T': 40}[m[2][0]]
	return n << shift, nil
}

// assertClickHouseClusterArgs checks that a program of the production
// values gets the ClickHouse cluster, insert quorum and retention.
func assertClickHouseClusterArgs(t *testing.T, program string, c container) {
	t.Helper()
	for flag, want := range map[string]string{"--clickhouse.cluster": "analytics", "--clickhouse.insert-quorum": "2", "--clickhouse.retention": "30d"} {
		if v, _ := c.argValue(flag); v != want {
			t.Errorf("%s %s = %q, want %q (args %v)", program, flag, v, want, c.Args)
		}
	}
}

// assertReceiverSizes checks that the receiver's rendered sizes pass the
// receiver's own start-up checks (a spool that holds two segments with room
// for the largest batch, ingest memory for one request), and that its memory
// limit and GOMEMLIMIT follow the README's sizing rule.
func assertReceiverSizes(t *testing.T, m manifests) {
	t.Helper()
	c := workloadOf(t, m, "StatefulSet", "ci-edgepipe-receiver").Spec.Template.Spec.Containers[0]
	size := func(flag string) int64 {
		v, ok := c.argValue(flag)
		if !ok {
			t.Fatalf("receiver has no %s: %v", flag, c.Args)
		}
		n, err := quantityBytes(v)
		if err != nil {
			t.Fatalf("%s=%s: %v", flag, v, err)
		}
		return n
	}
	maxBytes, decoded, mem := size("--spool.max-bytes"), size("--ingest.max-decoded-bytes"), size("--ingest.max-memory-bytes")
	if need := spool.MinMaxBytes(spool.SegmentBytesFor(maxBytes), rtld.SpoolEntryBytes(decoded)); maxBytes < need {
		t.Errorf("--spool.max-bytes=%d is below %d: the receiver would refuse to start", maxBytes, need)
	}
	if need := rtld.MinMemoryBytes(rtld.DefaultMaxBodyBytes, decoded); mem < need {
		t.Errorf("--ingest.max-memory-bytes=%d is below %d: the receiver would refuse to start", mem, need)
	}
	limit, err := quantityBytes(c.Resources.Limits["memory"])
	if err != nil {
		t.Fatalf("receiver memory limit: %v", err)
	}
	if rule := 4*mem + 512<<20; limit < rule {
		t.Errorf("receiver memory limit %d is below the sizing rule's %d", limit, rule)
	}
	ev := c.env("GOMEMLIMIT")
	if ev == nil || ev.Value == nil {
		t.Fatalf("receiver has no GOMEMLIMIT value: %+v", ev)
	}
	if got, err := quantityBytes(*ev.Value); err != nil || got != (limit>>20)*85/100<<20 {
		t.Errorf("GOMEMLIMIT=%s, want 85%% of the %d-byte limit (%v)", *ev.Value, limit, err)
	}
}

// TestChartSpoolAlertsFire runs the receiver's spool alerts through
// `promtool test rules`: damaged spool bytes alert at once, a full spool
// disk after 5 minutes, and neither fires on a healthy receiver.
func TestChartSpoolAlertsFire(t *testing.T) {
	rules := prometheusRule(t, render(t, chartDir+"/ci/production-values.yaml")).file(t)
	pod := `namespace="edgepipe", pod="ci-edgepipe-receiver-0"`
	tests := fmt.Sprintf(`rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'edgepipe_rtld_spool_corrupt_bytes_total{%[1]s}'
        values: '0 0 0 19889 19889 19889 19889 19889 19889 19889'
      - series: 'edgepipe_rtld_spool_disk_full{%[1]s}'
        values: '0 0 1 1 1 1 1 1 1 1'
      - series: 'edgepipe_rtld_spool_corrupt_bytes_total{namespace="edgepipe", pod="ci-edgepipe-receiver-1"}'
        values: '0 0 0 0 0 0 0 0 0 0'
      - series: 'edgepipe_rtld_spool_disk_full{namespace="edgepipe", pod="ci-edgepipe-receiver-1"}'
        values: '0 0 0 0 0 0 0 0 0 0'
    alert_rule_test:
      - eval_time: 2m
        alertname: EdgepipeSpoolCorrupt
        exp_alerts: []
      - eval_time: 4m
        alertname: EdgepipeSpoolCorrupt
        exp_alerts:
          - exp_labels: {severity: critical, namespace: edgepipe, pod: ci-edgepipe-receiver-0}
            exp_annotations:
              summary: "damaged bytes in the spool of ci-edgepipe-receiver-0: acknowledged batches lost"
              runbook_url: "%[2]s#edgepipespoolcorrupt"
              description: "The receiver found spool bytes that fail their checksums, kept them in *.corrupt files beside the segment, and delivered everything else; edgepipe_rtld_spool_corrupt_entries_total counts the batches lost. The error log names the segment and offsets. Check the volume (disk errors, a bad node) and keep the .corrupt files for analysis."
      - eval_time: 5m
        alertname: EdgepipeSpoolDiskFull
        exp_alerts: []
      - eval_time: 8m
        alertname: EdgepipeSpoolDiskFull
        exp_alerts:
          - exp_labels: {severity: critical, namespace: edgepipe, pod: ci-edgepipe-receiver-0}
            exp_annotations:
              summary: "the spool disk of ci-edgepipe-receiver-0 is full"
              runbook_url: "%[2]s#edgepipespooldiskfull"
              description: "Ingest answers 503 and /readyz fails until delivery frees segments or the volume grows; delivery goes on. Is a sink down (see edgepipe_rtld_sink_lag_bytes), or is --spool.max-bytes larger than the volume?"
`, pod, "https://github.com/edgepipe/edgepipe/blob/main/docs/operations.md")
	promtoolTestRules(t, rules, []byte(tests))
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
