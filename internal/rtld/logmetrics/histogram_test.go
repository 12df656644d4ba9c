package logmetrics

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// clientGolangHistogram is client_golang's Histogram with the settings
// histogram mirrors.
func clientGolangHistogram(bounds []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "h", Help: "h", Buckets: bounds,
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  nativeMaxBuckets,
		NativeHistogramMinResetDuration: 0,
		NativeHistogramMaxExemplars:     -1,
	})
}

// TestHistogramMatchesClientGolang: fed the same values, histogram and
// client_golang's Histogram write the same classic buckets, native schema,
// zero bucket, spans and deltas, count and sum.
func TestHistogramMatchesClientGolang(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var bounds []float64
	for i := range 8 {
		bounds = append(bounds, math.Exp2(float64(i)/8), math.Exp2(float64(i)/8)/2) // on bucket boundaries
	}
	for _, tc := range []struct {
		name string
		gen  func(i int) float64
		n    int
	}{
		{"total times", func(int) float64 { return 0.002 + 0.05*r.ExpFloat64() }, 5000},
		{"zeros and tiny values", func(i int) float64 { return []float64{0, 1e-40, 1e-30, 0.001}[i%4] }, 400},
		{"bucket boundaries", func(i int) float64 { return bounds[i%len(bounds)] * math.Exp2(float64(i%20-10)) }, 800},
		{"classic bounds", func(i int) float64 { return defaultBuckets()[i%len(defaultBuckets())] }, 260},
		{"wide: the schema is lowered", func(int) float64 { return math.Pow(10, -9+18*r.Float64()) }, 20000},
		{"one value", func(int) float64 { return 0.25 }, 1},
		{"none", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ours := newHistogram(len(defaultBuckets()), time.Unix(1_800_000_000, 0))
			theirs := clientGolangHistogram(defaultBuckets())
			for i := range tc.n {
				v := tc.gen(i)
				ours.observe(v, defaultBuckets())
				theirs.Observe(v)
			}
			desc := prometheus.NewDesc("h", "h", nil, nil)
			m, err := ours.sample(nil).metric(desc, defaultBuckets())
			if err != nil {
				t.Fatal(err)
			}
			var got, want dto.Metric
			if err := m.Write(&got); err != nil {
				t.Fatal(err)
			}
			if err := theirs.Write(&want); err != nil {
				t.Fatal(err)
			}
			got.Histogram.CreatedTimestamp, want.Histogram.CreatedTimestamp = nil, nil
			if !proto.Equal(want.Histogram, got.Histogram) {
				t.Errorf("histogram differs from client_golang's:\nclient_golang: %s\nours:          %s",
					prototext.Format(want.Histogram), prototext.Format(got.Histogram))
			}
			if tc.name == "wide: the schema is lowered" && got.Histogram.GetSchema() >= nativeSchema {
				t.Errorf("schema %d: the test does not exceed %d buckets", got.Histogram.GetSchema(), nativeMaxBuckets)
			}
		})
	}
}

func TestSchema3Bounds(t *testing.T) {
	for i, b := range schema3Bounds {
		if want := math.Exp2(float64(i)/8) / 2; math.Abs(b-want) > 1e-15 {
			t.Errorf("bound %d: %v, want 2^(%d/8)/2 = %v", i, b, i, want)
		}
	}
}

// BenchmarkHistogramObserve compares an observation of histogram with one
// of client_golang's Histogram with the same buckets.
func BenchmarkHistogramObserve(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	vals := make([]float64, 4096)
	for i := range vals {
		vals[i] = r.ExpFloat64() * 0.05
	}
	bounds := defaultBuckets()
	b.Run("ours", func(b *testing.B) {
		h := newHistogram(len(bounds), time.Now())
		i := 0
		for b.Loop() {
			h.observe(vals[i&4095], bounds)
			i++
		}
	})
	b.Run("client_golang", func(b *testing.B) {
		h := clientGolangHistogram(bounds)
		i := 0
		for b.Loop() {
			h.Observe(vals[i&4095])
			i++
		}
	})
}
