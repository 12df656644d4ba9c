package testenv

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ScrapeMetrics fetches a Prometheus text exposition from url (a /metrics
// endpoint) and returns its metric families by name.
func ScrapeMetrics(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: parse: %w", url, err)
	}
	return mfs, nil
}

// SampleSum returns the sum of the values of the samples of family name
// whose labels include every pair of labels (counters, gauges and untyped
// samples; 0 when there is none).
func SampleSum(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	var sum float64
	for _, m := range mfs[name].GetMetric() {
		if hasLabels(m, labels) {
			sum += sampleValue(m)
		}
	}
	return sum
}

func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// SamplesByLabel returns, for the samples of family name whose labels
// include every pair of labels, the sum of their values by the value of
// label (the empty string for samples without it).
func SamplesByLabel(mfs map[string]*dto.MetricFamily, name, label string, labels map[string]string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range mfs[name].GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		v := ""
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				v = lp.GetValue()
			}
		}
		out[v] += sampleValue(m)
	}
	return out
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// scrapeT is ScrapeMetrics that fails the test on error.
func scrapeT(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mfs, err := ScrapeMetrics(ctx, url)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return mfs
}
