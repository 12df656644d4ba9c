package metricsapi_test

// Integration tests: the metrics client, on the platform client, against the
// platform simulator over real loopback HTTP, checked against the
// simulator's ground truth.

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
)

// simNow is the simulator's fixed clock: data is deterministic and tokens
// never expire.
var simNow = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

func startSim(t *testing.T, cfg platformsim.Config) (*platformsim.Server, *metricsapi.Client) {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return simNow }
	}
	srv, err := platformsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	pc, err := platform.New(platform.Config{
		BaseURL:      base,
		AuthURL:      base,
		ClientID:     platformsim.DemoClientID,
		ClientSecret: platformsim.DemoClientSecret,
		Retry:        platform.RetryConfig{MaxAttempts: 8, InitialInterval: 10 * time.Millisecond, MaxInterval: 100 * time.Millisecond},
		Version:      "test",
	})
	if err != nil {
		t.Fatal(err)
	}
	return srv, metricsapi.NewClient(pc.Metrics())
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestSimDatasets(t *testing.T) {
	srv, c := startSim(t, platformsim.Config{Seed: 1})
	ds, err := c.Datasets(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range ds {
		names = append(names, d.Name)
		var labels []string
		for _, l := range d.Labels() {
			labels = append(labels, l.Name)
		}
		if !slices.Equal(labels, srv.DatasetLabels(d.Name)) || !slices.Equal(d.MetricNames(), srv.DatasetMetrics(d.Name)) {
			t.Errorf("%s: labels %v metrics %v, simulator has %v %v", d.Name, labels, d.MetricNames(), srv.DatasetLabels(d.Name), srv.DatasetMetrics(d.Name))
		}
		if !d.Supports(metricsapi.FiveMinutes) || d.Retention.For(metricsapi.Hour) == 0 {
			t.Errorf("%s: granularities %v retention %+v", d.Name, d.TimeGranularities, d.Retention)
		}
	}
	if !slices.Equal(names, srv.DatasetNames()) {
		t.Errorf("datasets %v, want %v", names, srv.DatasetNames())
	}
	d, err := c.Dataset(testCtx(t), "origin_errors")
	if err != nil || d.Name != "origin_errors" {
		t.Fatalf("Dataset = %+v, %v", d, err)
	}
	if _, err := c.Dataset(testCtx(t), "nope"); !platform.IsNotFound(err) {
		t.Errorf("unknown dataset: err = %v, want 404", err)
	}
}

func TestSimDataMatchesGroundTruth(t *testing.T) {
	tests := []struct {
		name     string
		datasets []string
		envs     int // first n environments of the world
		g        metricsapi.Granularity
		span     time.Duration
		numbers  platformsim.NumberStyle
		faults   platformsim.Faults
		requests int
	}{
		// 21 environments and 25 hours: 2 environment chunks × 2 spans.
		{"21 envs 25h five-minute", []string{"edge_errors"}, 21, metricsapi.FiveMinutes, 25 * time.Hour, platformsim.NumbersMixed, platformsim.Faults{}, 4},
		{"all datasets 8 days hourly", nil, 1, metricsapi.Hour, 8 * 24 * time.Hour, platformsim.NumbersOnly, platformsim.Faults{}, 2},
		{"numbers as strings", []string{"edge_usage_by_country", "origin_errors"}, 2, metricsapi.Hour, 30 * time.Hour, platformsim.NumbersAsStrings, platformsim.Faults{}, 1},
		{"61 days daily", []string{"edge_usage_by_country"}, 21, metricsapi.Day, 61 * 24 * time.Hour, platformsim.NumbersMixed, platformsim.Faults{}, 4},
		{"through 5xx faults", []string{"origin_offload"}, 21, metricsapi.Hour, 2 * 24 * time.Hour, platformsim.NumbersMixed, platformsim.Faults{Rate5xx: 0.5}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, c := startSim(t, platformsim.Config{Seed: 7, Numbers: tt.numbers, Faults: tt.faults})
			ctx := testCtx(t)
			envs := srv.EnvironmentIDs()[:tt.envs]
			end := tt.g.Truncate(simNow)
			start := end.Add(-tt.span)
			datasets := tt.datasets
			if datasets == nil {
				datasets = srv.DatasetNames()
			}
			for _, ds := range datasets {
				srv.ResetStats()
				res, err := c.Data(ctx, metricsapi.Query{Dataset: ds, Environments: envs, Granularity: tt.g, Start: start, End: end})
				if err != nil {
					t.Fatalf("%s: %v", ds, err)
				}
				if res.Requests != tt.requests {
					t.Errorf("%s: %d requests, want %d", ds, res.Requests, tt.requests)
				}
				checkLimits(t, srv.Stats().Data, tt.g, tt.requests)
				if !slices.Equal(res.Labels, srv.DatasetLabels(ds)) || !slices.Equal(res.Metrics, srv.DatasetMetrics(ds)) {
					t.Fatalf("%s: result labels %v metrics %v", ds, res.Labels, res.Metrics)
				}
				want := map[string][]float64{}
				for _, env := range envs {
					rows, err := srv.Rows(ds, env, tt.g, start, end, simNow)
					if err != nil {
						t.Fatal(err)
					}
					for _, r := range rows {
						want[rowKey(r)] = r.Values
					}
				}
				if len(want) == 0 {
					t.Fatalf("%s: the simulator's truth is empty; the test would prove nothing", ds)
				}
				if len(res.Rows) != len(want) {
					t.Errorf("%s: %d rows, want %d", ds, len(res.Rows), len(want))
				}
				bad := 0
				for _, r := range res.Rows {
					w, ok := want[rowKey(r)]
					if !ok || !sameValues(r.Values, w) {
						if bad++; bad <= 3 {
							t.Errorf("%s: row %s = %v, want %v (present %v)", ds, rowKey(r), r.Values, w, ok)
						}
					}
				}
				for i, l := range res.Labels {
					if l != "http_status_code" {
						continue
					}
					for _, r := range res.Rows {
						if strings.ContainsAny(r.Labels[i], ".e") || len(r.Labels[i]) != 3 {
							t.Fatalf("%s: http_status_code label %q, want a plain integer", ds, r.Labels[i])
						}
					}
				}
			}
			if tt.faults.Rate5xx > 0 {
				var failed int
				for route, byStatus := range srv.Stats().Requests {
					if strings.Contains(route, "/data") {
						failed += byStatus[500] + byStatus[503]
					}
				}
				if failed == 0 {
					t.Error("no 5xx was injected; the retry path went untested")
				}
			}
		})
	}
}

