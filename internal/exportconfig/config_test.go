package exportconfig

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
)

func TestParseErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		want []string // every one must appear in the error
	}{
		{"bad regex", `
datasets:
  edge_usage_by_country:
    metrics:
      include: ["requests_(edge"]
`, []string{"datasets.edge_usage_by_country.metrics.include[0] (line 5)", "bad regular expression", "missing closing )"}},
		{"unknown key in a dataset", `
datasets:
  edge_errors:
    dimensons: [country_code]
`, []string{"datasets.edge_errors.dimensons (line 4): unknown key (known here: dimensions, metrics, percentiles)"}},
		{"unknown top-level key", "prefx: x\n", []string{"prefx (line 1): unknown key"}},
		{"bad prefix", "prefix: 9cdn\n", []string{"prefix (line 1)", `"9cdn" is not a metric-name prefix`}},
		{"prefix with a dot", "prefix: my.cdn\n", []string{"prefix (line 1)"}},
		{"bad percentile", `
datasets:
  edge_usage_by_country:
    percentiles: [50, fifty, 100]
`, []string{`datasets.edge_usage_by_country.percentiles[1] (line 4): "fifty" is not a percentile`,
			`datasets.edge_usage_by_country.percentiles[2] (line 4): "100" is not a percentile`}},
		{"environment selector regex", `
environments:
  exclude:
    - name: "qa["
`, []string{"environments.exclude[0].name (line 4): bad regular expression"}},
		{"empty selector", `
environments:
  include:
    - {}
`, []string{"environments.include[0] (line 4): empty selector"}},
		{"selector as a plain string", `
environments:
  include: [production]
`, []string{"environments.include[0] (line 3): want a mapping of id, name, property"}},
		{"dimensions not a list", `
datasets:
  edge_errors:
    dimensions: country_code
`, []string{"datasets.edge_errors.dimensions (line 4): want a list"}},
		{"dimension twice", `
datasets:
  edge_errors:
    dimensions: [country_code, country_code]
`, []string{`datasets.edge_errors.dimensions[1] (line 4): dimension "country_code" listed twice`}},
		{"empty include", `
datasets:
  edge_errors:
    metrics: {include: []}
`, []string{"datasets.edge_errors.metrics.include (line 4): an empty include list selects no metric"}},
		{"not YAML", "datasets: [\n", []string{"config file test.yaml: yaml:"}},
		{"not a mapping", "- a\n", []string{"the file (line 1): want a mapping of prefix, environments, datasets"}},
		{"datasets not a mapping", "datasets: [edge_errors]\n", []string{"datasets (line 1): want a mapping"}},
		{"every problem at once", `
prefix: "-"
datasets:
  a: {dimensions: x}
  b: {percentiles: [0]}
`, []string{"prefix (line 2)", "datasets.a.dimensions (line 4)", "datasets.b.percentiles[0] (line 5)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml), "test.yaml")
			if err == nil {
				t.Fatalf("accepted: %+v", c)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestParse(t *testing.T) {
	c, err := Parse([]byte(`
prefix: edge
environments:
  include:
    - property: storefront
    - name: eu-.*
      property: media-cdn
  exclude:
    - id: 0b6c5a1e-0000-4000-8000-000000000001
datasets:
  edge_usage_by_country:
    dimensions: []
    metrics:
      include: ["requests_.*", "bytes_.*", ".*_percentile"]
      exclude: [".*prefetch.*"]
    percentiles: [50, 99.9]
  origin_usage:
    dimensions: [origin_name]
`), "ok.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Prefix != "edge" || len(c.Include) != 2 || len(c.Exclude) != 1 || len(c.Datasets) != 2 {
		t.Fatalf("parsed %+v", c)
	}
	d := c.Datasets[0]
	if d.Name != "edge_usage_by_country" || d.Dimensions == nil || len(d.Dimensions) != 0 ||
		len(d.MetricsInclude) != 3 || len(d.MetricsExclude) != 1 || !slices.Equal(d.Percentiles, []float64{50, 99.9}) {
		t.Errorf("dataset %+v", d)
	}
	if c.Datasets[1].Percentiles != nil || c.Datasets[1].MetricsInclude != nil {
		t.Errorf("absent keys must mean everything: %+v", c.Datasets[1])
	}

	// Environments: include by property slug (or ID), or by name within a
	// property; exclude by ID.
	store := platform.Property{ID: "p-1", Slug: "storefront"}
	media := platform.Property{ID: "p-2", Slug: "media-cdn"}
	other := platform.Property{ID: "p-3", Slug: "docs-site"}
	for _, tc := range []struct {
		env  platform.Environment
		prop platform.Property
		want bool
	}{
		{platform.Environment{ID: "e1", Name: "production"}, store, true},
		{platform.Environment{ID: "e2", Name: "eu-production"}, media, true},
		{platform.Environment{ID: "e3", Name: "production"}, media, false},
		{platform.Environment{ID: "e4", Name: "eu-production"}, other, false},
		{platform.Environment{ID: "0b6c5a1e-0000-4000-8000-000000000001", Name: "production"}, store, false},
		// The property is matched by ID too, from the environment when
		// the property is unknown.
		{platform.Environment{ID: "e5", Name: "x", PropertyID: "storefront"}, platform.Property{}, true},
		// Anchored: a name that merely contains the pattern does not match.
		{platform.Environment{ID: "e6", Name: "neu-production"}, media, false},
	} {
		if got := c.Keep(tc.env, tc.prop); got != tc.want {
			t.Errorf("Keep(%+v, %+v) = %v, want %v", tc.env, tc.prop, got, tc.want)
		}
	}
	if !c.FiltersEnvironments() || Default().FiltersEnvironments() || Default().Prefix != "cdn" {
		t.Error("FiltersEnvironments or Default wrong")
	}
	empty, err := Parse(nil, "empty.yaml")
	if err != nil || empty.Prefix != DefaultPrefix || empty.FiltersEnvironments() || len(empty.Datasets) != 0 {
		t.Errorf("empty file: %+v, %v", empty, err)
	}
}

func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("prefix: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil || c.Prefix != "x" || c.Source != path {
		t.Fatalf("Load = %+v, %v", c, err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "config file") {
		t.Errorf("missing file: %v", err)
	}
}

// descriptors mirror two of the platform's datasets.
func descriptors() []metricsapi.Dataset {
	pcts := func(stem string) []metricsapi.Metric {
		var out []metricsapi.Metric
		for _, p := range []string{"5", "25", "50", "75", "95", "99"} {
			out = append(out, metricsapi.Metric{Name: stem + "_ms_" + p + "_percentile"})
		}
		return out
	}
	usage := metricsapi.Dataset{Name: "edge_usage_by_country",
		Dimensions: []metricsapi.Dimension{{Name: "time"}, {Name: "environment_id"}, {Name: "country_code"}},
		Metrics: append(append([]metricsapi.Metric{{Name: "requests_edge_total"}, {Name: "requests_prefetch_total"},
			{Name: "requests_cache_hit_ratio"}, {Name: "bytes_edge_total"}}, pcts("ttfb_edge")...), pcts("response_time_edge")...)}
	errs := metricsapi.Dataset{Name: "edge_errors",
		Dimensions: []metricsapi.Dimension{{Name: "time"}, {Name: "environment_id"}, {Name: "country_code"}, {Name: "http_status_code"}},
		Metrics:    []metricsapi.Metric{{Name: "requests_edge_total"}}}
	return []metricsapi.Dataset{usage, errs}
}

func TestSelect(t *testing.T) {
	for _, tc := range []struct {
		name     string
		yaml     string
		strict   bool
		wantErr  []string
		warnings []string
		check    func(t *testing.T, out []metricsapi.Dataset)
	}{
		{name: "dimensions, metrics and percentiles", strict: true, yaml: `
datasets:
  edge_usage_by_country:
    dimensions: []
    metrics:
      exclude: [".*prefetch.*", ".*_ratio"]
    percentiles: [50, 99]
  edge_errors:
    dimensions: [http_status_code]
`, check: func(t *testing.T, out []metricsapi.Dataset) {
			if len(out) != 2 {
				t.Fatalf("%d datasets", len(out))
			}
			u, e := out[0], out[1]
			want := []string{"requests_edge_total", "bytes_edge_total", "ttfb_edge_ms_50_percentile", "ttfb_edge_ms_99_percentile",
				"response_time_edge_ms_50_percentile", "response_time_edge_ms_99_percentile"}
			if !slices.Equal(u.MetricNames(), want) || len(u.LabelNames()) != 0 || !slices.Equal(u.Aggregated, []string{"country_code"}) {
				t.Errorf("usage: metrics %v labels %v aggregated %v", u.MetricNames(), u.LabelNames(), u.Aggregated)
			}
			if !slices.Equal(e.LabelNames(), []string{"http_status_code"}) || !slices.Equal(e.Aggregated, []string{"country_code"}) {
				t.Errorf("errors: labels %v aggregated %v", e.LabelNames(), e.Aggregated)
			}
		}},
		{name: "datasets not configured are whole", strict: true, yaml: "prefix: x\n", check: func(t *testing.T, out []metricsapi.Dataset) {
			if len(out) != 2 || len(out[0].Metrics) != 16 || len(out[1].LabelNames()) != 2 || out[0].Aggregated != nil {
				t.Errorf("%+v", out)
			}
		}},
		{name: "unknown dataset, dimension and percentile", strict: true, yaml: `
datasets:
  edge_usage:
    dimensions: []
  edge_errors:
    dimensions: [contry_code]
    percentiles: [50]
  edge_usage_by_country:
    percentiles: [90]
`, wantErr: []string{
			"datasets.edge_usage: unknown dataset (the platform offers edge_usage_by_country, edge_errors)",
			`datasets.edge_errors.dimensions[0]: unknown dimension "contry_code" of dataset edge_errors (it has country_code, http_status_code)`,
			"datasets.edge_errors.percentiles: dataset edge_errors has no percentile metrics",
			"datasets.edge_usage_by_country.percentiles[0]: dataset edge_usage_by_country has no percentile 90 (it has 5, 25, 50, 75, 95, 99)",
		}},
		{name: "nothing left", strict: true, yaml: `
datasets:
  edge_errors:
    metrics: {exclude: [".*"]}
`, wantErr: []string{"datasets.edge_errors: no metric of dataset edge_errors is selected"}},
		{name: "lenient: what is gone is left out, with warnings", yaml: `
datasets:
  edge_usage:
    dimensions: []
  edge_errors:
    dimensions: [contry_code, http_status_code]
    metrics: {include: ["requests_.*", "hits_.*"]}
`, warnings: []string{
			"datasets.edge_usage: unknown dataset (the platform offers edge_usage_by_country, edge_errors)",
			`datasets.edge_errors.dimensions[0]: unknown dimension "contry_code" of dataset edge_errors (it has country_code, http_status_code); aggregated`,
			`datasets.edge_errors.metrics.include[1]: "hits_.*" matches no metric of dataset edge_errors`,
		}, check: func(t *testing.T, out []metricsapi.Dataset) {
			if len(out) != 2 || !slices.Equal(out[1].LabelNames(), []string{"http_status_code"}) {
				t.Errorf("%+v", out)
			}
		}},
		{name: "lenient: a dataset left without metrics is left out", yaml: `
datasets:
  edge_errors:
    metrics: {include: ["hits_.*"]}
`, check: func(t *testing.T, out []metricsapi.Dataset) {
			if len(out) != 1 || out[0].Name != "edge_usage_by_country" {
				t.Errorf("%+v", out)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml), "test.yaml")
			if err != nil {
				t.Fatal(err)
			}
			out, warnings, err := c.Select(descriptors(), tc.strict)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("accepted: %+v", out)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q\ndoes not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.warnings {
				if !slices.Contains(warnings, w) {
					t.Errorf("warnings %q\nlack %q", warnings, w)
				}
			}
			tc.check(t, out)
		})
	}
}
