package platformsim

import (
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// BenchmarkLeaves measures the model alone: one environment, one
// five-minute bucket, every dataset.
func BenchmarkLeaves(b *testing.B) {
	s, err := New(Config{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	at := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	w := s.w()
	env := w.envByID[s.EnvironmentIDs()[0]]
	for _, ds := range s.DatasetNames() {
		b.Run(ds, func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			for i := 0; i < b.N; i++ {
				t := at.Add(-time.Duration(i%288+1) * 5 * time.Minute)
				bc := s.bucket(w, env, metricsapi.FiveMinutes, t, at)
				n += len(bc.leaves(ds))
			}
			b.ReportMetric(float64(n)/float64(b.N), "leaves/op")
		})
	}
}
