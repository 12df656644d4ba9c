package platformsim_test

import (
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platformsim"
)

// BenchmarkDataRequest measures one data request of 20 environments with
// every dimension and metric, as the exporter's poll (a 30-minute settle
// window) and a backfill chunk (a day of five-minute buckets) send them.
func BenchmarkDataRequest(b *testing.B) {
	srv, base := startSim(b, platformsim.Config{Seed: 1, Now: newClock(testNow).Now, TokenLifetime: time.Hour})
	tok := token(b, base, "app.metrics")
	envs := srv.EnvironmentIDs()[:20]
	for _, tc := range []struct {
		name string
		span time.Duration
		sets []string
	}{
		{"poll-30m", 30 * time.Minute, srv.DatasetNames()},
		{"backfill-24h", 24 * time.Hour, []string{"edge_usage_by_country", "origin_usage"}},
	} {
		for _, ds := range tc.sets {
			q := query(envs, allDims(srv, ds), srv.DatasetMetrics(ds), testNow.Truncate(5*time.Minute).Add(-tc.span), testNow.Truncate(5*time.Minute), "FIVE_MINUTES")
			body := mustJSON(q)
			b.Run(tc.name+"/"+ds, func(b *testing.B) {
				var size int
				for i := 0; i < b.N; i++ {
					r := do(b, http.MethodPost, base+"/metrics/v1/datasets/"+ds+"/data", "Bearer "+tok, "application/json", body)
					if r.status != 200 {
						b.Fatalf("%d %s", r.status, r.body)
					}
					size = len(r.body)
				}
				b.ReportMetric(float64(size), "bytes/response")
			})
		}
	}
}

// BenchmarkWorldOf1000 measures the simulator at the size make bench-scale
// uses (1,000 environments in 10 properties): building the world, the heap
// it holds, and a poll's data request of 20 of its environments with every
// dimension and with only time and environment_id (the others aggregated).
// Run: go test -run '^$' -bench BenchmarkWorldOf1000 -benchtime 5x ./internal/platformsim
func BenchmarkWorldOf1000(b *testing.B) {
	cfg := platformsim.Config{Seed: 1, Properties: 10, Environments: 1000, Now: newClock(testNow).Now, TokenLifetime: time.Hour}
	b.Run("build", func(b *testing.B) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		var keep []*platformsim.Server
		for b.Loop() {
			keep = append(keep, platformsim.New(cfg))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/float64(len(keep)), "heap-bytes/world")
		for _, s := range keep {
			s.Close()
		}
	})
	srv, base := startSim(b, cfg)
	tok := token(b, base, "app.metrics")
	envs := srv.EnvironmentIDs()[:20]
	for _, ds := range []string{"edge_usage_by_country", "origin_usage"} {
		for _, dims := range []struct {
			name string
			list []string
		}{{"every-dimension", allDims(srv, ds)}, {"aggregated", []string{"time", "environment_id"}}} {
			q := query(envs, dims.list, srv.DatasetMetrics(ds), testNow.Truncate(5*time.Minute).Add(-30*time.Minute), testNow.Truncate(5*time.Minute), "FIVE_MINUTES")
			body := mustJSON(q)
			b.Run("poll-30m/"+ds+"/"+dims.name, func(b *testing.B) {
				for b.Loop() {
					if r := do(b, http.MethodPost, base+"/metrics/v1/datasets/"+ds+"/data", "Bearer "+tok, "application/json", body); r.status != 200 {
						b.Fatalf("%d %s", r.status, r.body)
					}
				}
			})
		}
	}
}
