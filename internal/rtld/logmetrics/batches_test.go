package logmetrics

import (
	"slices"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

func TestSeqSet(t *testing.T) {
	for _, tc := range []struct {
		name   string
		adds   []int64
		fresh  []bool
		ranges []seqRange
	}{
		{"in order: one range", []int64{0, 1, 2, 3}, []bool{true, true, true, true}, []seqRange{{0, 3}}},
		{"resent", []int64{0, 1, 1, 0}, []bool{true, true, false, false}, []seqRange{{0, 1}}},
		{"a hole, then filled", []int64{0, 2, 3, 1}, []bool{true, true, true, true}, []seqRange{{0, 3}}},
		{"out of order", []int64{5, 3, 9, 4, 7}, []bool{true, true, true, true, true}, []seqRange{{3, 5}, {7, 7}, {9, 9}}},
		{"joins the range after it", []int64{5, 4}, []bool{true, true}, []seqRange{{4, 5}}},
		{"inside a range", []int64{1, 2, 3, 2}, []bool{true, true, true, false}, []seqRange{{1, 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s seqSet
			for i, seq := range tc.adds {
				if got := s.add(seq); got != tc.fresh[i] {
					t.Errorf("add(%d) = %v, want %v", seq, got, tc.fresh[i])
				}
			}
			if !slices.Equal(s.ranges, tc.ranges) {
				t.Errorf("ranges %v, want %v", s.ranges, tc.ranges)
			}
		})
	}
}

// TestSeqSetBounded: every other seq_num missing keeps at most maxSeqRanges
// ranges; the oldest holes are given up (a batch of one is then not
// counted), the recent ones are not.
func TestSeqSetBounded(t *testing.T) {
	var s seqSet
	for seq := int64(0); seq < 2*3*maxSeqRanges; seq += 2 {
		s.add(seq)
	}
	if len(s.ranges) != maxSeqRanges {
		t.Fatalf("%d ranges, want %d", len(s.ranges), maxSeqRanges)
	}
	if s.add(1) {
		t.Error("a hole given up was counted")
	}
	if !s.add(2*3*maxSeqRanges - 3) {
		t.Error("a recent hole was not counted")
	}
}

func TestCountedBatches(t *testing.T) {
	var c countedBatches
	now := time.Unix(1_800_000_000, 0)
	b := &accesslog.Batch{EnvironmentID: "env", Format: accesslog.FormatJSON, AgentID: "a1", Datestamp: "20261123", ProfileID: "7", SeqNum: 4}
	if !c.add(b, now) || c.add(b, now) {
		t.Fatal("a batch with identity: want counted once")
	}
	other := *b
	other.ProfileID = "8" // the platform numbers seq_num per profile and agent
	if !c.add(&other, now) {
		t.Fatal("the same seq_num of another profile was taken for a resend")
	}
	noID := &accesslog.Batch{EnvironmentID: "env", Format: accesslog.FormatJSONLines, SeqNum: accesslog.NoSeqNum}
	for range 2 {
		if !c.add(noID, now) {
			t.Fatal("a batch without identity cannot be recognised: every delivery counts")
		}
	}
	c.forget(now.Add(countedTTL - time.Minute))
	if c.add(b, now) {
		t.Fatal("forgotten before countedTTL")
	}
	c.forget(now.Add(countedTTL + time.Minute))
	if len(c.days) != 0 {
		t.Fatalf("%d batch days kept after countedTTL", len(c.days))
	}
}
