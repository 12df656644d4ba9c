package reconcile

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
)

func TestSeqSetAddsEachSeqNumOnce(t *testing.T) {
	var s seqSet
	seen := map[int64]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		seq := rng.Int64N(700)
		if got, want := s.add(seq), !seen[seq]; got != want {
			t.Fatalf("add(%d) = %v, want %v (set %v)", seq, got, want, s)
		}
		seen[seq] = true
	}
	for i := 1; i < len(s); i++ {
		if s[i].Lo <= s[i-1].Hi+1 {
			t.Fatalf("spans %v and %v overlap or touch", s[i-1], s[i])
		}
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back seqSet
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back) != len(s) {
		t.Fatalf("round trip: %d spans, want %d", len(back), len(s))
	}
	for seq := range int64(700) {
		if back.add(seq) == seen[seq] {
			t.Fatalf("after the round trip seq %d: seen %v", seq, seen[seq])
		}
	}
	if len(back) != 1 || back[0] != (span{0, 699}) {
		t.Fatalf("every seq 0..699 added: %v, want one span", back)
	}
	if err := json.Unmarshal([]byte(`[[5,9],[3,4]]`), &back); err == nil {
		t.Fatal("unsorted spans accepted")
	}
}
