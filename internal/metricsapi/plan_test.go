package metricsapi

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func envIDs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("env-%02d", i)
	}
	return out
}

var t0 = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

func TestPlanSplits(t *testing.T) {
	tests := []struct {
		name         string
		q            Query
		wantRequests int
		wantSpans    int // distinct time spans
	}{
		{"one env one hour", Query{Environments: envIDs(1), Granularity: FiveMinutes, Start: t0, End: t0.Add(time.Hour)}, 1, 1},
		{"20 envs", Query{Environments: envIDs(20), Granularity: FiveMinutes, Start: t0, End: t0.Add(time.Hour)}, 1, 1},
		{"21 envs", Query{Environments: envIDs(21), Granularity: FiveMinutes, Start: t0, End: t0.Add(time.Hour)}, 2, 1},
		{"45 envs", Query{Environments: envIDs(45), Granularity: Hour, Start: t0, End: t0.Add(time.Hour)}, 3, 1},
		{"5m exactly 24h", Query{Environments: envIDs(1), Granularity: FiveMinutes, Start: t0, End: t0.Add(24 * time.Hour)}, 1, 1},
		{"5m 24h+5m", Query{Environments: envIDs(1), Granularity: FiveMinutes, Start: t0, End: t0.Add(24*time.Hour + 5*time.Minute)}, 2, 2},
		{"5m 3 days 41 envs", Query{Environments: envIDs(41), Granularity: FiveMinutes, Start: t0, End: t0.Add(72 * time.Hour)}, 9, 3},
		{"hour 7 days", Query{Environments: envIDs(1), Granularity: Hour, Start: t0, End: t0.Add(7 * 24 * time.Hour)}, 1, 1},
		{"hour 8 days", Query{Environments: envIDs(1), Granularity: Hour, Start: t0, End: t0.Add(8 * 24 * time.Hour)}, 2, 2},
		{"day 61 days", Query{Environments: envIDs(1), Granularity: Day, Start: t0, End: t0.AddDate(0, 0, 61)}, 2, 2},
		{"day 120 days", Query{Environments: envIDs(1), Granularity: Day, Start: t0, End: t0.AddDate(0, 0, 120)}, 2, 2},
		{"duplicate envs", Query{Environments: append(envIDs(20), envIDs(20)...), Granularity: Hour, Start: t0, End: t0.Add(time.Hour)}, 1, 1},
		{"empty range", Query{Environments: envIDs(3), Granularity: Hour, Start: t0, End: t0}, 0, 0},
		{"no environments", Query{Granularity: Hour, Start: t0, End: t0.Add(time.Hour)}, 0, 0},
		{"big label filter", Query{Environments: envIDs(1), Granularity: Hour, Start: t0, End: t0.Add(time.Hour),
			Labels: []string{"country_code"}, Filters: map[string][]string{"country_code": envIDs(30)}}, 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := tt.q
			q.Dataset = "edge_usage_by_country"
			q.Metrics = []string{"requests_edge_total"}
			reqs, err := Plan(q)
			if err != nil {
				t.Fatal(err)
			}
			if len(reqs) != tt.wantRequests {
				t.Fatalf("%d requests, want %d", len(reqs), tt.wantRequests)
			}
			checkPlan(t, q, reqs)
			spans := map[string]bool{}
			for _, r := range reqs {
				spans[r.Start.String()+r.End.String()] = true
			}
			if len(spans) != tt.wantSpans {
				t.Errorf("%d time spans, want %d", len(spans), tt.wantSpans)
			}
		})
	}
}

