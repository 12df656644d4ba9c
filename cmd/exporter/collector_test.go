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

// TestOTLPThroughCollectorIntoPrometheus is issue 12's proof: the exporter
// sends OTLP/gRPC to a real OpenTelemetry Collector (built with the
// official builder: otlp receiver, delta_to_cumulative,
// prometheus_remote_write with one queue consumer) writing into a real
// Prometheus 2.42 with its remote-write receiver, while the simulator
// revises buckets, and is restarted mid-run after 7 simulated minutes down.
//
// With --state.dir, in both temporalities (delta through
// delta_to_cumulative): no remote-write request is refused, the processor
// drops nothing, every count sample Prometheus stores equals the
// simulator's sum of the buckets up to its time (as read by the poll that
// made it), increase() over the whole run equals the simulator's increase
// exactly, and no counter resets across the restart. Without --state.dir:
// nothing refused or dropped either, and increase() over the run is never
// above the simulator's (the buckets that ended while the exporter was
// stopped, and its first poll, are not counted).
func TestOTLPThroughCollectorIntoPrometheus(t *testing.T) {
	for _, tc := range []struct {
		name, temporality string
		state             bool
	}{
		{"cumulative", "cumulative", true},
		{"delta through delta_to_cumulative", "delta", true},
		{"cumulative without state", "cumulative", false},
		{"delta without state", "delta", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			delta := tc.temporality == "delta"
			prom := testenv.PrometheusWith(t, testenv.PrometheusOptions{RemoteWriteReceiver: true})
			col := testenv.OTelCollector(t, testenv.OTelCollectorOptions{DeltaToCumulative: delta,
				RemoteWriteURL: prom.RemoteWriteURL(), RemoteWriteConsumers: 1})
			te := startExporter(t, testOptions{sim: platformsim.Config{Environments: 3}, noState: !tc.state, run: func(f *runFlags) {
				f.otlpEndpoint = "http://" + col.GRPCAddr()
				f.otlpProtocol = "grpc"
				f.otlpTemporality = tc.temporality
				f.shutdownTimeout = time.Minute
			}})
			steps := func() {
				for range 6 { // 30 minutes: a new bucket, revisions between boundaries
					te.advance(time.Minute)
					te.advance(time.Minute)
					te.advance(3 * time.Minute)
				}
			}
			steps()
			te.restart(7 * time.Minute)
			steps()
			te.stop()
			waitCollectorDrained(t, col, delta)

			// Nothing refused anywhere on the way.
			st := prom.RemoteWriteStats(t)
			if len(st.Requests) != 1 || st.Requests["204"] == 0 || st.OutOfOrder+st.OutOfBounds+st.TooOld != 0 {
				t.Errorf("Prometheus remote-write requests by status %v, samples refused: %v out of order, %v out of bounds, %v too old",
					st.Requests, st.OutOfOrder, st.OutOfBounds, st.TooOld)
			}
			for name, labels := range map[string]map[string]string{
				testenv.OTelColExporterSendFailed:            nil,
				testenv.OTelColReceiverRefused:               nil,
				testenv.OTelColRemoteWriteFailedTranslations: nil,
			} {
				if v := col.TelemetrySum(t, name, labels); v != 0 {
					t.Errorf("collector %s = %v, want 0", name, v)
				}
			}
			if delta {
				points := col.DeltaToCumulativeDatapoints(t)
				if points[""] == 0 || col.DeltaToCumulativeDropped(t) != 0 {
					t.Errorf("delta_to_cumulative datapoints by error %v: want some converted, none dropped", points)
				}
			}
			t.Logf("Prometheus appended %v samples in %v requests; collector accepted %v points",
				st.Appended, st.Requests["204"], col.TelemetrySum(t, testenv.OTelColReceiverAccepted, nil))

			checkTranslatedNames(t, prom, te)
			checkCountsInPrometheus(t, prom, te, tc.state)
		})
	}
}

