package platformsim

import (
	"math"
	"testing"
)

// TestPermutationIsABijection: for sizes around the powers of two the
// Feistel permutation hits every element of [0, n) once, and it is not the
// identity.
func TestPermutationIsABijection(t *testing.T) {
	for _, n := range []int64{1, 2, 3, 4, 5, 15, 16, 17, 255, 256, 1000, 4097} {
		p := newPermutation(n, seedHash(n))
		seen := make([]bool, n)
		fixed := 0
		for i := range n {
			j := p.at(i)
			if j < 0 || j >= n || seen[j] {
				t.Fatalf("n %d: at(%d) = %d, outside [0, n) or repeated", n, i, j)
			}
			seen[j] = true
			if j == i {
				fixed++
			}
		}
		if n >= 100 && fixed > int(n)/10 {
			t.Errorf("n %d: %d fixed points, want a shuffle", n, fixed)
		}
	}
}

// TestCellShareSumsToTheCell: the bytes of a cell's requests add up to the
// cell's bytes exactly, none is negative, and they vary around the mean.
func TestCellShareSumsToTheCell(t *testing.T) {
	for _, tc := range []struct{ bytes, n int64 }{{0, 3}, {1, 1}, {7, 3}, {123456, 1}, {5_000_000, 97}, {35_000 * 1000, 1000}} {
		var sum, lo, hi int64
		lo = math.MaxInt64
		for r := range tc.n {
			b := cellShare(tc.bytes, tc.n, r)
			if b < 0 {
				t.Fatalf("%+v: request %d has %d bytes", tc, r, b)
			}
			sum += b
			lo, hi = min(lo, b), max(hi, b)
		}
		if sum != tc.bytes {
			t.Errorf("%+v: requests sum to %d bytes", tc, sum)
		}
		if mean := tc.bytes / tc.n; tc.n >= 100 && (lo > mean/2 || hi < mean*3/2) {
			t.Errorf("%+v: sizes from %d to %d around %d: want spread", tc, lo, hi, mean)
		}
	}
}

// TestQuantile: the latency drawn at u follows the percentiles it is given
// and grows with u.
func TestQuantile(t *testing.T) {
	v := [6]float64{10, 20, 40, 80, 200, 500} // ms
	for i, p := range percentilePoints {
		if got := quantile(v, p); math.Abs(got-v[i]/1000) > 1e-12 {
			t.Errorf("quantile at %v = %v s, want %v ms", p, got, v[i])
		}
	}
	prev := 0.0
	for u := 0.0; u < 1; u += 0.001 {
		q := quantile(v, u)
		if q < prev || q <= 0 || q > 0.75 {
			t.Fatalf("quantile(%v) = %v after %v", u, q, prev)
		}
		prev = q
	}
}

func TestUnixMicros(t *testing.T) {
	for us, want := range map[int64]string{0: "0.000000", 1_764_000_299_999_999: "1764000299.999999", 1_764_000_300_000_001: "1764000300.000001"} {
		if got := string(unixMicros(us)); got != want {
			t.Errorf("unixMicros(%d) = %s, want %s", us, got, want)
		}
	}
}
