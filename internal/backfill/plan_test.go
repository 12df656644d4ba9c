package backfill

import (
	"fmt"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

func planDatasets() []metricsapi.Dataset {
	return []metricsapi.Dataset{{
		Name:       "origin_offload",
		Retention:  metricsapi.Retention{FiveMinutes: 2764800, Hour: 8208000, Day: 69120000},
		Dimensions: []metricsapi.Dimension{{Name: "time"}, {Name: "environment_id"}, {Name: "http_method"}},
		Metrics:    []metricsapi.Metric{{Name: "requests_edge_total"}},
	}}
}

func envs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("env-%02d", i)
	}
	return out
}

func TestPlanAlignedLegalChunks(t *testing.T) {
	now := time.Date(2026, 11, 20, 12, 7, 0, 0, time.UTC)
	cfg := Config{Datasets: planDatasets(), Environments: envs(25), From: now.Add(-7 * 24 * time.Hour), To: now,
		Now: func() time.Time { return now }}
	chunks, clamped, err := Plan(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(clamped) != 0 {
		t.Errorf("clamped %v", clamped)
	}
	// [13th 12:05, 14th 00:00), six whole days, [20th 00:00, 20th 12:05) × 2 environment batches.
	if len(chunks) != 8*2 {
		t.Fatalf("%d chunks, want 16", len(chunks))
	}
	for _, c := range chunks {
		r := c.Request
		if len(r.Environments) > 20 || r.End.Sub(r.Start) > 24*time.Hour || !r.Start.Before(r.End) {
			t.Errorf("illegal chunk %s..%s with %d environments", r.Start, r.End, len(r.Environments))
		}
		if r.End.After(time.Date(2026, 11, 20, 12, 5, 0, 0, time.UTC)) {
			t.Errorf("chunk reaches into the current bucket: %s", r.End)
		}
		if len(r.Labels) != 1 || r.Labels[0] != "http_method" {
			t.Errorf("labels %v", r.Labels)
		}
	}
	// A run a few minutes later with the same relative range plans the same
	// whole-day chunks, so it resumes instead of starting over.
	later := now.Add(13 * time.Minute)
	cfg2 := cfg
	cfg2.From, cfg2.To, cfg2.Now = later.Add(-7*24*time.Hour), later, func() time.Time { return later }
	chunks2, _, err := Plan(cfg2)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, c := range chunks2 {
		ids[c.ID] = true
	}
	same := 0
	for _, c := range chunks {
		if ids[c.ID] {
			same++
		}
	}
	if same != 6*2 {
		t.Errorf("%d chunks shared with a run 13 minutes later, want the 12 of the six whole days", same)
	}
}

func TestPlanClampsToRetention(t *testing.T) {
	now := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	cfg := Config{Datasets: planDatasets(), Environments: envs(3), From: now.Add(-90 * 24 * time.Hour), To: now,
		Now: func() time.Time { return now }}
	chunks, clamped, err := Plan(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(clamped) != 1 {
		t.Errorf("clamped = %v, want origin_offload", clamped)
	}
	oldest := now.Add(-32 * 24 * time.Hour).Add(5 * time.Minute)
	if got := chunks[0].Request.Start; !got.Equal(oldest) {
		t.Errorf("first chunk starts %s, want %s (32 days of retention plus one bucket)", got, oldest)
	}
	if _, _, err := Plan(Config{Datasets: planDatasets(), Environments: envs(1), From: now, To: now}); err == nil {
		t.Error("empty range accepted")
	}
}
