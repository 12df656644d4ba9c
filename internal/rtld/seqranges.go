package rtld

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
)

// seqRange is an inclusive range of seq_nums. Since is when a missing
// range was noticed (unix seconds); lost ranges leave it zero.
type seqRange struct{ Lo, Hi, Since int64 }

// seqRanges is a sorted set of disjoint seq_num ranges: a jump of 99,999
// seq_nums is one range, not 99,999 entries.
type seqRanges []seqRange

// find returns the position of the range holding seq, or -1.
func (rs seqRanges) find(seq int64) int {
	i := sort.Search(len(rs), func(i int) bool { return rs[i].Hi >= seq })
	if i < len(rs) && rs[i].Lo <= seq {
		return i
	}
	return -1
}

func (rs seqRanges) contains(seq int64) bool { return rs.find(seq) >= 0 }

// size returns how many seq_nums the set holds.
func (rs seqRanges) size() int64 {
	var n int64
	for _, r := range rs {
		n += r.Hi - r.Lo + 1
	}
	return n
}

// add inserts r, which overlaps no range of the set, merging it with
// adjacent ranges noticed at the same time.
func (rs *seqRanges) add(r seqRange) {
	s := *rs
	i := sort.Search(len(s), func(i int) bool { return s[i].Lo > r.Hi })
	if i > 0 && s[i-1].Hi+1 == r.Lo && s[i-1].Since == r.Since {
		s[i-1].Hi = r.Hi
		if i < len(s) && s[i].Lo == r.Hi+1 && s[i].Since == r.Since {
			s[i-1].Hi = s[i].Hi
			s = slices.Delete(s, i, i+1)
		}
		*rs = s
		return
	}
	if i < len(s) && s[i].Lo == r.Hi+1 && s[i].Since == r.Since {
		s[i].Lo = r.Lo
		*rs = s
		return
	}
	*rs = slices.Insert(s, i, r)
}

// remove takes seq out of the set, splitting its range, and reports
// whether it was there.
func (rs *seqRanges) remove(seq int64) bool {
	s := *rs
	i := s.find(seq)
	if i < 0 {
		return false
	}
	r := s[i]
	switch {
	case r.Lo == r.Hi:
		s = slices.Delete(s, i, i+1)
	case seq == r.Lo:
		s[i].Lo++
	case seq == r.Hi:
		s[i].Hi--
	default:
		s[i].Hi = seq - 1
		s = slices.Insert(s, i+1, seqRange{Lo: seq + 1, Hi: r.Hi, Since: r.Since})
	}
	*rs = s
	return true
}

// MarshalJSON encodes the set as [[lo,hi,since],…] ([lo,hi] without since).
func (rs seqRanges) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, r := range rs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('[')
		b.WriteString(strconv.FormatInt(r.Lo, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(r.Hi, 10))
		if r.Since != 0 {
			b.WriteByte(',')
			b.WriteString(strconv.FormatInt(r.Since, 10))
		}
		b.WriteByte(']')
	}
	b.WriteByte(']')
	return b.Bytes(), nil
}

// UnmarshalJSON decodes MarshalJSON's form, and the form before ranges:
// an object of seq_num → unix seconds (missing) or → true (lost).
func (rs *seqRanges) UnmarshalJSON(data []byte) error {
	*rs = nil
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '{' {
		var old map[string]json.RawMessage
		if err := json.Unmarshal(data, &old); err != nil {
			return err
		}
		seqs := make([]seqRange, 0, len(old))
		for k, v := range old {
			seq, err := strconv.ParseInt(k, 10, 64)
			if err != nil {
				return fmt.Errorf("gap state: seq_num %q: %w", k, err)
			}
			since, _ := strconv.ParseInt(string(v), 10, 64) // "true" for lost: 0
			seqs = append(seqs, seqRange{seq, seq, since})
		}
		slices.SortFunc(seqs, func(a, b seqRange) int { return cmp.Compare(a.Lo, b.Lo) })
		for _, r := range seqs {
			rs.add(r)
		}
		return nil
	}
	var arr [][]int64
	if err := json.Unmarshal(data, &arr); err != nil {
		return err
	}
	for _, a := range arr {
		if len(a) < 2 || a[0] > a[1] {
			return fmt.Errorf("gap state: bad range %v", a)
		}
		r := seqRange{Lo: a[0], Hi: a[1]}
		if len(a) > 2 {
			r.Since = a[2]
		}
		*rs = append(*rs, r)
	}
	slices.SortFunc(*rs, func(a, b seqRange) int { return cmp.Compare(a.Lo, b.Lo) })
	return nil
}
