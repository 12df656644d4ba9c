package logmetrics

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// feed counts each value of vals once through t.label and returns the
// label values given, by value.
func feed(t *topN, vals ...string) map[string]string {
	got := map[string]string{}
	for _, v := range vals {
		got[v] = string(t.label([]byte(v)))
	}
	return got
}

func repeat(v string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func members(t *topN) []string {
	return slices.Sorted(maps.Keys(t.members))
}

func TestTopN(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		windows [][]string // the values of each window, in order
		label   map[string]string
		members []string
	}{
		{
			name:    "fewer values than n: every value its own",
			n:       3,
			windows: [][]string{{"a", "b", "a", "c"}},
			label:   map[string]string{"a": "a", "b": "b", "c": "c"},
			members: []string{"a", "b", "c"},
		},
		{
			name:    "first come while there is room, then other",
			n:       2,
			windows: [][]string{{"a", "b", "c", "c", "c"}},
			label:   map[string]string{"a": "a", "b": "b", "c": OtherValue},
			members: []string{"a", "b"},
		},
		{
			name:    "a value more than twice as frequent replaces the weakest member at the window's end",
			n:       2,
			windows: [][]string{append(append([]string{"a", "b"}, repeat("a", 10)...), repeat("c", 5)...), {"c"}},
			label:   map[string]string{"c": "c"},
			members: []string{"a", "c"},
		},
		{
			name:    "no flapping: a value less than twice as frequent does not replace a member",
			n:       2,
			windows: [][]string{append(append(append([]string{"a", "b"}, repeat("a", 10)...), repeat("b", 4)...), repeat("c", 8)...), {"c"}},
			label:   map[string]string{"c": OtherValue},
			members: []string{"a", "b"},
		},
		{
			name: "a member without traffic is replaced after its counts decay",
			n:    1,
			windows: [][]string{
				repeat("a", 100),
				repeat("b", 30), // then a 100, b 30: b is not in the top 1
				repeat("b", 30), // then a 50/2 = 25, b 30/2+30 = 45: 45 <= 2×25
				repeat("b", 30), // then a 12, b 22+30 = 52 > 2×12
				{"b"},
			},
			label:   map[string]string{"b": "b"},
			members: []string{"b"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			top := newTopN(tc.n)
			var got map[string]string
			for i, w := range tc.windows {
				if i > 0 {
					top.roll()
				}
				got = feed(top, w...)
			}
			for v, want := range tc.label {
				if got[v] != want {
					t.Errorf("value %q labelled %q, want %q", v, got[v], want)
				}
			}
			if m := members(top); !slices.Equal(m, tc.members) {
				t.Errorf("members %v, want %v", m, tc.members)
			}
		})
	}
}

// TestTopNFindsHeavyHittersInALongTail: with 20,000 distinct values and a
// few heavy ones, the summary stays at 4n values and the heavy ones become
// the members at the first window's end.
func TestTopNFindsHeavyHittersInALongTail(t *testing.T) {
	const n = 5
	top := newTopN(n)
	r := rand.New(rand.NewPCG(1, 1))
	heavy := []string{"h1", "h2", "h3", "h4", "h5"}
	for i := range 200_000 {
		var v string
		if i%2 == 0 {
			v = heavy[r.IntN(len(heavy))] // 10 % each
		} else {
			v = fmt.Sprintf("tail-%d", r.IntN(20_000))
		}
		top.label([]byte(v))
		if len(top.counts) > top.capacity() {
			t.Fatalf("summary holds %d values, more than %d", len(top.counts), top.capacity())
		}
	}
	top.roll()
	if m := members(top); !slices.Equal(m, heavy) {
		t.Fatalf("members after the window %v, want %v", m, heavy)
	}
	// The members are the first come from the tail before the roll: they
	// had their own series for the first window only.
	if got := feed(top, "tail-1", "h3"); got["tail-1"] != OtherValue || got["h3"] != "h3" {
		t.Fatalf("after the window: %v", got)
	}
}
