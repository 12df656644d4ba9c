package prometheus

import (
	"context"
	"errors"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
)

var edgeDataset = &metricsapi.Dataset{
	Name: "edge_usage_by_country",
	Dimensions: []metricsapi.Dimension{
		{Name: "time", Type: metricsapi.TypeDate},
		{Name: "environment_id", Type: metricsapi.TypeString},
		{Name: "country_code", Type: metricsapi.TypeString},
	},
	Metrics: []metricsapi.Metric{
		{Name: "requests_edge_total", Description: "Requests served by the edge."},
		{Name: "requests_cache_hit_ratio"},
		{Name: "bits_per_second_edge", Description: "Edge bandwidth."},
		{Name: "ttfb_edge_ms_95_percentile"},
		{Name: "ttfb_edge_ms_50_percentile"},
	},
}

var edgeMetrics = []string{"requests_edge_total", "requests_cache_hit_ratio", "bits_per_second_edge", "ttfb_edge_ms_95_percentile", "ttfb_edge_ms_50_percentile"}

var base = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)

func upd(env, country string, bucket int, prev []float64, vals ...float64) schedule.Update {
	return schedule.Update{
		Row:      metricsapi.Row{Time: base.Add(time.Duration(bucket) * 5 * time.Minute), Environment: env, Labels: []string{country}, Values: vals},
		Previous: prev,
	}
}

// total is the scheduler's running total of requests_edge_total for a
// label set whose newest bucket is bucket.
func total(env, country string, bucket int, v float64) schedule.SeriesCounts {
	nan := math.NaN()
	return schedule.SeriesCounts{Environment: env, Labels: []string{country}, Totals: []float64{v, nan, nan, nan, nan},
		Newest: base.Add(time.Duration(bucket) * 5 * time.Minute)}
}

func batch(us ...schedule.Update) *schedule.Batch {
	return &schedule.Batch{Dataset: edgeDataset, Granularity: metricsapi.FiveMinutes, Labels: []string{"country_code"}, Metrics: edgeMetrics, Updates: us}
}

// withTotals adds the series totals of a poll to b.
func withTotals(b *schedule.Batch, cs ...schedule.SeriesCounts) *schedule.Batch {
	b.Counts = append(b.Counts, cs...)
	return b
}

// values gathers reg and returns value by "name{l=v,...}" (labels sorted).
func values(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := make(map[string]float64)
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			var ls []string
			for _, lp := range m.Label {
				ls = append(ls, lp.GetName()+"="+lp.GetValue())
			}
			sort.Strings(ls)
			k := mf.GetName() + "{" + strings.Join(ls, ",") + "}"
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[k] = m.Counter.GetValue()
			case dto.MetricType_GAUGE:
				out[k] = m.Gauge.GetValue()
			}
		}
	}
	return out
}

func TestName(t *testing.T) {
	for _, tc := range []struct{ metric, name, pct string }{
		{"requests_edge_total", "cdn_ds_requests_edge_total", ""},
		{"bytes_origin_total", "cdn_ds_bytes_origin_total", ""},
		{"ttfb_edge_ms_95_percentile", "cdn_ds_ttfb_edge_seconds", "95"},
		{"response_time_origin_ms_5_percentile", "cdn_ds_response_time_origin_seconds", "5"},
		{"bits_per_second_edge", "cdn_ds_bytes_per_second_edge", ""},
		{"requests_per_second_edge", "cdn_ds_requests_per_second_edge", ""},
		{"requests_cache_hit_ratio", "cdn_ds_requests_cache_hit_ratio", ""},
		{"weird-name.x", "cdn_ds_weird_name_x", ""},
	} {
		name, pct := Name(DefaultPrefix, "ds", tc.metric)
		if name != tc.name || pct != tc.pct {
			t.Errorf("Name(%s) = %s, %q; want %s, %q", tc.metric, name, pct, tc.name, tc.pct)
		}
	}
	if name, _ := Name("edge", "ds", "requests_edge_total"); name != "edge_ds_requests_edge_total" {
		t.Errorf("with prefix edge: %s", name)
	}
}

