package platformsim

import "math"

// hasher is a small deterministic hash used as the simulator's source of
// randomness for data: every value is a pure function of the seed and the
// parts mixed into the hasher, so the same question always gets the same
// answer however the requests are split.
type hasher uint64

const fnvPrime = 1099511628211

func mix64(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	z ^= z >> 31
	return z
}

func seedHash(seed int64) hasher {
	return hasher(mix64(uint64(seed) ^ 0x9e3779b97f4a7c15))
}

// s mixes a string.
func (h hasher) s(x string) hasher {
	v := uint64(h)
	for i := 0; i < len(x); i++ {
		v ^= uint64(x[i])
		v *= fnvPrime
	}
	v ^= 0xff
	v *= fnvPrime
	return hasher(v)
}

// i mixes an integer.
func (h hasher) i(x int64) hasher {
	return hasher(mix64(uint64(h) ^ (uint64(x) + 0x632be59bd9b4e019)))
}

// u returns a uniform float in [0, 1).
func (h hasher) u() float64 {
	return float64(mix64(uint64(h))>>11) / (1 << 53)
}

// z returns a standard normal variate (Box-Muller).
func (h hasher) z() float64 {
	u1 := h.i(1).u()
	u2 := h.i(2).u()
	if u1 < 1e-12 {
		u1 = 1e-12
	}
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}

// poisson draws a Poisson variate with mean lambda.
func (h hasher) poisson(lambda float64) float64 {
	if lambda <= 0 {
		return 0
	}
	if lambda > 50 {
		v := math.Round(lambda + math.Sqrt(lambda)*h.z())
		if v < 0 {
			v = 0
		}
		return v
	}
	u := h.u()
	p := math.Exp(-lambda)
	cdf := p
	k := 0.0
	for u > cdf && k < 200 {
		k++
		p *= lambda / k
		cdf += p
	}
	return k
}

// split divides total (an integer) into parts proportional to weights, by
// largest remainder; the parts sum to total exactly.
func split(total float64, weights []float64) []float64 {
	out := make([]float64, len(weights))
	if total <= 0 || len(weights) == 0 {
		return out
	}
	var sum float64
	for _, w := range weights {
		sum += w
	}
	if sum <= 0 {
		out[0] = total
		return out
	}
	type rem struct {
		i int
		r float64
	}
	rems := make([]rem, len(weights))
	var used float64
	for i, w := range weights {
		x := total * w / sum
		f := math.Floor(x)
		out[i] = f
		used += f
		rems[i] = rem{i, x - f}
	}
	left := int(math.Round(total - used))
	for ; left > 0; left-- {
		best := -1
		for j := range rems {
			if rems[j].r >= 0 && (best < 0 || rems[j].r > rems[best].r) {
				best = j
			}
		}
		if best < 0 {
			break
		}
		out[rems[best].i]++
		rems[best].r = -1
	}
	return out
}

func clamp(x, lo, hi float64) float64 {
	return math.Max(lo, math.Min(hi, x))
}
