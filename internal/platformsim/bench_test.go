package platformsim_test

import (
	"net/http"
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
