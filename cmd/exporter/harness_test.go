package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/inventory"
	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/schedule/fakeclock"
	promsink "github.com/edgepipe/edgepipe/internal/sinks/prometheus"
)

// The shared variables under the names this package's tests use.
const (
	envClientID       = cli.EnvClientID
	envClientSecret   = cli.EnvClientSecret
	envEnvironmentIDs = cli.EnvEnvironmentIDs
)

// start is the simulated time every integration test begins at: mid-bucket,
// so the first poll covers [09:30, 10:00).
var start = time.Date(2026, 11, 23, 10, 2, 30, 0, time.UTC)

// testExporter is the run command running in-process against a simulator
// on loopback, both on one fake clock. restart stops it and starts it again
// on the same simulator, clock, listen address and flags (state directory
// included).
type testExporter struct {
	t     *testing.T
	sim   *platformsim.Server
	clock *fakeclock.Clock
	x     *exporter
	url   string
	addr  string
	stop  func()
	// loops is the number of sleepers at rest: one per dataset plus the
	// discovery loop and the inventory.
	loops int
	// firstFrom is the start of the first poll's range.
	firstFrom time.Time
	// polls holds the simulator's time after every advance (and start):
	// when the polls of that step ran.
	polls []time.Time
	opts  testOptions
	base  string // the simulator's URL
}

type testOptions struct {
	sim    platformsim.Config
	common func(*commonFlags)
	run    func(*runFlags)
	exts   []extension // optional parts (the ClickHouse sink), set up as given
	// noState runs without --state.dir (the first poll is a baseline);
	// otherwise every exporter gets a state directory of its own, empty
	// at its first start.
	noState bool
	// logs, when set, receives the exporter's log (warnings and above)
	// besides the test log.
	logs io.Writer
}

// startSim starts a simulator with cfg on loopback until the test ends and
// returns it with its base URL (API and token endpoint). The exporter's
// credential variables are set to the simulator's demo client and its
// environment-selection variables are cleared, so only flags choose what the
// exporter serves.
func startSim(t *testing.T, cfg platformsim.Config) (*platformsim.Server, string) {
	t.Helper()
	sim, err := platformsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	t.Setenv(envClientID, platformsim.DemoClientID)
	t.Setenv(envClientSecret, platformsim.DemoClientSecret)
	t.Setenv(envEnvironmentIDs, "")
	t.Setenv(envOrganizations, "")
	return sim, base
}

func startExporter(t *testing.T, o testOptions) *testExporter {
	t.Helper()
	clock := fakeclock.New(start)
	simCfg := o.sim
	simCfg.Now = clock.Now
	if simCfg.Seed == 0 {
		simCfg.Seed = 7
	}
	sim, base := startSim(t, simCfg)
	if !o.noState {
		dir := t.TempDir()
		run := o.run
		o.run = func(f *runFlags) {
			f.stateDir = dir
			if run != nil {
				run(f)
			}
		}
	}
	te := &testExporter{t: t, sim: sim, clock: clock, opts: o, base: base}
	te.launch("127.0.0.1:0")
	// The first poll reaches back the settle window from the platform's
	// current bucket.
	te.firstFrom = metricsapi.FiveMinutes.Truncate(start.Add(simCfg.ClockOffset)).Add(-30 * time.Minute)
	return te
}

