package platformsim

import "math/bits"

// permutation is a pseudo-random bijection of [0, n), evaluated one element
// at a time without a table: a balanced four-round Feistel network on the
// smallest even number of bits that holds n, walking the cycle back into
// [0, n) when a value falls outside (at most 4 steps on average). The log
// model uses it to put a bucket's records, drawn in cell order, into a
// random order of delivery.
type permutation struct {
	n    uint64
	half uint
	mask uint64
	key  hasher
}

func newPermutation(n int64, key hasher) permutation {
	b := uint(2)
	if n > 1 {
		b = uint(bits.Len64(uint64(n - 1)))
		b += b & 1
	}
	return permutation{n: uint64(max(n, 0)), half: b / 2, mask: 1<<(b/2) - 1, key: key}
}

// at returns the image of i, which must lie in [0, n).
func (p permutation) at(i int64) int64 {
	x := uint64(i)
	for {
		x = p.feistel(x)
		if x < p.n {
			return int64(x)
		}
	}
}

func (p permutation) feistel(x uint64) uint64 {
	l, r := x>>p.half, x&p.mask
	for round := int64(0); round < 4; round++ {
		l, r = r, l^(uint64(p.key.i(round).i(int64(r)))&p.mask)
	}
	return l<<p.half | r
}
