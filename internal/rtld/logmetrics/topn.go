package logmetrics

import (
	"cmp"
	"slices"
)

// topN decides which values of one label (host, client_country_code) in one
// environment keep their own label value; the others become OtherValue.
//
// Members: while fewer than n values are members, a new value becomes one at
// once, so an environment with at most n hosts never sees "other". Once n
// are members, membership changes only when a window ends (roll), and only
// where a value outside counted more than twice as many records as the
// member it replaces: a value near the boundary does not flap between its
// own series and "other", and at most n series change per window.
//
// Counts: a Misra-Gries summary of at most 4n values (never more memory,
// whatever the number of distinct values). A value that had more than a
// 1/(4n+1) share of the records counted is in it, and its count is low by at
// most that share, so every value of a real top n is found. At each roll
// the counts are halved: each window weighs twice the one before, so the
// top n follow the traffic of the last few windows.
type topN struct {
	n       int
	members map[string]struct{}
	counts  map[string]int64
}

func newTopN(n int) *topN {
	return &topN{n: n, members: make(map[string]struct{}, n), counts: make(map[string]int64, 4*n)}
}

// capacity is how many values the counts keep.
func (t *topN) capacity() int { return 4 * t.n }

// label counts one record with value v and returns the label value to use:
// v itself for a member, OtherValue otherwise.
func (t *topN) label(v []byte) []byte {
	t.count(v)
	if _, ok := t.members[string(v)]; ok {
		return v
	}
	if len(t.members) < t.n {
		t.members[string(v)] = struct{}{}
		return v
	}
	return otherValue
}

var otherValue = []byte(OtherValue)

// count adds one record of v to the summary.
func (t *topN) count(v []byte) {
	if c, ok := t.counts[string(v)]; ok {
		t.counts[string(v)] = c + 1
		return
	}
	if len(t.counts) < t.capacity() {
		t.counts[string(v)] = 1
		return
	}
	// Misra-Gries: a value that finds no room takes one from every value
	// kept (as many decrements as records counted, so O(1) amortised).
	for k, c := range t.counts {
		if c <= 1 {
			delete(t.counts, k)
		} else {
			t.counts[k] = c - 1
		}
	}
}

// roll ends a window: members outside the window's top n are replaced by
// values in it that counted more than twice as much, and the counts are
// halved.
func (t *topN) roll() {
	type vc struct {
		v string
		c int64
	}
	ranked := make([]vc, 0, len(t.counts))
	for v, c := range t.counts {
		ranked = append(ranked, vc{v, c})
	}
	slices.SortFunc(ranked, func(a, b vc) int {
		if d := cmp.Compare(b.c, a.c); d != 0 {
			return d
		}
		return cmp.Compare(a.v, b.v)
	})
	top := ranked[:min(t.n, len(ranked))]
	var challengers []vc // in the top, not members: strongest first
	for _, x := range top {
		if _, ok := t.members[x.v]; !ok {
			challengers = append(challengers, x)
		}
	}
	var weak []vc // members not in the top: weakest first
	for m := range t.members {
		if !slices.ContainsFunc(top, func(x vc) bool { return x.v == m }) {
			weak = append(weak, vc{m, t.counts[m]})
		}
	}
	slices.SortFunc(weak, func(a, b vc) int {
		if d := cmp.Compare(a.c, b.c); d != 0 {
			return d
		}
		return cmp.Compare(a.v, b.v)
	})
	w := 0
	for _, c := range challengers {
		if len(t.members) < t.n {
			t.members[c.v] = struct{}{}
			continue
		}
		if w >= len(weak) || c.c <= 2*weak[w].c {
			break
		}
		delete(t.members, weak[w].v)
		t.members[c.v] = struct{}{}
		w++
	}
	for v, c := range t.counts {
		if c < 2 {
			delete(t.counts, v)
		} else {
			t.counts[v] = c / 2
		}
	}
}
