package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/common/model"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables/chtest"
	"github.com/edgepipe/edgepipe/internal/sinks/otel/otlptest"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// rig is the exporter with every sink, against a simulator on a fake clock:
// a real Prometheus scraping it, an OTLP/gRPC receiver, a real ClickHouse.
type rig struct {
	*testExporter
	prom *testenv.PrometheusServer
	rcv  *otlptest.Receiver
	conn driver.Conn
	db   string
	dss  []metricsapi.Dataset
}

func startRig(t *testing.T, sim platformsim.Config) *rig {
	t.Helper()
	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)
	rcv, otlpAddr := otlptest.StartGRPC(t)
	chExt := &clickhouseExtension{flags: &clickhouseFlags{dsn: ch.DSN(db), queueRows: 1_000_000, maxBackfill: model.Duration(24 * time.Hour)}}
	te := startExporter(t, testOptions{sim: sim, exts: []extension{chExt}, run: func(f *runFlags) {
		f.otlpEndpoint = "http://" + otlpAddr
		f.otlpProtocol = "grpc"
		f.shutdownTimeout = time.Minute
	}})
	r := &rig{testExporter: te, rcv: rcv, conn: ch.Conn(t), db: db}
	var err error
	if r.dss, err = chtest.MetricsClient(t, te.sim.URL()).Datasets(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.prom = testenv.Prometheus(t, te.addr)
	r.prom.WaitTargetsUp(t, 30*time.Second)
	return r
}

// selfMetric returns one edgepipe_* sample of a direct scrape (and whether
// it exists).
func (r *rig) selfMetric(name string, labels map[string]string) (float64, bool) {
	_, got := r.scrape()
	v, ok := got[seriesKey(name, labels)]
	return v, ok
}

// sumSelf sums the samples of name whose labels include match.
func (r *rig) sumSelf(got map[string]float64, name string, match ...string) float64 {
	var n float64
	for k, v := range got {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, m := range match {
			if !strings.Contains(k, m) {
				ok = false
			}
		}
		if ok {
			n += v
		}
	}
	return n
}

