package rtld

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	dir := t.TempDir()
	g, err := NewGapTracker(dir, time.Minute, m, nil)
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
	if err := g.save(); err != nil {
		t.Fatal(err)
	}
	g.Close()
	g2, err := NewGapTracker(dir, time.Minute, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !g2.Seen(idBatch("a", "20261123", 6)) || g2.Seen(idBatch("a", "20261123", 3)) {
		t.Fatal("state not restored")
	}
}

// flakySink fails its first n deliveries.

// TestGapTrackerJumpsAreRanges: 30 agents jumping by 99,999 seq_nums keep
// one range each, in memory and in the state file, through sweeps, late
// arrivals and a restart.
func TestGapTrackerJumpsAreRanges(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	dir := t.TempDir()
	g, err := NewGapTracker(dir, time.Minute, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_800_000_000, 0)
	for a := 0; a < 30; a++ {
		agent := fmt.Sprintf("agent-%02d", a)
		g.observe(idBatch(agent, "20261123", 0), t0)
		g.observe(idBatch(agent, "20261123", 99_999), t0)
	}
	for _, a := range g.agents {
		if d := a.days["20261123"]; len(d.Missing) != 1 || d.Missing.size() != 99_998 {
			t.Fatalf("missing state %v", d.Missing)
		}
	}
	if g.Seen(idBatch("agent-03", "20261123", 50_000)) || !g.Seen(idBatch("agent-03", "20261123", 99_999)) {
		t.Fatal("Seen is wrong inside a range")
	}
	g.sweep(t0.Add(30 * time.Second))
	if got := testutil.ToFloat64(m.missing); got != 30*99_998 {
		t.Fatalf("missing gauge %v", got)
	}
	g.sweep(t0.Add(2 * time.Minute))
	if got := testutil.ToFloat64(m.gaps.WithLabelValues("env", "agent-07")); got != 99_998 {
		t.Fatalf("gaps of agent-07 = %v", got)
	}
	g.observe(idBatch("agent-07", "20261123", 50_000), t0.Add(3*time.Minute))
	if got := testutil.ToFloat64(m.late.WithLabelValues("env", "agent-07")); got != 1 {
		t.Fatalf("late = %v", got)
	}
	if err := g.save(); err != nil {
		t.Fatal(err)
	}
	g.Close()
	st, err := os.Stat(filepath.Join(dir, stateFile))
	if err != nil || st.Size() > 128<<10 {
		t.Fatalf("state file: %v, %d bytes", err, st.Size())
	}
	g2, err := NewGapTracker(dir, time.Minute, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	d := g2.agents[agentKey{"env", "1", "agent-07"}].days["20261123"]
	if len(d.Lost) != 2 || d.Lost.size() != 99_997 || !g2.Seen(idBatch("agent-07", "20261123", 50_000)) || g2.Seen(idBatch("agent-07", "20261123", 50_001)) {
		t.Fatalf("restored lost ranges %v", d.Lost)
	}
}

func TestGapTrackerForgetsSilentAgentsAndSavesOnlyChanges(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	dir := t.TempDir()
	g, err := NewGapTracker(dir, time.Minute, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	now := time.Now()
	// Silent for 4 days less an hour: kept as long as the platform may
	// still resend its batches.
	g.observe(idBatch("old", "20261123", 0), now.Add(-forgetAfter+time.Hour))
	g.observe(idBatch("new", "20261123", 0), now)
	path := filepath.Join(dir, stateFile)
	if err := g.save(); err != nil {
		t.Fatal(err)
	}
	st1, _ := os.Stat(path)
	time.Sleep(20 * time.Millisecond)
	g.sweep(now) // changes nothing: both agents within grace + 4 days
	if err := g.save(); err != nil {
		t.Fatal(err)
	}
	if st2, _ := os.Stat(path); !st2.ModTime().Equal(st1.ModTime()) {
		t.Fatal("unchanged state written again")
	}
	g.sweep(now.Add(2 * time.Hour))
	if len(g.agents) != 1 || !g.Seen(idBatch("new", "20261123", 0)) || g.Seen(idBatch("old", "20261123", 0)) {
		t.Fatalf("after forgetting: %d agents", len(g.agents))
	}
	if err := g.save(); err != nil {
		t.Fatal(err)
	}
	if st3, _ := os.Stat(path); st3.ModTime().Equal(st1.ModTime()) {
		t.Fatal("forgetting an agent did not save the state")
	}
}

// TestGapTrackerReadsTheLegacyStateFile: the gaps.json of earlier releases
// (one map entry per missing seq_num) is read, converted and removed.
func TestGapTrackerReadsTheLegacyStateFile(t *testing.T) {
	dir := t.TempDir()
	legacy := `{"next_index":42,"agents":[{"environment_id":"env","profile_id":"1","agent_id":"a","days":{"20261123":{"max":9,"missing":{"3":1800000000,"4":1800000000,"7":1800000001},"lost":{"1":true}}}}]}`
	if err := os.WriteFile(filepath.Join(dir, legacyStateFile), []byte(legacy), 0o640); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(prometheus.NewRegistry())
	g, err := NewGapTracker(dir, time.Minute, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	if g.next != 42 {
		t.Fatalf("next index %d", g.next)
	}
	d := g.agents[agentKey{"env", "1", "a"}].days["20261123"]
	want := seqRanges{{3, 4, 1800000000}, {7, 7, 1800000001}}
	if fmt.Sprint(d.Missing) != fmt.Sprint(want) || fmt.Sprint(d.Lost) != fmt.Sprint(seqRanges{{1, 1, 0}}) {
		t.Fatalf("converted missing %v lost %v", d.Missing, d.Lost)
	}
	for seq, seen := range map[int64]bool{1: false, 2: true, 3: false, 5: true, 7: false, 9: true, 10: false} {
		if g.Seen(idBatch("a", "20261123", seq)) != seen {
			t.Fatalf("Seen(%d) != %v", seq, seen)
		}
	}
	if err := g.save(); err != nil {
		t.Fatal(err)
	}
	g.Close()
	if _, err := os.Stat(filepath.Join(dir, legacyStateFile)); !os.IsNotExist(err) {
		t.Fatalf("legacy state not removed: %v", err)
	}
	g2, err := NewGapTracker(dir, time.Minute, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	if g2.Seen(idBatch("a", "20261123", 4)) || !g2.Seen(idBatch("a", "20261123", 5)) {
		t.Fatal("converted state not kept")
	}
}

func TestSeqRanges(t *testing.T) {
	var rs seqRanges
	rs.add(seqRange{10, 19, 1})
	rs.add(seqRange{30, 39, 1})
	rs.add(seqRange{20, 29, 1}) // joins both neighbours
	if len(rs) != 1 || rs[0] != (seqRange{10, 39, 1}) {
		t.Fatalf("merged: %v", rs)
	}
	rs.add(seqRange{40, 40, 2}) // another time: kept apart
	for _, tc := range []struct {
		remove int64
		ok     bool
		want   string
	}{
		{9, false, "[{10 39 1} {40 40 2}]"},
		{10, true, "[{11 39 1} {40 40 2}]"},
		{39, true, "[{11 38 1} {40 40 2}]"},
		{20, true, "[{11 19 1} {21 38 1} {40 40 2}]"},
		{40, true, "[{11 19 1} {21 38 1}]"},
		{20, false, "[{11 19 1} {21 38 1}]"},
	} {
		if ok := rs.remove(tc.remove); ok != tc.ok || fmt.Sprint(rs) != tc.want {
			t.Fatalf("remove %d: %v %v, want %v %s", tc.remove, ok, rs, tc.ok, tc.want)
		}
	}
	b, _ := json.Marshal(rs)
	var back seqRanges
	if err := json.Unmarshal(b, &back); err != nil || fmt.Sprint(back) != fmt.Sprint(rs) || string(b) != "[[11,19,1],[21,38,1]]" {
		t.Fatalf("JSON %s -> %v %v", b, back, err)
	}
}
