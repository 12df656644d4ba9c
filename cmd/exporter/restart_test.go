package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestPrometheusCountersAcrossRestart is issue 12's restart finding on the
// /metrics path: a real Prometheus scrapes the exporter, which is stopped
// for 7 simulated minutes (buckets end and are revised meanwhile) and
// started again on the same address. With --state.dir the counters continue
// where they were: increase() over a window from the last scrape before the
// restart to the last one after equals the simulator's increase exactly,
// series by series. Without it, increase() is never above the simulator's
// (the first poll after the start is a baseline: remembered, not counted),
// and below it in total.
func TestPrometheusCountersAcrossRestart(t *testing.T) {
	for _, state := range []bool{true, false} {
		t.Run(fmt.Sprintf("state=%v", state), func(t *testing.T) {
			te := startExporter(t, testOptions{sim: platformsim.Config{Environments: 3}, noState: !state})
			prom := testenv.Prometheus(t, te.addr)
			prom.WaitTargetsUp(t, 30*time.Second)
			envs, datasets := te.sim.EnvironmentIDs(), te.sim.DatasetNames()
			te.advance(5 * time.Minute)
			te.advance(time.Minute) // revisions
			atA := te.sim.Now()
			expA := truth(t, te.sim, envs, datasets, te.firstFrom, metricsapi.FiveMinutes.Truncate(atA), atA)
			_, gotA := te.scrape()
			time.Sleep(2500 * time.Millisecond) // ≥ 2 scrapes of state A
			tA := time.Now()

			te.restart(7 * time.Minute)
			if _, got := te.scrape(); state {
				expAfter := truth(t, te.sim, envs, datasets, te.firstFrom, metricsapi.FiveMinutes.Truncate(te.sim.Now()), te.sim.Now())
				expAfter.check(t, got) // the counters continued, the downtime counted
			}
			te.advance(time.Minute)
			te.advance(4 * time.Minute)
			te.advance(time.Minute)
			atB := te.sim.Now()
			expB := truth(t, te.sim, envs, datasets, te.firstFrom, metricsapi.FiveMinutes.Truncate(atB), atB)
			_, gotB := te.scrape()
			if state {
				expB.check(t, gotB)
			}
			time.Sleep(2500 * time.Millisecond)

			// The scrape times of the last sample of state A and of B.
			probe := `cdn_edge_usage_by_country_requests_edge_total`
			var tsA, tsB model.Time
			for _, s := range prom.RawSamples(t, probe, 5*time.Minute) {
				for _, sp := range s.Values {
					if sp.Timestamp.Time().Before(tA) && sp.Timestamp > tsA {
						tsA = sp.Timestamp
					}
					if sp.Timestamp > tsB {
						tsB = sp.Timestamp
					}
				}
			}
			if tsA == 0 || tsB <= tsA {
				t.Fatalf("no scrape of state A (%v) before one of state B (%v)", tsA, tsB)
			}
			window := tsB.Sub(tsA)
			names := map[string]bool{}
			for k := range expA.counters {
				names[k[:strings.IndexByte(k, '{')]] = true
			}
			bad := 0
			var promTotal, simTotal float64
			for _, name := range slices.Sorted(maps.Keys(names)) {
				inc := map[string]float64{}
				for _, s := range prom.QueryVectorAt(t, fmt.Sprintf(`increase(%s[%dms])`, name, window.Milliseconds()), tsB.Time()) {
					labels := map[string]string{}
					for k, v := range s.Metric {
						if k != "job" && k != "instance" {
							labels[string(k)] = string(v)
						}
					}
					inc[seriesKey(name, labels)] = float64(s.Value)
				}
				for k := range expA.counters {
					if !strings.HasPrefix(k, name+"{") {
						continue
					}
					if gotA[k] != expA.values[k] && state {
						t.Errorf("%s before the restart: %v, simulator %v", k, gotA[k], expA.values[k])
					}
					want := expB.values[k] - expA.values[k]
					got, ok := inc[k]
					switch {
					case !ok && gotB[k] != 0:
						bad++
						t.Errorf("increase(%s) missing", k)
					case state && got != want:
						bad++
						t.Errorf("increase(%s[%s]) across the restart = %v, the simulator's increase %v", k, window, got, want)
					case !state && got > want:
						bad++
						t.Errorf("increase(%s[%s]) across the restart = %v, above the simulator's %v: counted twice", k, window, got, want)
					}
					promTotal += got
					simTotal += want
					if bad > 10 {
						t.Fatal("too many mismatches")
					}
				}
			}
			if simTotal == 0 {
				t.Fatal("the simulator's counts did not increase: the test proves nothing")
			}
			if !state && promTotal >= simTotal {
				t.Errorf("without state, increase() across the restart adds up to %v, the simulator's %v: the downtime's buckets were counted?", promTotal, simTotal)
			}
			if !state {
				if n := (&rig{}).sumSelf(gotB, "edgepipe_baseline_buckets_total"); n == 0 {
					t.Error("edgepipe_baseline_buckets_total is 0 after a start without state")
				}
			}
			t.Logf("window %s across the restart: sum of increase() %.0f, simulator's %.0f", window, promTotal, simTotal)
		})
	}
}
