package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/sinks/otel"
	"github.com/edgepipe/edgepipe/internal/sinks/otel/otlptest"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestOTLPReceivesEveryBucket exports to an in-process OTLP/gRPC receiver
// that decodes the real protobuf, in both temporalities, while the
// simulator revises buckets: every count point (cumulative total, or the
// running sum of the deltas) equals the simulator's sum of the buckets up
// to the point's time as the poll that made it read them, points of every
// stream are in time order and never overlap, and every gauge point is a
// value the simulator had for its bucket.
func TestOTLPReceivesEveryBucket(t *testing.T) {
	for _, tc := range []struct {
		flag string
		want metricspb.AggregationTemporality
	}{
		{"", metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE},
		{"delta", metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_DELTA},
	} {
		t.Run(tc.want.String(), func(t *testing.T) {
			rcv, addr := otlptest.StartGRPC(t)
			te := startExporter(t, testOptions{sim: platformsim.Config{Environments: 3}, run: func(f *runFlags) {
				f.otlpEndpoint = "http://" + addr
				f.otlpProtocol = "grpc"
				f.otlpTemporality = tc.flag
				f.shutdownTimeout = time.Minute // -race makes draining ~50k points slow
			}})
			te.advance(2*time.Minute + 30*time.Second) // 10:05, bucket 10:00 filling
			te.advance(time.Minute)                    // 10:06, revised: folded into the next point
			te.advance(4 * time.Minute)                // 10:10
			te.advance(3 * time.Minute)                // 10:13, revised
			te.advance(2 * time.Minute)                // 10:15
			te.stop()                                  // flushes the OTLP queue
			pts := rcv.Points()
			for _, p := range pts {
				if p.Resource["service.name"] != otel.ServiceName {
					t.Fatalf("resource %v", p.Resource)
				}
			}
			counts, gauges := te.checkOTLP("otlp", pts, otlpCheck{temporality: tc.want, every: true, from: te.firstFrom})
			t.Logf("checked %d count points (4 poll ends) and %d gauge points", counts, gauges)
		})
	}
}

// TestPrometheusScrapesExporter lets a real Prometheus scrape the exporter
// and checks with PromQL that the stored counters equal the simulator's
// bucket sums at two moments, and that their increase between the two is
// the simulator's: `sum(x) - sum(x offset d)` exactly, and increase() over
// a window from the scrape of state A to the scrape of state B (edges on
// samples, so it does not extrapolate) exactly for the series that existed
// in state A.
func TestPrometheusScrapesExporter(t *testing.T) {
	te := startExporter(t, testOptions{sim: platformsim.Config{Environments: 4}})
	prom := testenv.Prometheus(t, te.addr)
	prom.WaitTargetsUp(t, 30*time.Second)
	envs := te.sim.EnvironmentIDs()
	datasets := te.sim.DatasetNames()

	stateA := te.clock.Now()
	expA := truth(t, te.sim, envs, datasets, te.firstFrom, metricsapi.FiveMinutes.Truncate(stateA), stateA)
	time.Sleep(2500 * time.Millisecond) // ≥ 2 scrapes of state A
	tA := time.Now()
	time.Sleep(500 * time.Millisecond)
	te.advance(12 * time.Minute) // new buckets and revisions
	stateB := te.clock.Now()
	expB := truth(t, te.sim, envs, datasets, te.firstFrom, metricsapi.FiveMinutes.Truncate(stateB), stateB)
	time.Sleep(2500 * time.Millisecond)
	tB := time.Now()

	query := func(q string, ts time.Time) model.Vector {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		v, _, _, err := prom.API().Query(ctx, q, ts)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		vec, ok := v.(model.Vector)
		if !ok {
			t.Fatalf("%s: %T", q, v)
		}
		return vec
	}
	for _, c := range []struct {
		at  time.Time
		exp expectation
	}{{tA, expA}, {tB, expB}} {
		vec := query(`{__name__=~"cdn_.+_total", job="edgepipe"}`, c.at)
		got := map[string]float64{}
		for _, s := range vec {
			labels := map[string]string{}
			for k, v := range s.Metric {
				if k != model.MetricNameLabel && k != "job" && k != "instance" {
					labels[string(k)] = string(v)
				}
			}
			got[seriesKey(string(s.Metric[model.MetricNameLabel]), labels)] = float64(s.Value)
		}
		n := 0
		for k := range c.exp.counters {
			if got[k] != c.exp.values[k] {
				t.Errorf("at %s: Prometheus has %s = %v, simulator's sum %v", c.at.Format(time.TimeOnly), k, got[k], c.exp.values[k])
			}
			n++
		}
		if len(got) != n {
			t.Errorf("Prometheus holds %d counter series, want %d", len(got), n)
		}
	}
	// The increase between the two moments, per dataset, in PromQL: as
	// `x - x offset`, and as increase() over a window whose edges are the
	// scrapes of state A and state B (then increase() does not extrapolate
	// and is exact).
	off := tB.Sub(tA).Round(time.Millisecond)
	for _, ds := range datasets {
		name := "cdn_" + ds + "_requests_origin_total"
		if ds == "edge_errors" || ds == "edge_usage_by_country" {
			name = "cdn_" + ds + "_requests_edge_total"
		}
		var want float64
		for k := range expB.counters {
			if strings.HasPrefix(k, name+"{") {
				want += expB.values[k] - expA.values[k]
			}
		}
		if want == 0 {
			t.Errorf("%s did not increase: the test proves nothing", name)
		}
		vec := query(fmt.Sprintf(`sum(%s) - sum(%s offset %dms)`, name, name, off.Milliseconds()), tB)
		if len(vec) != 1 || float64(vec[0].Value) != want {
			t.Errorf("%s increase between the two moments: Prometheus %v, simulator %v", name, vec, want)
		}
		// The scrape timestamps of the last sample of state A and of B.
		raw, _, _, err := prom.API().Query(context.Background(), fmt.Sprintf(`%s[%dms]`, name, off.Milliseconds()+2000), tB)
		if err != nil {
			t.Fatal(err)
		}
		m, ok := raw.(model.Matrix)
		if !ok || len(m) == 0 {
			t.Fatalf("%s: no samples (%T)", name, raw)
		}
		var tsA model.Time
		var last model.SamplePair
		for _, series := range m { // one that changed between A and B
			vals := series.Values
			last = vals[len(vals)-1]
			for _, sp := range vals {
				if sp.Value != last.Value {
					tsA = sp.Timestamp
				}
			}
			if tsA != 0 {
				break
			}
		}
		if tsA == 0 {
			t.Fatalf("%s: no series changed between state A and B", name)
		}
		// increase() sees a series only from its first sample: a label set
		// that first appears in state B (a new error code) adds nothing.
		var wantInc float64
		for k := range expA.counters {
			if strings.HasPrefix(k, name+"{") {
				wantInc += expB.values[k] - expA.values[k]
			}
		}
		window := last.Timestamp.Sub(tsA)
		inc := query(fmt.Sprintf(`sum(increase(%s[%dms]))`, name, window.Milliseconds()), last.Timestamp.Time())
		if len(inc) != 1 || float64(inc[0].Value) != wantInc {
			t.Errorf("sum(increase(%s[%s])) at the scrape of state B = %v, simulator's increase of the series present in state A %v", name, window, inc, wantInc)
		}
	}
}