// waitSinks waits until OTLP and ClickHouse have everything published.
func (r *rig) waitSinks() {
	r.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, got := r.scrape()
		exported := got[seriesKey("edgepipe_otlp_exported_points_total", nil)]
		if got[seriesKey("edgepipe_otlp_queue_length", nil)] == 0 && int(exported) == len(r.rcv.Points()) &&
			got[seriesKey("edgepipe_clickhouse_queue_rows", nil)] == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("sinks did not drain: otlp queue %v exported %v received %d, clickhouse queue %v",
				got[seriesKey("edgepipe_otlp_queue_length", nil)], exported, len(r.rcv.Points()),
				got[seriesKey("edgepipe_clickhouse_queue_rows", nil)])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkSinks compares Prometheus (the exposition and a real Prometheus's
// stored counters), the OTLP points and the ClickHouse tables with the
// simulator's own rows over [firstFrom, the platform's current bucket), as
// they read now, and logs two headline sums.
func (r *rig) checkSinks(label string) {
	t := r.t
	t.Helper()
	r.waitSinks()
	at := r.sim.Now()
	to := metricsapi.FiveMinutes.Truncate(at)
	envs := r.sim.EnvironmentIDs()
	names := r.sim.DatasetNames()
	exp := truth(t, r.sim, envs, names, r.firstFrom, to, at)
	if exp.rows == 0 {
		t.Fatalf("%s: the simulator has no rows: the check proves nothing", label)
	}

	// The exposition: every cdn_ series exactly, and nothing NaN or Inf.
	body, got := r.scrape()
	for k, v := range got {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Errorf("%s: %s = %v", label, k, v)
		}
	}
	testenv.CheckMetrics(t, body)
	exp.check(t, got)

	// A real Prometheus: every counter it stored after two more scrapes.
	time.Sleep(2500 * time.Millisecond)
	vec := r.prom.QueryVector(t, `{__name__=~"cdn_.+_total", job="edgepipe"}`)
	stored := map[string]float64{}
	for _, s := range vec {
		labels := map[string]string{}
		for k, v := range s.Metric {
			if k != model.MetricNameLabel && k != "job" && k != "instance" {
				labels[string(k)] = string(v)
			}
		}
		stored[seriesKey(string(s.Metric[model.MetricNameLabel]), labels)] = float64(s.Value)
	}
	sums := map[string]float64{}
	promSums := map[string]float64{}
	for k := range exp.counters {
		if stored[k] != exp.values[k] {
			t.Errorf("%s: Prometheus stored %s = %v, simulator's sum %v", label, k, stored[k], exp.values[k])
		}
		if name := k[:strings.IndexByte(k, '{')]; strings.Contains(name, "_requests_") {
			sums[name] += exp.values[k]
			promSums[name] += stored[k]
		}
	}
	if len(stored) != len(exp.counters) {
		t.Errorf("%s: Prometheus holds %d counter series, want %d", label, len(stored), len(exp.counters))
	}
	for _, name := range []string{"cdn_edge_usage_by_country_requests_edge_total", "cdn_origin_usage_requests_origin_total"} {
		t.Logf("%s: sum(%s) in Prometheus %.0f, simulator's buckets %.0f", label, name, promSums[name], sums[name])
	}

	// OTLP: every series' newest cumulative point is the simulator's sum as
	// read by the poll that made it; points in order; gauges real values.
	r.checkOTLP(label, r.rcv.Points(), otlpCheck{temporality: metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE, from: r.firstFrom})

	// ClickHouse: FINAL holds exactly the simulator's rows and values.
	for i := range r.dss {
		ds := &r.dss[i]
		want := chtest.Rows{}
		for _, env := range envs {
			rows, err := r.sim.Rows(ds.Name, env, metricsapi.FiveMinutes, r.firstFrom, to, at)
			if err != nil {
				t.Fatal(err)
			}
			for _, row := range rows {
				vals := make([]float64, len(row.Values))
				for j, v := range row.Values {
					if metricsapi.Classify(ds.Metrics[j].Name).Kind == metricsapi.KindCount {
						v = math.Round(v)
					}
					vals[j] = v
				}
				want[chtest.RowKey(env, row.Labels, row.Time)] = vals
			}
		}
		if bad := chtest.Compare(t, ds, want, chtest.Stored(t, r.conn, r.db, ds, r.firstFrom, to)); bad > 0 {
			t.Errorf("%s: ClickHouse %s: %d differences from the simulator", label, ds.Name, bad)
		}
	}
}

// TestValuesThatAreNotNeverCorruptCounters is issue 11's first finding,
// against every sink: for each kind of bad value the simulator sends it in
// a share of the values of two polls, then normal data follows, with late
// data revising buckets. Every counter (in the exposition and as a real
// Prometheus stored it), every OTLP cumulative sum and every ClickHouse
// FINAL row must then equal the simulator's, nothing may be NaN or Inf, and
// edgepipe_invalid_values_total must have counted exactly the values the
// simulator spoiled. Malformed rows follow the same course.
func TestValuesThatAreNotNeverCorruptCounters(t *testing.T) {
	r := startRig(t, platformsim.Config{Environments: 3})
	r.checkSinks("clean start")
	for _, tc := range []struct {
		fault  platformsim.Faults
		reason string
	}{
		{platformsim.Faults{BadValues: platformsim.BadNull, BadValueRate: 0.3}, metricsapi.InvalidNull},
		{platformsim.Faults{BadValues: platformsim.BadNaN, BadValueRate: 0.3}, metricsapi.InvalidNaN},
		{platformsim.Faults{BadValues: platformsim.BadNegative, BadValueRate: 0.3}, metricsapi.InvalidNegative},
		{platformsim.Faults{BadValues: platformsim.BadInfinity, BadValueRate: 0.3}, metricsapi.InvalidInf},
		{platformsim.Faults{BadValues: platformsim.BadText, BadValueRate: 0.3}, metricsapi.InvalidText},
		{platformsim.Faults{MalformedRowRate: 0.2}, ""},
	} {
		name := string(tc.fault.BadValues)
		if name == "" {
			name = "malformed rows"
		}
		t.Run(name, func(t *testing.T) {
			r.t = t
			_, before := r.scrape()
			injectedFrom := len(r.sim.Stats().Data)
			r.sim.SetFaults(tc.fault)
			r.advance(time.Minute) // two polls with bad data
			r.advance(time.Minute)
			r.sim.SetFaults(platformsim.Faults{})
			r.advance(5 * time.Minute) // normal data: a new bucket, and late data revises recent ones
			r.advance(time.Minute)
			var badValues, badRows int
			for _, d := range r.sim.Stats().Data[injectedFrom:] {
				badValues += d.BadValues
				badRows += d.MalformedRows
			}
			_, after := r.scrape()
			counted := func(name string, match ...string) float64 {
				return r.sumSelf(after, name, match...) - r.sumSelf(before, name, match...)
			}
			if tc.reason != "" {
				got := counted("edgepipe_invalid_values_total", "reason="+tc.reason)
				if badValues == 0 || got != float64(badValues) || counted("edgepipe_invalid_values_total") != got {
					t.Errorf("edgepipe_invalid_values_total{reason=%q} rose by %v (all reasons %v); the simulator spoiled %d values",
						tc.reason, got, counted("edgepipe_invalid_values_total"), badValues)
				}
				t.Logf("simulator spoiled %d values, edgepipe_invalid_values_total{reason=%q} +%v", badValues, tc.reason, got)
			} else {
				got := counted("edgepipe_invalid_rows_total")
				if badRows == 0 || got != float64(badRows) {
					t.Errorf("edgepipe_invalid_rows_total rose by %v; the simulator sent %d malformed rows", got, badRows)
				}
				t.Logf("simulator sent %d malformed rows, edgepipe_invalid_rows_total +%v", badRows, got)
			}
			if counted("edgepipe_revisions_total") == 0 {
				t.Error("no revision after the faults: the test proves less than it claims")
			}
			if up := r.sumSelf(after, "edgepipe_dataset_up"); up != float64(len(r.sim.DatasetNames())) {
				t.Errorf("%v datasets up, want all: bad values must not fail polls", up)
			}
			r.checkSinks(name)
		})
	}
}

// TestPlatformClockSkew is issue 11's clock finding: the simulator's clock
// runs 40 minutes behind (then ahead of) the exporter's for an hour and
// then is corrected. No bucket may be skipped: every counter, OTLP sum and
// ClickHouse row equals the simulator's over the whole run, and
// edgepipe_platform_clock_skew_seconds shows the skew while it lasts.
func TestPlatformClockSkew(t *testing.T) {
	for _, offset := range []time.Duration{-40 * time.Minute, 40 * time.Minute} {
		t.Run(fmt.Sprintf("platform %v", offset), func(t *testing.T) {
			r := startRig(t, platformsim.Config{Environments: 3, ClockOffset: offset})
			for range 12 {
				r.advance(5 * time.Minute)
			}
			skew, ok := r.selfMetric("edgepipe_platform_clock_skew_seconds", nil)
			if !ok || math.Abs(skew-offset.Seconds()) > 1 {
				t.Errorf("edgepipe_platform_clock_skew_seconds = %v (present %v), want %v", skew, ok, offset.Seconds())
			}
			if lag, _ := r.selfMetric("edgepipe_bucket_lag_seconds", map[string]string{"dataset": "edge_errors"}); lag > 10*60 {
				t.Errorf("bucket lag %vs while skewed: the exporter does not follow the platform's clock", lag)
			}
			r.checkSinks("skewed")
			r.sim.SetClockOffset(0)
			for range 14 {
				r.advance(5 * time.Minute)
			}
			if skew, _ := r.selfMetric("edgepipe_platform_clock_skew_seconds", nil); math.Abs(skew) > 1 {
				t.Errorf("skew %v after the correction, want 0", skew)
			}
			r.checkSinks(fmt.Sprintf("whole run [%s, %s)", r.firstFrom.Format(time.TimeOnly), metricsapi.FiveMinutes.Truncate(r.sim.Now()).Format(time.TimeOnly)))
		})
	}
}

// TestAuthFailureIsVisible: with a wrong client secret nothing can be
// discovered; the self-metrics must say so for the alerts to fire
// (EdgepipeAuthFailing, EdgepipeDatasetPollFailing; internal/deploytest runs
// them), and /readyz must stay 503.
func TestAuthFailureIsVisible(t *testing.T) {
	_, base := startSim(t, platformsim.Config{Seed: 9})
	t.Setenv(envClientSecret, "not-the-secret")
	addr := testenv.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--api.url=" + base, "--organization-id=" + platformsim.DemoOrganizationID,
			"--dataset=edge_errors", "--dataset=origin_errors", "--web.listen-address=" + addr, "--log.level=error"}, io.Discard, os.Stderr)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("exporter: %v", err)
		}
	}()
	te := &testExporter{t: t, url: "http://" + addr}
	refused := seriesKey("edgepipe_api_requests_total", map[string]string{"service": "auth", "method": "POST", "status": "401"})
	deadline := time.Now().Add(30 * time.Second)
	var got map[string]float64
	for {
		if resp, err := http.Get(te.url + "/metrics"); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got = parseExposition(t, body)
			if got[refused] >= 2 { // discovery failed and was retried
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no repeated 401 from the token endpoint in 30s: %v", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for k, want := range map[string]float64{
		seriesKey("edgepipe_discovery_up", nil):                                         0,
		seriesKey("edgepipe_dataset_up", map[string]string{"dataset": "edge_errors"}):   0,
		seriesKey("edgepipe_dataset_up", map[string]string{"dataset": "origin_errors"}): 0,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
		}
	}
	if r := (&rig{}).sumSelf(got, "edgepipe_exporter_build_info"); r != 1 {
		t.Errorf("edgepipe_exporter_build_info missing (an always-present series)")
	}
	if code, _ := te.get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d, want 503", code)
	}
}

// TestUnknownDatasetIsAnError: a typo in --dataset ends the exporter at
// start with an error that lists the datasets the platform offers.
func TestUnknownDatasetIsAnError(t *testing.T) {
	_, base := startSim(t, platformsim.Config{Seed: 9})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, []string{"--api.url=" + base, "--organization-id=" + platformsim.DemoOrganizationID,
		"--dataset=edge_errors", "--dataset=edge_eror", "--web.listen-address=127.0.0.1:0", "--log.level=error"}, io.Discard, os.Stderr)
	if ctx.Err() != nil {
		t.Fatal("the exporter kept running")
	}
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`"edge_eror"`, "edge_usage_by_country", "edge_errors", "origin_usage_by_country", "origin_usage", "origin_errors", "origin_offload"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	t.Logf("exporter: %v", err)
}
