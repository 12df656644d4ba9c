package rtld

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

func idBatch(agent, day string, seq int64) *accesslog.Batch {
	return &accesslog.Batch{EnvironmentID: "env", ProfileID: "1", Format: accesslog.FormatJSON, AgentID: agent, Datestamp: day, SeqNum: seq,
		Records: []json.RawMessage{json.RawMessage(`{}`)}}
}

func TestGapTracker(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	g, err := NewGapTracker(t.TempDir(), time.Minute, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_800_000_000, 0)
	for _, seq := range []int64{0, 1, 4, 2, 1, 7} { // 3, 5, 6 missing; 1 duplicated; 2 late but in grace
		g.observe(idBatch("a", "20261123", seq), t0)
	}
	g.observe(idBatch("b", "20261123", 0), t0)
	g.observe(idBatch("a", "20261124", 0), t0) // midnight reset: no gap
	gaps := func() float64 { return testutil.ToFloat64(m.gaps.WithLabelValues("env", "a")) }
	if d := testutil.ToFloat64(m.duplicates.WithLabelValues("env", "a")); d != 1 {
		t.Fatalf("duplicates = %v, want 1", d)
	}
	g.sweep(t0.Add(30 * time.Second))
	if gaps() != 0 || testutil.ToFloat64(m.missing) != 3 {
		t.Fatalf("within grace: gaps %v missing %v", gaps(), testutil.ToFloat64(m.missing))
	}
	g.observe(idBatch("a", "20261123", 5), t0.Add(40*time.Second)) // arrives within grace
	g.sweep(t0.Add(2 * time.Minute))
	if gaps() != 2 || testutil.ToFloat64(m.missing) != 0 {
		t.Fatalf("after grace: gaps %v (want 2) missing %v", gaps(), testutil.ToFloat64(m.missing))
	}
	if g.Seen(idBatch("a", "20261123", 3)) || !g.Seen(idBatch("a", "20261123", 4)) || g.Seen(idBatch("a", "20261123", 8)) {
		t.Fatal("Seen is wrong")
	}
	g.observe(idBatch("a", "20261123", 6), t0.Add(3*time.Minute)) // after being counted lost
	if l := testutil.ToFloat64(m.late.WithLabelValues("env", "a")); l != 1 {
		t.Fatalf("late = %v", l)
	}
	// A reset far ahead: nothing below it is taken for a duplicate.
	g.observe(idBatch("c", "20261123", 1), t0)
	g.observe(idBatch("c", "20261123", 1+maxJump+5), t0)
	if g.Seen(idBatch("c", "20261123", 1)) {
		t.Fatal("a seq below a reset counts as seen (its batch would be dropped)")
	}
	// State survives a restart.
	if _, err := g.save(); err != nil {
		t.Fatal(err)
	}
	g2, err := NewGapTracker(g.path[:len(g.path)-len("/gaps.json")], time.Minute, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !g2.Seen(idBatch("a", "20261123", 6)) || g2.Seen(idBatch("a", "20261123", 3)) {
		t.Fatal("state not restored")
	}
}

// flakySink fails its first n deliveries.