// checkPlan asserts the invariants of every plan: each request within the
// API's limits and aligned, and together they cover every (environment,
// bucket) of the query exactly once.
func checkPlan(t *testing.T, q Query, reqs []Request) {
	t.Helper()
	g := q.Granularity
	covered := map[string]int{}
	for i, r := range reqs {
		if len(r.Environments) > MaxFilterValues || len(r.Environments) == 0 {
			t.Errorf("request %d has %d environments", i, len(r.Environments))
		}
		for name, v := range r.Filters {
			if len(v) > MaxFilterValues {
				t.Errorf("request %d: filter %s has %d values", i, name, len(v))
			}
		}
		if d := r.End.Sub(r.Start); d <= 0 || d > g.MaxRange() {
			t.Errorf("request %d spans %s (max %s)", i, d, g.MaxRange())
		}
		if !g.Truncate(r.Start).Equal(r.Start) || !g.Truncate(r.End).Equal(r.End) {
			t.Errorf("request %d not aligned: %s..%s", i, r.Start, r.End)
		}
		b := r.Body()
		if b.TimeGranularity != g || b.Dimensions[0] != DimensionTime || b.Dimensions[1] != DimensionEnvironment {
			t.Errorf("request %d body lacks explicit time/granularity: %+v", i, b)
		}
		if !slices.Equal(b.Filters[DimensionEnvironment], r.Environments) {
			t.Errorf("request %d: environment filter %v", i, b.Filters[DimensionEnvironment])
		}
		for s := r.Start; s.Before(r.End); s = s.Add(g.Duration()) {
			for _, e := range r.Environments {
				covered[fmt.Sprint(e, s, r.Filters)]++
			}
		}
	}
	for k, n := range covered {
		if n != 1 {
			t.Errorf("%s covered %d times", k, n)
		}
	}
	envs := map[string]bool{}
	for _, e := range q.Environments {
		envs[e] = true
	}
	start, end := g.Truncate(q.Start), g.Truncate(q.End)
	if end.Before(q.End) {
		end = end.Add(g.Duration())
	}
	combos := 1 // value chunks of the other filters multiply the pairs
	for name, v := range q.Filters {
		if name != DimensionEnvironment {
			combos *= (len(dedupe(v)) + MaxFilterValues - 1) / MaxFilterValues
		}
	}
	if want := len(envs) * int(end.Sub(start)/g.Duration()) * combos; len(reqs) > 0 && len(covered) != want {
		t.Errorf("plan covers %d (environment, bucket) pairs, want %d", len(covered), want)
	}
}

func TestPlanBody(t *testing.T) {
	q := Query{
		Dataset: "edge_errors", Environments: []string{"e1", "e2"}, Granularity: Hour,
		Start: t0, End: t0.Add(2 * time.Hour),
		Labels:  []string{"country_code", "time", "http_status_code", "country_code"},
		Metrics: []string{"requests_edge_total"},
		Filters: map[string][]string{"http_status_code": {"503"}},
	}
	reqs, err := Plan(q)
	if err != nil || len(reqs) != 1 {
		t.Fatalf("Plan: %v, %d requests", err, len(reqs))
	}
	b := reqs[0].Body()
	if got := strings.Join(b.Dimensions, ","); got != "time,environment_id,country_code,http_status_code" {
		t.Errorf("dimensions = %s", got)
	}
	if b.DateRange.Start != "2026-11-01T00:00:00Z" || b.DateRange.End != "2026-11-01T02:00:00Z" {
		t.Errorf("date_range = %+v", b.DateRange)
	}
	if !slices.Equal(b.Filters["http_status_code"], []string{"503"}) || len(b.Filters) != 2 {
		t.Errorf("filters = %v", b.Filters)
	}
	if b.TimeGranularity != Hour {
		t.Errorf("time_granularity = %s", b.TimeGranularity)
	}
}

func TestPlanWidensUnalignedRange(t *testing.T) {
	q := Query{Dataset: "d", Environments: []string{"e"}, Granularity: FiveMinutes, Metrics: []string{"m"},
		Start: t0.Add(7 * time.Minute), End: t0.Add(21 * time.Minute)}
	reqs, err := Plan(q)
	if err != nil || len(reqs) != 1 {
		t.Fatalf("Plan: %v, %d requests", err, len(reqs))
	}
	if !reqs[0].Start.Equal(t0.Add(5*time.Minute)) || !reqs[0].End.Equal(t0.Add(25*time.Minute)) {
		t.Errorf("range %s..%s, want 00:05..00:25", reqs[0].Start, reqs[0].End)
	}
}

func TestPlanRejects(t *testing.T) {
	base := Query{Dataset: "d", Environments: []string{"e"}, Granularity: Hour, Metrics: []string{"m"}, Start: t0, End: t0.Add(time.Hour)}
	tests := []struct {
		name   string
		mutate func(*Query)
		want   string
	}{
		{"no dataset", func(q *Query) { q.Dataset = "" }, "no dataset"},
		{"bad granularity", func(q *Query) { q.Granularity = "MINUTE" }, "unknown granularity"},
		{"no metrics", func(q *Query) { q.Metrics = nil }, "no metrics"},
		{"no start", func(q *Query) { q.Start = time.Time{} }, "required"},
		{"end before start", func(q *Query) { q.End = t0.Add(-time.Hour) }, "before start"},
		{"empty env", func(q *Query) { q.Environments = []string{""} }, "empty environment"},
		{"empty filter", func(q *Query) { q.Filters = map[string][]string{"country_code": {}} }, "no values"},
		{"unsplittable filter", func(q *Query) { q.Filters = map[string][]string{"country_code": envIDs(21)} }, "cannot be split"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := base
			tt.mutate(&q)
			_, err := Plan(q)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}