// launch starts the exporter listening on addr and waits for its first
// polls.
func (te *testExporter) launch(addr string) {
	t := te.t
	t.Helper()
	o := te.opts
	common := &commonFlags{apiURL: te.base, authURL: te.base, organizationIDs: []string{platformsim.DemoOrganizationID},
		granularityName: "FIVE_MINUTES", shardCount: 1}
	if o.common != nil {
		o.common(common)
	}
	var logTo io.Writer = testWriter{t}
	if o.logs != nil {
		logTo = io.MultiWriter(logTo, o.logs)
	}
	log := slog.New(slog.NewTextHandler(logTo, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h, err := newHost(common, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.close)
	// The fake clock runs hours in seconds: lift the client's budgets.
	unlimited := platform.Limits{Read: platform.RateLimit{Requests: -1}, Write: platform.RateLimit{Requests: -1}}
	h.rateLimits = map[string]platform.Limits{platform.ServiceMetrics: unlimited, platform.ServiceAccounts: unlimited, platform.ServiceConfig: unlimited}

	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{l.Addr().String()}
	noSocket, noConfig := false, ""
	rf := &runFlags{pollInterval: time.Minute, discoveryInterval: 5 * time.Minute, concurrency: 4,
		seriesTTL: promsink.DefaultSeriesTTL, gaugeMaxAge: promsink.DefaultGaugeMaxAge, shutdownTimeout: 5 * time.Second, otlpQueue: 256,
		inventoryInterval: inventory.DefaultInterval,
		web:               &cli.Web{Flags: &web.FlagConfig{WebListenAddresses: &addrs, WebSystemdSocket: &noSocket, WebConfigFile: &noConfig}}}
	if o.run != nil {
		o.run(rf)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan *exporter, 1)
	done := make(chan error, 1)
	go func() { done <- runExporter(ctx, h, rf, o.exts, runDeps{clock: te.clock, listener: l, ready: ready}) }()
	te.url, te.addr = "http://"+addrs[0], addrs[0]
	select {
	case te.x = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("exporter stopped at start: %v", err)
	}
	stopped := false
	te.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("exporter: %v", err)
			}
		case <-time.After(rf.shutdownTimeout + 15*time.Second):
			t.Error("exporter did not stop in time")
		}
	}
	t.Cleanup(te.stop)
	datasets := len(te.sim.DatasetNames())
	if len(rf.datasets) > 0 {
		datasets = len(rf.datasets)
	}
	te.loops = datasets + 2
	te.settle()
	te.polls = append(te.polls, te.sim.Now())
}

// restart stops the exporter, lets the simulated time run for down (buckets
// end and are revised while nothing runs), and starts it again on the same
// address with the same flags.
func (te *testExporter) restart(down time.Duration) {
	te.t.Helper()
	te.stop()
	te.clock.Advance(down)
	te.launch(te.addr)
}

// settle waits until every loop sleeps again (all polls of the cycle done).
func (te *testExporter) settle() {
	te.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := te.clock.BlockUntil(ctx, te.loops); err != nil {
		te.t.Fatalf("poll loops did not settle at %s (%d of %d sleeping)", te.clock.Now(), te.clock.Sleepers(), te.loops)
	}
}

// advance moves the simulated time by d and waits for the polls it triggers.
func (te *testExporter) advance(d time.Duration) {
	te.t.Helper()
	te.clock.Advance(d)
	te.settle()
	te.polls = append(te.polls, te.sim.Now())
}

// pollAt returns when the poll that first reached end (the end of its
// bucket range) ran, by the simulator's clock: its points carry the values
// the simulator had then.
func (te *testExporter) pollAt(end time.Time) (time.Time, bool) {
	for _, p := range te.polls {
		if !metricsapi.FiveMinutes.Truncate(p).Before(end) {
			return p, true
		}
	}
	return time.Time{}, false
}

func (te *testExporter) get(path string) (int, []byte) {
	te.t.Helper()
	resp, err := http.Get(te.url + path)
	if err != nil {
		te.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		te.t.Fatal(err)
	}
	return resp.StatusCode, b
}

// scrape returns /metrics as text and as value by series key.
func (te *testExporter) scrape() ([]byte, map[string]float64) {
	te.t.Helper()
	code, body := te.get("/metrics")
	if code != http.StatusOK {
		te.t.Fatalf("/metrics: %d %s", code, body)
	}
	return body, parseExposition(te.t, body)
}

func parseExposition(t *testing.T, body []byte) map[string]float64 {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse exposition: %v", err)
	}
	out := make(map[string]float64)
	for name, mf := range mfs {
		for _, m := range mf.Metric {
			labels := map[string]string{}
			for _, lp := range m.Label {
				labels[lp.GetName()] = lp.GetValue()
			}
			var v float64
			switch {
			case m.Counter != nil:
				v = m.Counter.GetValue()
			case m.Gauge != nil:
				v = m.Gauge.GetValue()
			case m.Untyped != nil:
				v = m.Untyped.GetValue()
			default:
				continue
			}
			out[seriesKey(name, labels)] = v
		}
	}
	return out
}