// waitCollectorDrained waits until the collector has written (or refused,
// or dropped) every point it accepted.
func waitCollectorDrained(t *testing.T, col *testenv.OTelCollectorProcess, delta bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		accepted := col.TelemetrySum(t, testenv.OTelColReceiverAccepted, nil)
		rw := map[string]string{"exporter": "prometheus_remote_write"}
		done := col.TelemetrySum(t, testenv.OTelColExporterSent, rw) + col.TelemetrySum(t, testenv.OTelColExporterSendFailed, rw)
		if delta {
			done += col.DeltaToCumulativeDropped(t)
		}
		if accepted > 0 && done >= accepted {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("collector did not drain: accepted %v, written, failed or dropped %v", accepted, done)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// promKey identifies a remote-written series by name and data labels
// (job, instance and the scope labels left out).
func promKey(m model.Metric) string {
	labels := map[string]string{}
	for k, v := range m {
		if k == model.MetricNameLabel || k == "job" || k == "instance" || strings.HasPrefix(string(k), "otel_scope_") {
			continue
		}
		labels[string(k)] = string(v)
	}
	return seriesKey(string(m[model.MetricNameLabel]), labels)
}

// checkTranslatedNames checks the names the collector's translation gives
// the OTLP metrics (docs/metrics.md, "OpenTelemetry"): counts and ratios
// keep their Prometheus names, percentiles and rates gain unit suffixes.
func checkTranslatedNames(t *testing.T, prom *testenv.PrometheusServer, te *testExporter) {
	t.Helper()
	end := metricsapi.FiveMinutes.Truncate(te.sim.Now())
	for _, name := range []string{
		`cdn_edge_usage_by_country_requests_edge_total`,
		`cdn_edge_usage_by_country_bytes_edge_total`,
		`cdn_edge_usage_by_country_requests_cache_hit_ratio`,
		`cdn_edge_usage_by_country_ttfb_edge_milliseconds{percentile="95"}`,
		`cdn_edge_usage_by_country_response_time_edge_milliseconds{percentile="5"}`,
		`cdn_edge_usage_by_country_requests_per_second_edge_per_second`,
		`cdn_edge_usage_by_country_bits_per_second_edge_bit_per_second`,
		`cdn_origin_usage_ttfb_origin_milliseconds{percentile="50"}`,
		`cdn_edge_errors_requests_edge_total`,
	} {
		m := prom.RawSamplesAt(t, name, 2*time.Hour, end)
		if len(m) == 0 {
			t.Errorf("Prometheus has no series %s", name)
			continue
		}
		// job from service.name; no instance (no service.instance.id, so
		// restarts and replicas write the same series).
		if l := m[0].Metric; l["job"] != "edgepipe-exporter" || l["instance"] != "" || l["environment_id"] == "" {
			t.Errorf("%s: labels %v", name, l)
		}
	}
}

// checkCountsInPrometheus compares the count series Prometheus stored with
// the simulator. With state: every sample equals the simulator's sum up to
// its time as read by the poll that made it, increase() over the run is the
// simulator's increase exactly, and nothing resets. Without: increase() is
// never above the simulator's, and below it in total (something ended while
// the exporter was stopped).
func checkCountsInPrometheus(t *testing.T, prom *testenv.PrometheusServer, te *testExporter, state bool) {
	t.Helper()
	envs, datasets := te.sim.EnvironmentIDs(), te.sim.DatasetNames()
	last := metricsapi.FiveMinutes.Truncate(te.polls[len(te.polls)-1])
	truthAt := map[time.Time]expectation{}
	sums := func(end time.Time) expectation {
		if e, ok := truthAt[end]; ok {
			return e
		}
		at, ok := te.pollAt(end)
		if !ok {
			t.Fatalf("no poll reached %s", end)
		}
		e := truth(t, te.sim, envs, datasets, te.firstFrom, end, at)
		truthAt[end] = e
		return e
	}
	final := sums(last)
	stored := map[string][]model.SamplePair{}
	for _, s := range prom.RawSamplesAt(t, `{__name__=~"cdn_.+_total"}`, 3*time.Hour, last) {
		stored[promKey(s.Metric)] = s.Values
	}
	var first time.Time // the first point time of the run
	for _, samples := range stored {
		if ts := samples[0].Timestamp.Time(); first.IsZero() || ts.Before(first) {
			first = ts
		}
	}
	first = first.UTC()
	bad := 0
	fail := func(format string, a ...any) {
		t.Helper()
		if bad++; bad <= 10 {
			t.Errorf(format, a...)
		}
	}
	names := map[string]bool{}
	checked := 0
	for k := range final.counters {
		names[k[:strings.IndexByte(k, '{')]] = true
		samples, ok := stored[k]
		if !ok {
			fail("Prometheus has no series %s (simulator's sum %v)", k, final.values[k])
			continue
		}
		if !state {
			// A series the restarted exporter has not seen since has no
			// points after the restart.
			continue
		}
		if lastTS := samples[len(samples)-1].Timestamp.Time(); !lastTS.Equal(last) {
			fail("%s: last sample at %s, want the last poll end %s", k, lastTS.UTC(), last)
		}
		for _, sp := range samples {
			e := sums(sp.Timestamp.Time().UTC())
			if float64(sp.Value) != e.values[k] {
				fail("%s at %s: Prometheus %v, simulator's sum %v", k, sp.Timestamp.Time().UTC().Format(time.TimeOnly), float64(sp.Value), e.values[k])
			}
			checked++
		}
	}
	if !state && len(stored) != len(final.counters) {
		t.Logf("Prometheus holds %d count series, the simulator %d", len(stored), len(final.counters))
	} else if len(stored) != len(final.counters) {
		t.Errorf("Prometheus holds %d count series, the simulator %d", len(stored), len(final.counters))
	}

	// increase() over the run, for the series with samples at its start
	// and end (edges on samples: increase() does not extrapolate). Without
	// state, a series the restarted exporter has not seen since stops
	// before the end: for those, the increase of the raw samples.
	window := last.Sub(first)
	start := sums(first)
	var promTotal, simTotal float64
	for _, name := range slices.Sorted(maps.Keys(names)) {
		inc := map[string]float64{}
		for _, s := range prom.QueryVectorAt(t, fmt.Sprintf(`increase(%s[%dms])`, name, window.Milliseconds()), last) {
			s.Metric[model.MetricNameLabel] = model.LabelValue(name)
			inc[promKey(s.Metric)] = float64(s.Value)
		}
		for k := range final.counters {
			samples := stored[k]
			if !strings.HasPrefix(k, name+"{") || samples == nil || !samples[0].Timestamp.Time().Equal(first) {
				continue
			}
			want := final.values[k] - start.values[k]
			got, ok := inc[k]
			if !samples[len(samples)-1].Timestamp.Time().Equal(last) {
				got, ok = rawIncrease(samples), true
			}
			switch {
			case !ok:
				fail("increase(%s) missing", k)
			case state && got != want:
				fail("increase(%s[%s]) = %v, the simulator's increase over the run %v", k, window, got, want)
			case !state && got > want:
				fail("increase(%s[%s]) = %v, above the simulator's increase %v: counted twice", k, window, got, want)
			}
			promTotal += got
			simTotal += want
		}
		if state {
			if r := prom.QueryVectorAt(t, fmt.Sprintf(`sum(resets(%s[%dms]))`, name, window.Milliseconds()), last); len(r) != 1 || r[0].Value != 0 {
				fail("%s: resets over the run %v, want 0 (the restart must not reset counters)", name, r)
			}
		}
	}
	if simTotal == 0 {
		t.Fatal("the simulator's counts did not increase: the test proves nothing")
	}
	if !state && promTotal >= simTotal {
		t.Errorf("without state, increase() over the run adds up to %v, the simulator's %v: the buckets of the downtime were counted?", promTotal, simTotal)
	}
	t.Logf("[%s, %s]: %d samples equal to the simulator's sums; sum of increase() %.0f, simulator's %.0f",
		first.Format(time.TimeOnly), last.Format(time.TimeOnly), checked, promTotal, simTotal)
}

// rawIncrease is what increase() adds up over samples: every rise, and
// after a drop (a counter reset) the new value.
func rawIncrease(samples []model.SamplePair) float64 {
	var inc float64
	for i := 1; i < len(samples); i++ {
		v, prev := float64(samples[i].Value), float64(samples[i-1].Value)
		if v >= prev {
			inc += v - prev
		} else {
			inc += v
		}
	}
	return inc
}