func TestCountersGaugesAndRevisions(t *testing.T) {
	c := newCollector(t, Options{})
	reg := textGatherer{c}
	publish(t, c, withTotals(batch(
		upd("e1", "us", 0, nil, 100, 0.5, 8000, 120, 40),
		upd("e1", "us", 1, nil, 50, 0.75, 16000, 200, 60),
		upd("e1", "de", 1, nil, 7, math.NaN(), 800, 10, 5),
	), total("e1", "us", 1, 150), total("e1", "de", 1, 7)))
	// A revision of the older bucket: the counter takes the new total,
	// gauges keep bucket 1.
	publish(t, c, withTotals(batch(upd("e1", "us", 0, []float64{100, 0.5, 8000, 120, 40}, 110, 0.9, 9000, 130, 45)),
		total("e1", "us", 1, 160)))
	// A revision of the newest bucket moves its gauges; the same batch
	// published twice (or replayed after a restart) changes nothing more.
	for range 2 {
		publish(t, c, batch(upd("e1", "de", 1, []float64{7, math.NaN(), 800, 10, 5}, 7, 0.1, 800, 10, 5)))
	}
	got := values(t, reg)
	want := map[string]float64{
		"cdn_edge_usage_by_country_requests_edge_total{country_code=us,environment_id=e1}":             160,
		"cdn_edge_usage_by_country_requests_edge_total{country_code=de,environment_id=e1}":             7,
		"cdn_edge_usage_by_country_requests_cache_hit_ratio{country_code=us,environment_id=e1}":        0.75,
		"cdn_edge_usage_by_country_requests_cache_hit_ratio{country_code=de,environment_id=e1}":        0.1,
		"cdn_edge_usage_by_country_bytes_per_second_edge{country_code=us,environment_id=e1}":           2000,
		"cdn_edge_usage_by_country_bytes_per_second_edge{country_code=de,environment_id=e1}":           100,
		"cdn_edge_usage_by_country_ttfb_edge_seconds{country_code=us,environment_id=e1,percentile=95}": 0.2,
		"cdn_edge_usage_by_country_ttfb_edge_seconds{country_code=us,environment_id=e1,percentile=50}": 0.06,
		"cdn_edge_usage_by_country_ttfb_edge_seconds{country_code=de,environment_id=e1,percentile=95}": 0.01,
		"cdn_edge_usage_by_country_ttfb_edge_seconds{country_code=de,environment_id=e1,percentile=50}": 0.005,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || math.Abs(g-v) > 1e-12 {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if n := countPrefix(got, "cdn_"); n != len(want) {
		t.Errorf("%d series exposed, want %d: %v", n, len(want), got)
	}
	problems, err := promlint.NewWithMetricFamilies(mustGather(t, reg)).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %v", problems, err)
	}
	// A restart restores the counters from the totals alone (a series with
	// no bucket in the first poll after the restart included).
	c2 := newCollector(t, Options{})
	reg2 := textGatherer{c2}
	publish(t, c2, withTotals(batch(), total("e1", "us", 1, 160), total("e1", "de", 1, 7)))
	got2 := values(t, reg2)
	for _, k := range []string{
		"cdn_edge_usage_by_country_requests_edge_total{country_code=us,environment_id=e1}",
		"cdn_edge_usage_by_country_requests_edge_total{country_code=de,environment_id=e1}",
	} {
		if got2[k] != want[k] {
			t.Errorf("restored %s = %v, want %v", k, got2[k], want[k])
		}
	}
}

// countPrefix counts the series whose name starts with prefix.
func countPrefix(vals map[string]float64, prefix string) int {
	n := 0
	for k := range vals {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

func mustGather(t *testing.T, g prometheus.Gatherer) []*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

func TestEnvironmentsAndStaleness(t *testing.T) {
	c := newCollector(t, Options{SeriesTTL: time.Hour, GaugeMaxAge: 15 * time.Minute})
	reg := textGatherer{c}
	publish(t, c, withTotals(batch(upd("e1", "us", 0, nil, 1, 0.5, 8, 1, 1), upd("e2", "us", 0, nil, 2, 0.5, 8, 1, 1), upd("e1", "fr", 0, nil, 3, 0.5, 8, 1, 1)),
		total("e1", "us", 0, 1), total("e2", "us", 0, 2), total("e1", "fr", 0, 3)))
	c.SetEnvironments([]string{"e1"})
	if n := c.Series(); n != 2 {
		t.Fatalf("%d label sets after e2 vanished, want 2", n)
	}
	// Updates of a vanished environment that arrive late are ignored.
	publish(t, c, withTotals(batch(upd("e2", "us", 1, nil, 2, 0.5, 8, 1, 1)), total("e2", "us", 1, 4)))
	if n := c.Series(); n != 2 {
		t.Fatalf("%d label sets after a late e2 update, want 2", n)
	}
	// us keeps appearing for 40 minutes, fr does not: fr's gauges go after
	// 15 minutes, its counter stays until an hour.
	for b := 1; b <= 8; b++ {
		publish(t, c, withTotals(batch(upd("e1", "us", b, nil, 1, 0.5, 8, 1, 1)), total("e1", "us", b, float64(b+1))))
	}
	got := values(t, reg)
	if _, ok := got["cdn_edge_usage_by_country_requests_cache_hit_ratio{country_code=fr,environment_id=e1}"]; ok {
		t.Error("fr's gauge still exposed 40 minutes after its last bucket")
	}
	if v := got["cdn_edge_usage_by_country_requests_edge_total{country_code=fr,environment_id=e1}"]; v != 3 {
		t.Errorf("fr's counter = %v, want 3 until the TTL", v)
	}
	for b := 9; b <= 13; b++ {
		publish(t, c, withTotals(batch(upd("e1", "us", b, nil, 1, 0.5, 8, 1, 1)), total("e1", "us", b, float64(b+1))))
	}
	if n := c.Series(); n != 1 {
		t.Errorf("%d label sets 65 minutes after fr's last bucket, want 1", n)
	}
	if v := values(t, reg)["cdn_edge_usage_by_country_requests_edge_total{country_code=us,environment_id=e1}"]; v != 14 {
		t.Errorf("us counter = %v, want 14", v)
	}
	// A freed slot is reused without mixing state.
	publish(t, c, withTotals(batch(upd("e1", "it", 13, nil, 5, 0.25, 8, 1, 1)), total("e1", "it", 13, 5)))
	if v := values(t, reg)["cdn_edge_usage_by_country_requests_edge_total{country_code=it,environment_id=e1}"]; v != 5 {
		t.Errorf("it counter = %v, want 5", v)
	}
}

func TestSelfMetricsLintClean(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	now := base.Add(7 * time.Minute)
	m, err := NewSelfMetrics(reg, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	m.ObserveRequest("metrics", "POST", 200, time.Second)
	m.ObserveRequest("metrics", "POST", 429, time.Second)
	m.ObservePoll(schedule.PollReport{Dataset: "edge_errors", Start: base, Duration: time.Second, Revisions: 2, New: 5, NewestBucketEnd: base.Add(5 * time.Minute), Environments: 3})
	m.ObservePublishError("edge_errors", "otlp", nil)
	got := values(t, reg)
	for k, v := range map[string]float64{
		"edgepipe_bucket_lag_seconds{dataset=edge_errors}":                     120,
		"edgepipe_revisions_total{dataset=edge_errors}":                        2,
		"edgepipe_dataset_up{dataset=edge_errors}":                             1,
		"edgepipe_api_requests_total{method=POST,service=metrics,status=429}":  1,
		"edgepipe_publish_errors_total{dataset=edge_errors,sink=otlp}":         1,
		"edgepipe_environments{}":                                              3,
		"edgepipe_last_successful_poll_timestamp_seconds{dataset=edge_errors}": float64(base.Add(time.Second).Unix()),
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	problems, err := promlint.NewWithMetricFamilies(mustGather(t, reg)).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %v", problems, err)
	}
}

// TestSelfMetricsFailuresAreVisible: before any discovery succeeds the
// configured datasets are down (not missing) and discovery_up is 0; the
// problems a poll reports are counted by dataset and reason; the clock skew
// shows once known.
func TestSelfMetricsFailuresAreVisible(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewSelfMetrics(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.ExpectDatasets([]string{"edge_errors", "origin_errors"})
	var skew time.Duration
	known := false
	m.SetClockSkew(func() (time.Duration, bool) { return skew, known })
	m.ObserveDiscovery(schedule.DiscoveryReport{Err: errors.New("401")})
	got := values(t, reg)
	for k, v := range map[string]float64{
		"edgepipe_discovery_up{}":                                         0,
		"edgepipe_dataset_up{dataset=edge_errors}":                        0,
		"edgepipe_dataset_up{dataset=origin_errors}":                      0,
		"edgepipe_invalid_values_total{dataset=edge_errors,reason=nan}":   0,
		"edgepipe_invalid_rows_total{dataset=origin_errors,reason=arity}": 0,
		"edgepipe_count_decreases_ignored_total{dataset=origin_errors}":   0,
		"edgepipe_deferred_rows_total{dataset=edge_errors}":               0,
	} {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if _, ok := got["edgepipe_platform_clock_skew_seconds{}"]; ok {
		t.Error("clock skew exposed before it is known")
	}

	m.ObserveDiscovery(schedule.DiscoveryReport{Environments: 4, Datasets: []string{"edge_errors", "origin_errors"}})
	m.ObservePoll(schedule.PollReport{Dataset: "edge_errors", Environments: 4, Decreases: 2, Deferred: 3, Baseline: 7, StateErr: errors.New("disk full"),
		Problems: metricsapi.Problems{Values: map[string]int{"null": 5, "inf": 1}, Rows: map[string]int{"arity": 1}}})
	skew, known = -40*time.Minute, true
	got = values(t, reg)
	for k, v := range map[string]float64{
		"edgepipe_discovery_up{}":                                        1,
		"edgepipe_environments{}":                                        4,
		"edgepipe_dataset_up{dataset=edge_errors}":                       1,
		"edgepipe_dataset_up{dataset=origin_errors}":                     0,
		"edgepipe_invalid_values_total{dataset=edge_errors,reason=null}": 5,
		"edgepipe_invalid_values_total{dataset=edge_errors,reason=inf}":  1,
		"edgepipe_invalid_rows_total{dataset=edge_errors,reason=arity}":  1,
		"edgepipe_count_decreases_ignored_total{dataset=edge_errors}":    2,
		"edgepipe_deferred_rows_total{dataset=edge_errors}":              3,
		"edgepipe_baseline_buckets_total{dataset=edge_errors}":           7,
		"edgepipe_state_save_failures_total{dataset=edge_errors}":        1,
		"edgepipe_state_save_failures_total{dataset=origin_errors}":      0,
		"edgepipe_platform_clock_skew_seconds{}":                         -2400,
	} {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	problems, err := promlint.NewWithMetricFamilies(mustGather(t, reg)).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %v", problems, err)
	}
}

// TestHashCollision forces two label sets onto one hash: the second lives in
// the collision map, both keep their own values, and removal finds both.
func TestHashCollision(t *testing.T) {
	c := newCollector(t, Options{})
	publish(t, c, withTotals(batch(upd("e1", "us", 0, nil, 1, 0.5, 8, 1, 1)), total("e1", "us", 0, 1)))
	d := c.datasets["edge_usage_by_country"]
	b := upd("e2", "de", 0, nil, 2, 0.5, 8, 1, 1)
	d.index[d.hashLabels("e2", []string{"de"})] = 0 // e2/de now "collides" with e1/us
	for i := range 2 {
		publish(t, c, withTotals(batch(b), total("e2", "de", 0, float64(2*(i+1)))))
	}
	if n := c.Series(); n != 2 || len(d.collide) != 1 {
		t.Fatalf("%d series, %d in the collision map; want 2 and 1", n, len(d.collide))
	}
	reg := textGatherer{c}
	got := values(t, reg)
	if got["cdn_edge_usage_by_country_requests_edge_total{country_code=de,environment_id=e2}"] != 4 ||
		got["cdn_edge_usage_by_country_requests_edge_total{country_code=us,environment_id=e1}"] != 1 {
		t.Fatalf("values mixed up: %v", got)
	}
	c.SetEnvironments(nil)
	if n := c.Series(); n != 0 || len(d.collide) != 0 {
		t.Fatalf("%d series, %d collisions left after every environment vanished", n, len(d.collide))
	}
}

// newCollector is NewCollector for options the test expects to be valid.
func newCollector(tb testing.TB, opts Options) *Collector {
	tb.Helper()
	c, err := NewCollector(opts)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// publish hands b to c and fails the test if c refuses it.
func publish(tb testing.TB, c *Collector, b *schedule.Batch) {
	tb.Helper()
	if err := c.Publish(context.Background(), b); err != nil {
		tb.Fatal(err)
	}
}