// checkLimits asserts what the simulator saw: every data request within the
// API's limits, with explicit granularity and the time dimension.
func checkLimits(t *testing.T, seen []platformsim.DataRequest, g metricsapi.Granularity, want int) {
	t.Helper()
	ok := 0
	for _, d := range seen {
		if d.Status != http.StatusOK {
			continue
		}
		ok++
		if len(d.Environments) == 0 || len(d.Environments) > metricsapi.MaxFilterValues {
			t.Errorf("request with %d environments", len(d.Environments))
		}
		if span := d.End.Sub(d.Start); span <= 0 || span > g.MaxRange() {
			t.Errorf("request spanning %s at %s", span, g)
		}
		if d.GranularitySent != string(g) || !slices.Contains(d.Dimensions, metricsapi.DimensionTime) ||
			!slices.Contains(d.Dimensions, metricsapi.DimensionEnvironment) {
			t.Errorf("request without explicit granularity or time/environment dimensions: %+v", d)
		}
	}
	if ok != want {
		t.Errorf("simulator answered %d data requests, want %d", ok, want)
	}
}

func rowKey(r metricsapi.Row) string {
	return fmt.Sprintf("%s|%s|%s", r.Environment, r.Time.UTC().Format(time.RFC3339), strings.Join(r.Labels, ","))
}

func sameValues(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && !(math.IsNaN(a[i]) && math.IsNaN(b[i])) {
			return false
		}
	}
	return true
}

func TestSimDataHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	srv, c := startSim(t, platformsim.Config{Seed: 1, Faults: platformsim.Faults{RetryAfter: time.Second}})
	ctx := testCtx(t)
	q := metricsapi.Query{Dataset: "edge_errors", Environments: srv.EnvironmentIDs()[:1], Granularity: metricsapi.Hour,
		Start: simNow.Add(-3 * time.Hour).Truncate(time.Hour), End: simNow.Truncate(time.Hour)}
	if _, err := c.Data(ctx, q); err != nil { // descriptor and token ready
		t.Fatal(err)
	}
	srv.FailNext(1, http.StatusTooManyRequests)
	start := time.Now()
	res, err := c.Data(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("query took %s after a 429 with Retry-After: 1", took)
	}
	if res.Requests != 1 {
		t.Errorf("Requests = %d, want 1 (a retry is not a new request)", res.Requests)
	}
}
