package prometheus

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
)

// TestSeriesBudget: with room for two label sets of edge_usage_by_country
// (5 metrics each) and one of edge_errors, new label sets beyond it are
// refused and counted, the ones held keep updating, room freed by a vanished
// environment admits a refused label set, and the budget shows in the
// self-metrics and the log, lint-clean.
func TestSeriesBudget(t *testing.T) {
	var logs bytes.Buffer
	c := NewCollector(Options{MaxSeries: 11, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	reg := textGatherer{c}
	ctx := context.Background()
	errs := &metricsapi.Dataset{Name: "edge_errors", Dimensions: edgeDataset.Dimensions,
		Metrics: []metricsapi.Metric{{Name: "requests_edge_total"}}}
	errBatch := func(env string, v float64) *schedule.Batch {
		return &schedule.Batch{Dataset: errs, Granularity: metricsapi.FiveMinutes, Labels: []string{"country_code"},
			Metrics: []string{"requests_edge_total"}, Updates: []schedule.Update{{Row: metricsapi.Row{
				Time: base, Environment: env, Labels: []string{"us"}, Values: []float64{v}}}},
			Counts: []schedule.SeriesCounts{{Environment: env, Labels: []string{"us"}, Totals: []float64{v}, Newest: base}}}
	}

	c.Publish(ctx, withTotals(batch(upd("e1", "us", 0, nil, 10, 0.5, 8, 1, 1), upd("e1", "de", 0, nil, 20, 0.5, 8, 1, 1),
		upd("e1", "fr", 0, nil, 30, 0.5, 8, 1, 1)), total("e1", "us", 0, 10), total("e1", "de", 0, 20), total("e1", "fr", 0, 30)))
	c.Publish(ctx, errBatch("e1", 3))
	c.Publish(ctx, errBatch("e2", 4)) // 11 held: no room for e2's
	got := values(t, reg)
	want := map[string]float64{
		"edgepipe_series{dataset=edge_usage_by_country}":                     10,
		"edgepipe_series{dataset=edge_errors}":                               1,
		"edgepipe_series_limit_dropped_total{dataset=edge_usage_by_country}": 5,
		"edgepipe_series_limit_dropped_total{dataset=edge_errors}":           1,
		"edgepipe_series_limit{}":                                            11,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if n := countPrefix(got, "cdn_"); n != 11 {
		t.Errorf("%d cdn series exposed, budget 11", n)
	}
	if _, ok := got["cdn_edge_usage_by_country_requests_edge_total{country_code=fr,environment_id=e1}"]; ok {
		t.Error("the refused label set is exposed")
	}
	// The label sets held keep updating: a revision moves the counter. A
	// refused label set with both a row and totals in a batch counts once.
	c.Publish(ctx, withTotals(batch(upd("e1", "us", 0, []float64{10, 0.5, 8, 1, 1}, 15, 0.5, 8, 1, 1), upd("e1", "fr", 1, nil, 1, 1, 1, 1, 1)),
		total("e1", "us", 0, 15), total("e1", "fr", 1, 31)))
	got = values(t, reg)
	if v := got["cdn_edge_usage_by_country_requests_edge_total{country_code=us,environment_id=e1}"]; v != 15 {
		t.Errorf("held counter = %v after a revision, want 15", v)
	}
	if v := got["edgepipe_series_limit_dropped_total{dataset=edge_usage_by_country}"]; v != 10 {
		t.Errorf("dropped = %v after fr was refused again, want 10", v)
	}
	// Only the first refusal of each dataset is logged within the interval.
	if n := strings.Count(logs.String(), "series budget reached"); n != 2 ||
		!strings.Contains(logs.String(), "dataset=edge_usage_by_country refused_series=5") ||
		!strings.Contains(logs.String(), "dataset=edge_errors refused_series=1") {
		t.Errorf("%d budget warnings:\n%s", n, logs.String())
	}
	// e1 goes away: its 11 series are released and e2's label set fits.
	c.SetEnvironments([]string{"e2"})
	c.Publish(ctx, errBatch("e2", 4))
	got = values(t, reg)
	if v := got["cdn_edge_errors_requests_edge_total{country_code=us,environment_id=e2}"]; v != 4 {
		t.Errorf("e2's counter = %v once there is room, want 4", v)
	}
	if got["edgepipe_series{dataset=edge_usage_by_country}"] != 0 || got["edgepipe_series{dataset=edge_errors}"] != 1 {
		t.Errorf("series after e1 vanished: %v", got)
	}
	problems, err := promlint.NewWithMetricFamilies(mustGather(t, reg)).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %v", problems, err)
	}
}

// TestSeriesBudgetAccounting: what the budget holds follows label sets
// created, widened by new metrics, reset by new labels and swept by the TTL.
func TestSeriesBudgetAccounting(t *testing.T) {
	c := NewCollector(Options{SeriesTTL: time.Hour})
	ctx := context.Background()
	held := func() int64 {
		c.budget.mu.Lock()
		defer c.budget.mu.Unlock()
		return c.budget.held["edge_usage_by_country"]
	}
	c.Publish(ctx, batch(upd("e1", "us", 0, nil, 1, 0.5, 8, 1, 1), upd("e1", "de", 0, nil, 1, 0.5, 8, 1, 1)))
	if h := held(); h != 10 {
		t.Fatalf("held %d, want 10", h)
	}
	wider := batch(upd("e1", "us", 1, nil, 1, 0.5, 8, 1, 1, 7))
	wider.Metrics = append(append([]string{}, edgeMetrics...), "requests_hit_total")
	c.Publish(ctx, wider)
	if h := held(); h != 12 {
		t.Errorf("held %d after a sixth metric, want 12", h)
	}
	c.Publish(ctx, batch(upd("e1", "us", 13, nil, 1, 0.5, 8, 1, 1))) // de's newest is 65 min old
	if h := held(); h != 6 {
		t.Errorf("held %d after de expired, want 6", h)
	}
	fewer := &schedule.Batch{Dataset: edgeDataset, Granularity: metricsapi.FiveMinutes, Labels: []string{}, Metrics: edgeMetrics,
		Updates: []schedule.Update{{Row: metricsapi.Row{Time: base.Add(time.Hour), Environment: "e1", Values: []float64{1, 0.5, 8, 1, 1}}}}}
	c.Publish(ctx, fewer)
	if h := held(); h != 5 {
		t.Errorf("held %d after the labels changed, want 5", h)
	}
	if c.budget.sum != 5 {
		t.Errorf("sum %d", c.budget.sum)
	}
}
