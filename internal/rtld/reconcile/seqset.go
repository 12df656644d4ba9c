package reconcile

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
)

// span is an inclusive range of seq_nums.
type span struct{ Lo, Hi int64 }

// seqSet is a set of seq_nums kept as sorted, disjoint, non-adjacent spans:
// an agent's batches counted so far, usually one span per day.
type seqSet []span

// add inserts seq and reports whether it was new.
func (s *seqSet) add(seq int64) bool {
	set := *s
	// The first span that ends at or after seq-1 is where seq joins.
	i := sort.Search(len(set), func(i int) bool { return set[i].Hi >= seq-1 })
	switch {
	case i < len(set) && set[i].Lo <= seq && seq <= set[i].Hi:
		return false
	case i < len(set) && set[i].Hi == seq-1:
		set[i].Hi = seq
		if i+1 < len(set) && set[i+1].Lo == seq+1 {
			set[i].Hi = set[i+1].Hi
			set = slices.Delete(set, i+1, i+2)
		}
	case i < len(set) && set[i].Lo == seq+1:
		set[i].Lo = seq
	default:
		set = slices.Insert(set, i, span{seq, seq})
	}
	*s = set
	return true
}

// MarshalJSON encodes the set as [[lo,hi],…].
func (s seqSet) MarshalJSON() ([]byte, error) {
	pairs := make([][2]int64, len(s))
	for i, sp := range s {
		pairs[i] = [2]int64{sp.Lo, sp.Hi}
	}
	return json.Marshal(pairs)
}

// UnmarshalJSON decodes MarshalJSON's form, checking that the spans are
// sorted and disjoint.
func (s *seqSet) UnmarshalJSON(b []byte) error {
	var pairs [][2]int64
	if err := json.Unmarshal(b, &pairs); err != nil {
		return err
	}
	out := make(seqSet, len(pairs))
	for i, p := range pairs {
		if p[0] > p[1] || (i > 0 && p[0] <= out[i-1].Hi+1) {
			return fmt.Errorf("seq_num spans out of order at %v", p)
		}
		out[i] = span{p[0], p[1]}
	}
	*s = out
	return nil
}