func seriesKey(name string, labels map[string]string) string {
	ks := make([]string, 0, len(labels))
	for k, v := range labels {
		ks = append(ks, k+"="+v)
	}
	sort.Strings(ks)
	return name + "{" + strings.Join(ks, ",") + "}"
}

// expectation is what the exposition must hold: every cdn_ series.
type expectation struct {
	values   map[string]float64
	counters map[string]bool
	// envs per dataset with at least one row.
	envs map[string]map[string]bool
	// metrics per dataset seen in rows.
	rows int
}

// truth computes the expected cdn_* series from the simulator's own rows
// over [from, to) as they read at time at: counters are the sums, gauges the
// newest bucket's values (within the gauge max age).
func truth(t *testing.T, sim *platformsim.Server, envs []string, datasets []string, from, to, at time.Time) expectation {
	t.Helper()
	e := expectation{values: map[string]float64{}, counters: map[string]bool{}, envs: map[string]map[string]bool{}}
	g := metricsapi.FiveMinutes
	for _, ds := range datasets {
		labels := sim.DatasetLabels(ds)
		metrics := sim.DatasetMetrics(ds)
		e.envs[ds] = map[string]bool{}
		type gauge struct {
			t time.Time
			v float64
		}
		newestGauge := map[string]gauge{}
		var dsNewest time.Time
		for _, env := range envs {
			rows, err := sim.Rows(ds, env, g, from, to, at)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				e.rows++
				e.envs[ds][env] = true
				if r.Time.After(dsNewest) {
					dsNewest = r.Time
				}
				lbl := map[string]string{"environment_id": env}
				for i, l := range labels {
					lbl[l] = r.Labels[i]
				}
				for i, m := range metrics {
					v := r.Values[i]
					if math.IsNaN(v) {
						continue
					}
					name, pct := promsink.Name(promsink.DefaultPrefix, ds, m)
					ml := lbl
					if pct != "" {
						ml = map[string]string{"percentile": pct}
						for k, v := range lbl {
							ml[k] = v
						}
					}
					key := seriesKey(name, ml)
					info := metricsapi.Classify(m)
					switch info.Kind {
					case metricsapi.KindCount:
						e.values[key] += v
						e.counters[key] = true
					case metricsapi.KindPercentile:
						v /= 1000
					case metricsapi.KindRate:
						if strings.HasPrefix(m, "bits_") {
							v /= 8
						}
					}
					if info.Kind != metricsapi.KindCount {
						if old, ok := newestGauge[key]; !ok || !r.Time.Before(old.t) {
							newestGauge[key] = gauge{r.Time, v}
						}
					}
				}
			}
		}
		for k, gv := range newestGauge {
			if !gv.t.Before(dsNewest.Add(-promsink.DefaultGaugeMaxAge)) {
				e.values[k] = gv.v
			}
		}
	}
	return e
}

// check compares the scraped cdn_* series with the expectation exactly
// (counters) or to 1e-12 relative (gauges, which are scaled).
func (e expectation) check(t *testing.T, got map[string]float64) {
	t.Helper()
	bad := 0
	for k, want := range e.values {
		v, ok := got[k]
		switch {
		case !ok:
			t.Errorf("missing series %s (want %v)", k, want)
			bad++
		case e.counters[k] && v != want:
			t.Errorf("counter %s = %v, simulator's bucket sum is %v (diff %v)", k, v, want, v-want)
			bad++
		case !e.counters[k] && math.Abs(v-want) > 1e-12*math.Max(1, math.Abs(want)):
			t.Errorf("gauge %s = %v, want %v", k, v, want)
			bad++
		}
		if bad > 10 {
			t.Fatal("too many mismatches")
		}
	}
	for k := range got {
		if strings.HasPrefix(k, "cdn_") && !inventorySeries(k) {
			if _, ok := e.values[k]; !ok {
				t.Errorf("unexpected series %s = %v", k, got[k])
				bad++
			}
		}
		if bad > 10 {
			t.Fatal("too many mismatches")
		}
	}
}

// inventorySeries reports whether a series key is the inventory's (tested
// in inventory_test.go), not a dataset's.
func inventorySeries(key string) bool {
	return strings.HasPrefix(key, "cdn_environment_info{") || strings.HasPrefix(key, "cdn_tls_certificate_")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
