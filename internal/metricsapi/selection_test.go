package metricsapi

import (
	"slices"
	"strings"
	"testing"
)

func TestSelect(t *testing.T) {
	ds := &Dataset{
		Name: "origin_usage",
		Dimensions: []Dimension{{Name: "time"}, {Name: "environment_id"}, {Name: "origin_name"},
			{Name: "http_method"}, {Name: "content_type"}},
		Metrics: []Metric{{Name: "requests_origin_total"}, {Name: "bytes_origin_total"},
			{Name: "ttfb_origin_ms_50_percentile"}, {Name: "ttfb_origin_ms_99_percentile"}},
	}
	noPercentiles := func(m string) bool { return Classify(m).Kind != KindPercentile }
	for _, tc := range []struct {
		name           string
		sel            Selection
		wantLabels     []string
		wantAggregated []string
		wantMetrics    []string
		wantErr        string
	}{
		{name: "everything", wantLabels: []string{"origin_name", "http_method", "content_type"},
			wantMetrics: ds.MetricNames()},
		{name: "descriptor order, not the selection's", sel: Selection{Dimensions: []string{"content_type", "origin_name"}},
			wantLabels: []string{"origin_name", "content_type"}, wantAggregated: []string{"http_method"}, wantMetrics: ds.MetricNames()},
		{name: "none: one series per environment", sel: Selection{Dimensions: []string{}, Metric: noPercentiles},
			wantLabels: []string{}, wantAggregated: []string{"origin_name", "http_method", "content_type"},
			wantMetrics: []string{"requests_origin_total", "bytes_origin_total"}},
		{name: "unknown dimension", sel: Selection{Dimensions: []string{"country_code"}},
			wantErr: `unknown dimension "country_code" (dataset origin_usage has origin_name, http_method, content_type)`},
		{name: "environment is always kept", sel: Selection{Dimensions: []string{"environment_id"}}, wantErr: "always kept"},
		{name: "no metric left", sel: Selection{Metric: func(string) bool { return false }}, wantErr: "no metric"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ds.Select(tc.sel)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Select = %v, want error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if labels := got.LabelNames(); !slices.Equal(labels, tc.wantLabels) {
				t.Errorf("labels %v, want %v", labels, tc.wantLabels)
			}
			if !slices.Equal(got.Aggregated, tc.wantAggregated) {
				t.Errorf("aggregated %v, want %v", got.Aggregated, tc.wantAggregated)
			}
			if !slices.Equal(got.MetricNames(), tc.wantMetrics) {
				t.Errorf("metrics %v, want %v", got.MetricNames(), tc.wantMetrics)
			}
			if got.Name != ds.Name || len(ds.Dimensions) != 5 || len(ds.Metrics) != 4 {
				t.Error("Select changed the original or the name")
			}
		})
	}
}
