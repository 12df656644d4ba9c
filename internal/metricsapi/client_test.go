package metricsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeAPI implements API in memory: a descriptor per dataset and a data
// endpoint that answers one row per (environment, bucket, label value) of
// the request, in reverse order, checking the API's limits like the real one.
type fakeAPI struct {
	datasets map[string]Dataset
	fail     func(n int, b Body) error // optional: error for the n-th data call

	mu          sync.Mutex
	bodies      []Body
	descCalls   int
	inFlight    atomic.Int32
	maxInFlight atomic.Int32
}

func (f *fakeAPI) Do(ctx context.Context, method, path string, _ url.Values, in, out any) error {
	switch {
	case method == http.MethodGet && path == "/datasets":
		var items []Dataset
		for _, d := range f.datasets {
			items = append(items, d)
		}
		return roundTrip(map[string]any{"@type": "Collection", "items": items}, out)
	case method == http.MethodGet && strings.HasPrefix(path, "/datasets/"):
		f.mu.Lock()
		f.descCalls++
		f.mu.Unlock()
		d, ok := f.datasets[strings.TrimPrefix(path, "/datasets/")]
		if !ok {
			return errors.New("404")
		}
		return roundTrip(d, out)
	case method == http.MethodPost && strings.HasSuffix(path, "/data"):
		n := f.inFlight.Add(1)
		defer f.inFlight.Add(-1)
		for {
			m := f.maxInFlight.Load()
			if n <= m || f.maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		b := in.(Body)
		f.mu.Lock()
		f.bodies = append(f.bodies, b)
		call := len(f.bodies)
		f.mu.Unlock()
		select { // let concurrent calls overlap
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		if f.fail != nil {
			if err := f.fail(call, b); err != nil {
				return err
			}
		}
		return roundTrip(f.answer(b), out)
	}
	return fmt.Errorf("unexpected %s %s", method, path)
}

func (f *fakeAPI) answer(b Body) map[string]any {
	if len(b.Filters[DimensionEnvironment]) > MaxFilterValues {
		panic("more than 20 environments")
	}
	start, _ := time.Parse(time.RFC3339, b.DateRange.Start)
	end, _ := time.Parse(time.RFC3339, b.DateRange.End)
	if end.Sub(start) > b.TimeGranularity.MaxRange() {
		panic("range too long")
	}
	// data_fields: metrics first, then dimensions reversed.
	var fields []map[string]string
	for _, m := range b.Metrics {
		fields = append(fields, map[string]string{"name": m, "data_type": "NUMBER"})
	}
	for i := len(b.Dimensions) - 1; i >= 0; i-- {
		fields = append(fields, map[string]string{"name": b.Dimensions[i], "data_type": "STRING"})
	}
	var rows [][]any
	for t := start; t.Before(end); t = t.Add(b.TimeGranularity.Duration()) {
		for _, e := range b.Filters[DimensionEnvironment] {
			var row []any
			for i := range b.Metrics {
				row = append(row, strconv.Itoa(i+1)) // numeric strings
			}
			for i := len(b.Dimensions) - 1; i >= 0; i-- {
				switch b.Dimensions[i] {
				case DimensionTime:
					row = append(row, t.Format(time.RFC3339))
				case DimensionEnvironment:
					row = append(row, e)
				default:
					row = append(row, "v-"+b.Dimensions[i])
				}
			}
			rows = append(rows, row)
		}
	}
	slices.Reverse(rows)
	return map[string]any{"@type": "Data", "data_fields": fields, "data_rows": rows}
}

func roundTrip(v, out any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

func testDataset() Dataset {
	return Dataset{
		Name:              "edge_usage_by_country",
		TimeGranularities: Granularities,
		Dimensions: []Dimension{
			{Name: "time", Type: TypeDate}, {Name: "environment_id", Type: TypeString}, {Name: "country_code", Type: TypeString},
		},
		Metrics: []Metric{{Name: "requests_edge_total", Type: TypeNumber}, {Name: "requests_cache_hit_ratio", Type: TypeNumber}},
		Filters: []Filter{{Name: "environment_id", Required: true}, {Name: "country_code"}},
	}
}

func TestDataSplitsAndMerges(t *testing.T) {
	f := &fakeAPI{datasets: map[string]Dataset{"edge_usage_by_country": testDataset()}}
	c := NewClient(f)
	c.concurrency = 3
	envs := envIDs(45)
	q := Query{Dataset: "edge_usage_by_country", Environments: envs, Granularity: FiveMinutes,
		Start: t0, End: t0.Add(30 * time.Hour)}
	res, err := c.Data(t.Context(), q)
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 6 || len(f.bodies) != 6 {
		t.Errorf("Requests = %d, calls = %d, want 6 (3 environment chunks × 2 spans)", res.Requests, len(f.bodies))
	}
	if got := strings.Join(res.Labels, ","); got != "country_code" {
		t.Errorf("Labels = %s, want the descriptor's", got)
	}
	if got := strings.Join(res.Metrics, ","); got != "requests_edge_total,requests_cache_hit_ratio" {
		t.Errorf("Metrics = %s, want the descriptor's", got)
	}
	if want := 45 * 360; len(res.Rows) != want {
		t.Fatalf("%d rows, want %d", len(res.Rows), want)
	}
	seen := map[string]bool{}
	for _, r := range res.Rows {
		k := r.SeriesKey() + r.Time.String()
		if seen[k] {
			t.Fatalf("row %s twice", k)
		}
		seen[k] = true
		if r.Labels[0] != "v-country_code" || r.Values[0] != 1 || r.Values[1] != 2 {
			t.Fatalf("row %+v decoded wrongly", r)
		}
	}
	if m := f.maxInFlight.Load(); m > 3 || m < 2 {
		t.Errorf("at most %d requests in flight, want 2..3 (concurrency 3)", m)
	}
	// The descriptor is fetched once and reused.
	if _, err := c.Data(t.Context(), q); err != nil {
		t.Fatal(err)
	}
	if f.descCalls != 1 {
		t.Errorf("descriptor fetched %d times, want 1", f.descCalls)
	}
}

func TestDataChecksAgainstDescriptor(t *testing.T) {
	f := &fakeAPI{datasets: map[string]Dataset{"edge_usage_by_country": testDataset()}}
	c := NewClient(f)
	base := Query{Dataset: "edge_usage_by_country", Environments: envIDs(2), Granularity: Hour, Start: t0, End: t0.Add(time.Hour)}
	for _, tt := range []struct {
		name   string
		mutate func(*Query)
		want   string
	}{
		{"unknown metric", func(q *Query) { q.Metrics = []string{"nope"} }, `unknown metric "nope"`},
		{"unknown label", func(q *Query) { q.Labels = []string{"origin_name"} }, `unknown dimension "origin_name"`},
		{"unknown filter", func(q *Query) { q.Filters = map[string][]string{"http_method": {"GET"}} }, `unknown filter "http_method"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			q := base
			tt.mutate(&q)
			_, err := c.Data(t.Context(), q)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
			if len(f.bodies) != 0 {
				t.Errorf("%d data requests sent for an invalid query", len(f.bodies))
			}
		})
	}
	// Explicit labels and metrics with no descriptor known: no descriptor
	// call, and the dimensions sent are time, environment_id, labels.
	f2 := &fakeAPI{datasets: map[string]Dataset{}}
	q := base
	q.Labels, q.Metrics = []string{}, []string{"requests_edge_total"}
	res, err := NewClient(f2).Data(t.Context(), q)
	if err != nil {
		t.Fatal(err)
	}
	if f2.descCalls != 0 || len(res.Rows) != 2 || strings.Join(f2.bodies[0].Dimensions, ",") != "time,environment_id" {
		t.Errorf("descriptor calls %d, rows %d, dimensions %v", f2.descCalls, len(res.Rows), f2.bodies[0].Dimensions)
	}
}

func TestDataFailsWholeQueryAndStopsTheRest(t *testing.T) {
	boom := errors.New("boom")
	f := &fakeAPI{
		datasets: map[string]Dataset{"edge_usage_by_country": testDataset()},
		fail: func(n int, _ Body) error {
			if n == 2 {
				return boom
			}
			return nil
		},
	}
	c := NewClient(f)
	c.concurrency = 2
	q := Query{Dataset: "edge_usage_by_country", Environments: envIDs(20 * 10), Granularity: Hour, Start: t0, End: t0.Add(time.Hour)}
	_, err := c.Data(t.Context(), q)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if !strings.Contains(err.Error(), "edge_usage_by_country") {
		t.Errorf("err = %q does not name the dataset", err)
	}
	if n := len(f.bodies); n >= 10 {
		t.Errorf("%d of 10 requests sent after the failure; want the rest cancelled", n)
	}
	if f.inFlight.Load() != 0 {
		t.Error("requests still in flight after Data returned")
	}
}

func TestDataContextCancelled(t *testing.T) {
	f := &fakeAPI{datasets: map[string]Dataset{"edge_usage_by_country": testDataset()}}
	c := NewClient(f)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	q := Query{Dataset: "edge_usage_by_country", Environments: envIDs(100), Granularity: Hour, Start: t0, End: t0.Add(time.Hour),
		Labels: []string{}, Metrics: []string{"requests_edge_total"}}
	if _, err := c.Data(ctx, q); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestDataNoEnvironments(t *testing.T) {
	f := &fakeAPI{datasets: map[string]Dataset{"edge_usage_by_country": testDataset()}}
	res, err := NewClient(f).Data(t.Context(), Query{Dataset: "edge_usage_by_country", Granularity: Hour, Start: t0, End: t0.Add(time.Hour)})
	if err != nil || res.Requests != 0 || len(res.Rows) != 0 || len(f.bodies) != 0 {
		t.Fatalf("res = %+v, err = %v, calls %d", res, err, len(f.bodies))
	}
}

func TestDatasets(t *testing.T) {
	f := &fakeAPI{datasets: map[string]Dataset{"edge_usage_by_country": testDataset()}}
	c := NewClient(f)
	ds, err := c.Datasets(t.Context())
	if err != nil || len(ds) != 1 || ds[0].Name != "edge_usage_by_country" || len(ds[0].Labels()) != 1 {
		t.Fatalf("Datasets = %+v, %v", ds, err)
	}
	// Listing fills the descriptor cache: Data needs no further call.
	if _, err := c.Data(t.Context(), Query{Dataset: "edge_usage_by_country", Environments: envIDs(1), Granularity: Day, Start: t0, End: t0.Add(24 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if f.descCalls != 0 {
		t.Errorf("descriptor fetched %d times after Datasets, want 0", f.descCalls)
	}
	d, err := c.Dataset(t.Context(), "edge_usage_by_country")
	if err != nil || d.Name != "edge_usage_by_country" || f.descCalls != 1 {
		t.Fatalf("Dataset = %+v, %v", d, err)
	}
}
