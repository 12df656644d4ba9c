package accesslog

import (
	"math"
	"testing"
)

func TestSampledCount(t *testing.T) {
	for _, tc := range []struct {
		name     string
		requests int64
		percent  float64
		want     int64
	}{
		{"no downsampling", 12345, 100, 12345},
		{"quarter, exact", 1000, 25, 250},
		{"quarter, rounded down", 1003, 25, 250},
		{"half", 7, 50, 3},
		{"three quarters", 4, 75, 3},
		{"one percent", 199, 1, 1},
		{"one percent, exact", 200, 1, 2},
		// 0.1 is not a binary fraction: 1000 × 0.1 / 100 is 1 exactly here.
		{"a tenth of a percent", 1000, 0.1, 1},
		{"a tenth of a percent, below one", 999, 0.1, 0},
		{"a tenth of a percent, 3000", 3000, 0.1, 3},
		{"no requests", 0, 25, 0},
		{"negative requests", -5, 25, 0},
		{"zero percent", 100, 0, 0},
		{"NaN", 100, math.NaN(), 0},
		{"above 100", 100, 150, 100},
		{"huge bucket", math.MaxInt64, 50, math.MaxInt64 / 2},
		{"huge bucket, tenth of a percent", 1 << 62, 0.1, (1 << 62) / 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SampledCount(tc.requests, tc.percent); got != tc.want {
				t.Errorf("SampledCount(%d, %v) = %d, want %d", tc.requests, tc.percent, got, tc.want)
			}
		})
	}
}

// TestSampledCountRuns: for every percent of the platform's enum, the
// records of any run of consecutive requests (the simulator's systematic
// sampling) are within one of the run's length × share, and the prefix counts
// never decrease by more than one step.
func TestSampledCountRuns(t *testing.T) {
	for _, p := range []float64{0.1, 1, 25, 50, 75, 100} {
		share := p / 100
		prev := int64(0)
		for i := int64(1); i <= 5000; i++ {
			c := SampledCount(i, p)
			if d := c - prev; d < 0 || d > 1 {
				t.Fatalf("percent %v: SampledCount(%d) - SampledCount(%d) = %d", p, i, i-1, d)
			}
			prev = c
		}
		for _, run := range [][2]int64{{0, 1}, {3, 17}, {100, 1100}, {999, 4000}, {1234, 1235}} {
			got := SampledCount(run[1], p) - SampledCount(run[0], p)
			if want := float64(run[1]-run[0]) * share; math.Abs(float64(got)-want) >= 1 {
				t.Errorf("percent %v, run %v: %d records, want within 1 of %v", p, run, got, want)
			}
		}
	}
}
