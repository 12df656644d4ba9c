package testenv

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func TestPrometheusScrapesAndQueries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "testenv_requests_total", Help: "Requests."}, []string{"code"})
	reg.MustRegister(c)
	c.WithLabelValues("200").Add(42)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	p := Prometheus(t, strings.TrimPrefix(srv.URL, "http://"))
	p.WaitTargetsUp(t, 30*time.Second)

	deadline := time.Now().Add(30 * time.Second)
	for {
		vec := p.QueryVector(t, `testenv_requests_total{job="edgepipe",code="200"}`)
		if len(vec) == 1 {
			if got := float64(vec[0].Value); got != 42 {
				t.Fatalf("scraped value %v, want 42", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sample after 30s: %v", vec)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if vec := p.QueryVector(t, `up{job="edgepipe"}`); len(vec) != 1 || vec[0].Value != 1 {
		t.Fatalf("up: %v", vec)
	}
}

func TestPrometheusConfigJobs(t *testing.T) {
	t.Parallel()
	cfg := prometheusConfig([]ScrapeJob{
		{Name: "a", Targets: []string{"127.0.0.1:1", "127.0.0.1:2"}},
		{Name: "b", Targets: []string{"127.0.0.1:3"}, MetricsPath: "/m", Scheme: "https", BasicAuthUser: "u", BasicAuthPassword: "p\"w",
			Labels: map[string]string{"pod": "ci-edgepipe-exporter-0", "namespace": "edgepipe"}},
		{Name: "c", Targets: []string{"127.0.0.1:4"}, ScrapeInterval: 15 * time.Second},
	}, 0)
	for _, want := range []string{
		`scrape_interval: 1s`,
		`job_name: "a"`, `targets: ["127.0.0.1:1", "127.0.0.1:2"]`,
		`metrics_path: "/m"`, `scheme: "https"`, `insecure_skip_verify: true`, `password: "p\"w"`,
		"targets: [\"127.0.0.1:3\"]\n        labels:\n          namespace: \"edgepipe\"\n          pod: \"ci-edgepipe-exporter-0\"\n",
		"job_name: \"c\"\n    scrape_interval: 15s\n    scrape_timeout: 15s\n",
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
}

func TestPromtoolCheckMetrics(t *testing.T) {
	t.Parallel()
	promtool := Promtool(t)
	tests := []struct {
		name       string
		exposition string
		wantErr    bool
	}{
		{"clean", "# HELP x_total Things.\n# TYPE x_total counter\nx_total 1\n", false},
		{"counter without _total", "# HELP x Things.\n# TYPE x counter\nx 1\n", true},
		{"no help", "# TYPE x_total counter\nx_total 1\n", true},
		{"quantile label on a gauge", "# HELP x_seconds Latency.\n# TYPE x_seconds gauge\nx_seconds{quantile=\"0.5\"} 1\n", true},
		{"not an exposition", "this is { not metrics\n", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := PromtoolCheckMetrics(promtool, []byte(tc.exposition))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v (output %q), want error %v", err, out, tc.wantErr)
			}
		})
	}
}
