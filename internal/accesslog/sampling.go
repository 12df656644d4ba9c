package accesslog

import (
	"math"
	"math/bits"
)

// This file is the rounding rule of a downsampled profile: how many access-log
// records the platform delivers for a FIVE_MINUTES bucket in which the Metrics
// API counts a number of requests. The platform simulator samples by it and
// the receiver's reconciliation computes what it expects by it, so both sides
// share one definition.

// sampleUnits is the denominator of a share: downsampling percents are
// counted in thousandths of a percent, which holds every value of the
// platform's enum (0.1, 1, 25, 50, 75) exactly.
const sampleUnits = 100_000

// SampledCount returns how many records a profile with the given
// downsampling_percent delivers for a bucket of requests requests:
// floor(requests × percent / 100), computed exactly (the percent taken to a
// thousandth). Pass 100 for a profile without downsampling (the API's
// null): every request is logged. A percent above 100 counts as 100, and 0,
// a negative percent or NaN as 0.
//
// The rule is exact for any prefix of a bucket too: the simulator logs the
// i-th request of a bucket (from 0, in a fixed order) when
// SampledCount(i+1, p) > SampledCount(i, p), so any run of consecutive
// requests of n requests yields n × p / 100 records within one.
func SampledCount(requests int64, percent float64) int64 {
	if requests <= 0 || !(percent > 0) {
		return 0
	}
	if percent >= 100 {
		return requests
	}
	units := uint64(math.Round(percent * sampleUnits / 100))
	hi, lo := bits.Mul64(uint64(requests), units)
	// hi < units ≤ sampleUnits: requests < 2^63, so the quotient fits.
	q, _ := bits.Div64(hi, lo, sampleUnits)
	return int64(q)
}
