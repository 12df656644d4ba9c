package receiver_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// The reconciliation tests run the receiver binary against the simulator
// on a fast clock: the platform's time (the simulator's clock, which the
// receiver learns from the Date headers) runs simSpeed times the wall
// clock, so a FIVE_MINUTES bucket passes in five seconds.
const simSpeed = 60

// simStart is when the simulated clock starts: a weekday morning.
var simStart = time.Date(2026, 11, 23, 10, 2, 30, 0, time.UTC)

// fastClock is a simulated clock running simSpeed times the wall clock
// from simStart.
type fastClock struct{ wall time.Time }

func newFastClock() fastClock { return fastClock{wall: time.Now()} }

func (c fastClock) Now() time.Time {
	return simStart.Add(time.Duration(float64(time.Since(c.wall)) * simSpeed))
}

// reconcileRun is a simulator on a fast clock and the receiver binary
// reconciling its environments, writing into ClickHouse.
type reconcileRun struct {
	sim     *platformsim.Server
	apiURL  string
	cert    testCert
	envs    []string
	ch      *testenv.ClickHouseServer
	db      string
	clock   fastClock
	profile map[string]int64
}

// reconcileFlags are the receiver's flags for a fast clock: compare a
// bucket 6 simulated minutes after it ends, look every 300 ms of wall
// time, check the profiles every 500 ms (a simulated half minute).
var reconcileFlags = []string{"--reconcile.delay=6m", "--reconcile.interval=300ms", "--register.interval=500ms"}

// receiverEnv holds the API and ingest credentials of the test receivers.
var receiverEnv = []string{
	"EDGEPIPE_CLIENT_ID=" + platformsim.DemoClientID, "EDGEPIPE_CLIENT_SECRET=" + platformsim.DemoClientSecret,
	"EDGEPIPE_RTLD_USERNAME=platform", "EDGEPIPE_RTLD_PASSWORD=correct horse",
}

// startReconcileSim starts a simulator of envs environments on a fast
// clock with the given delivery faults (and changes to its configuration),
// and ClickHouse.
func startReconcileSim(t *testing.T, envs int, faults platformsim.DeliveryFaults, opts ...func(*platformsim.Config)) *reconcileRun {
	t.Helper()
	r := &reconcileRun{cert: newTestCert(t), clock: newFastClock(), profile: map[string]int64{}}
	r.ch = testenv.ClickHouse(t)
	r.db = r.ch.NewDatabase(t)
	cfg := platformsim.Config{
		Seed: 19, Properties: 2, Environments: envs, TrafficScale: 0.02, LateData: 4 * time.Minute, Now: r.clock.Now,
		Delivery: platformsim.DeliveryConfig{
			Live: true, BatchSize: 100, AgentsPerEnvironment: 2, RetryInterval: 100 * time.Millisecond,
			RequestTimeout: 10 * time.Second, TLSConfig: &tls.Config{RootCAs: r.cert.pool}, Faults: faults,
		},
	}
	for _, o := range opts {
		o(&cfg)
	}
	var err error
	if r.sim, err = platformsim.New(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.sim.Close() })
	if r.apiURL, err = r.sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	r.envs = r.busiest(t, envs)
	return r
}

// busiest returns the simulator's n environments in order of their
// requests over the hour the tests run, busiest first, so the faults and
// the sampling of the first ones act on real numbers of records.
func (r *reconcileRun) busiest(t *testing.T, n int) []string {
	t.Helper()
	const ds = "edge_usage_by_country"
	col := slices.Index(r.sim.DatasetMetrics(ds), "requests_edge_total")
	sum := map[string]float64{}
	all := r.sim.EnvironmentIDs()
	for _, env := range all {
		rows, err := r.sim.Rows(ds, env, metricsapi.FiveMinutes, simStart, simStart.Add(time.Hour), simStart.Add(2*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range rows {
			sum[env] += row.Values[col]
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return sum[all[i]] > sum[all[j]] })
	return all[:n]
}

// receiverArgs returns the flags of a receiver listening at addr (TLS),
// spooling in dir, with extra flags.
func (r *reconcileRun) receiverArgs(addr, publicURL, dir string, extra ...string) []string {
	args := []string{
		"--api.url=" + r.apiURL, "--auth.url=" + r.apiURL, "--public-url=" + publicURL,
		"--web.listen-address=" + addr, "--spool.dir=" + dir, "--clickhouse.dsn=" + r.ch.DSN(r.db),
	}
	for _, e := range r.envs {
		args = append(args, "--environment-id="+e)
	}
	return append(append(args, reconcileFlags...), extra...)
}

// createProfile creates the receiver's profile in env before the receiver
// starts, as an operator would, with a downsampling percent.
func (r *reconcileRun) createProfile(t *testing.T, env, publicURL string, percent float64) {
	t.Helper()
	c, err := platform.New(platform.Config{BaseURL: r.apiURL, AuthURL: r.apiURL, ClientID: platformsim.DemoClientID, ClientSecret: platformsim.DemoClientSecret})
	if err != nil {
		t.Fatal(err)
	}
	body := map[string]any{
		"environment_id": env, "profile_name": "edgepipe", "enabled": true, "downsampling_percent": percent,
		"fields": []string{"timestamp", "uuid", "status_code"},
		"delivery_method": map[string]any{"type": "http_post", "destination_endpoint": publicURL + "/ingest/" + env, "log_format": "json",
			"authentication": map[string]any{"type": "http_basic", "username": "platform", "password": "correct horse"}},
	}
	if err := c.RTLD().Do(context.Background(), http.MethodPost, "/accesslogs/profiles", nil, body, nil); err != nil {
		t.Fatal(err)
	}
}

// profiles finds the receiver's profile in every environment.
func (r *reconcileRun) profiles(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, env := range r.envs {
		waitFor(t, "the profile of "+env, 30*time.Second, func() bool {
			id, err := profileID(ctx, t, r.apiURL, env)
			r.profile[env] = id
			return err == nil
		})
	}
}

// completeness is one row of log_completeness.
type completeness struct {
	api, records uint64
	sampling     float64
}

// rows returns log_completeness under FINAL, by environment and bucket.
func (r *reconcileRun) rows(t *testing.T) map[string]map[time.Time]completeness {
	t.Helper()
	out := map[string]map[time.Time]completeness{}
	rows, err := r.ch.Conn(t).Query(context.Background(),
		fmt.Sprintf("SELECT environment_id, time, api_requests, log_records, sampling FROM `%s`.log_completeness FINAL", r.db))
	if err != nil {
		if strings.Contains(err.Error(), "doesn't exist") {
			return out
		}
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var env string
		var at time.Time
		var c completeness
		if err := rows.Scan(&env, &at, &c.api, &c.records, &c.sampling); err != nil {
			t.Fatal(err)
		}
		if out[env] == nil {
			out[env] = map[time.Time]completeness{}
		}
		out[env][at.UTC()] = c
	}
	return out
}

// waitCompared waits until every environment has at least n compared
// buckets in log_completeness.
func (r *reconcileRun) waitCompared(t *testing.T, n int, timeout time.Duration) map[string]map[time.Time]completeness {
	t.Helper()
	var got map[string]map[time.Time]completeness
	waitFor(t, fmt.Sprintf("%d compared buckets per environment", n), timeout, func() bool {
		got = r.rows(t)
		for _, env := range r.envs {
			if len(got[env]) < n {
				return false
			}
		}
		return true
	})
	return got
}

// truth returns the simulator's log buckets of env by start.
func (r *reconcileRun) truth(env string) map[time.Time]platformsim.LogBucket {
	out := map[time.Time]platformsim.LogBucket{}
	for _, b := range r.sim.LogBuckets(r.profile[env]) {
		out[b.Start.UTC()] = b
	}
	return out
}

// checkRows checks every compared bucket against the simulator's truth:
// the API's requests sampled by the rule, and exactly the records the
// simulator delivered. exact lists the environments where nothing was
// dropped: there the records equal the API's (sampled) requests.
func (r *reconcileRun) checkRows(t *testing.T, rows map[string]map[time.Time]completeness, exact func(env string) bool) {
	t.Helper()
	for _, env := range r.envs {
		truth := r.truth(env)
		var starts []time.Time
		for at := range rows[env] {
			starts = append(starts, at)
		}
		sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
		for _, at := range starts {
			c := rows[env][at]
			lb, ok := truth[at]
			switch {
			case !ok:
				t.Errorf("%s %s: compared, but the simulator logged nothing of it", env, at.Format("15:04"))
				continue
			case lb.Partial:
				t.Errorf("%s %s: compared, but the profile logged only part of it (%+v)", env, at.Format("15:04"), lb)
			}
			if c.api != uint64(lb.Sampled) || c.sampling != lb.DownsamplingPercent/100 {
				t.Errorf("%s %s: api_requests %d at sampling %v, want %d at %v (requests %d)", env, at.Format("15:04"), c.api, c.sampling,
					lb.Sampled, lb.DownsamplingPercent/100, lb.Requests)
			}
			if c.records != uint64(lb.Queued) {
				t.Errorf("%s %s: log_records %d, the simulator delivered %d (%+v)", env, at.Format("15:04"), c.records, lb.Queued, lb)
			}
			if exact(env) && c.records != c.api {
				t.Errorf("%s %s: log_records %d, api_requests %d: nothing was dropped", env, at.Format("15:04"), c.records, c.api)
			}
		}
	}
}

// TestReconcileTenEnvironments is the reconciliation's main must-show:
// ten environments on a fast clock, duplicate deliveries on (lost
// acknowledgements), one environment losing 10% of its batches and one
// losing 5% of its records silently, three with a 25% profile an operator
// created before the receiver started (kept by the registrar). For every
// compared bucket log_completeness under FINAL holds the simulator's
// requests sampled by the rule and exactly the records it delivered; the
// counters scraped by a real Prometheus hold the same sums; every
// environment without faults is exact.
func TestReconcileTenEnvironments(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the receiver against the simulator for a simulated hour")
	}
	const dropBatches, dropRecords = 0, 1
	faults := platformsim.DeliveryFaults{DropAckPercent: 10, Environments: map[string]platformsim.EnvironmentFaults{}}
	r := startReconcileSim(t, 10, faults)
	faults.Environments[r.envs[dropBatches]] = platformsim.EnvironmentFaults{DropBatchPercent: 10}
	faults.Environments[r.envs[dropRecords]] = platformsim.EnvironmentFaults{DropRecordPercent: 5}
	r.sim.SetDeliveryFaults(faults)
	sampled := map[string]bool{r.envs[2]: true, r.envs[3]: true, r.envs[4]: true}

	addr := testenv.FreeAddr(t)
	base := "https://" + addr
	for env := range sampled {
		r.createProfile(t, env, base, 25)
	}
	// Prometheus first, as in production: it sees every series from 0.
	exporter := testenv.FreeAddr(t)
	prom := testenv.PrometheusScrape(t,
		testenv.ScrapeJob{Name: "receiver", Targets: []string{addr}, Scheme: "https", Labels: map[string]string{"namespace": chartNamespace, "pod": chartPod}},
		testenv.ScrapeJob{Name: "exporter", Targets: []string{exporter}})
	wallStart := time.Now()
	startReceiver(t, r.receiverArgs(addr, base, filepath.Join(t.TempDir(), "spool"), "--web.config.file="+r.cert.webConfig(t)), receiverEnv)
	r.startExporter(t, exporter)
	r.profiles(t)

	rows := r.waitCompared(t, 6, 4*time.Minute)
	t.Logf("simulated clock at %s; delivery %+v; batches received %v", r.clock.Now().Format("15:04"), r.sim.Delivered(),
		prom.QueryVector(t, "sum by (status) (edgepipe_rtld_batches_received_total)"))
	exact := func(env string) bool { return env != r.envs[dropBatches] && env != r.envs[dropRecords] }
	r.checkRows(t, rows, exact)
	for env := range sampled {
		for at, c := range rows[env] {
			if c.sampling != 0.25 {
				t.Errorf("%s %s: sampling %v, want the operator's 25%%", env, at.Format("15:04"), c.sampling)
			}
		}
	}
	for _, env := range r.envs {
		var api, recs uint64
		for _, c := range rows[env] {
			api, recs = api+c.api, recs+c.records
		}
		t.Logf("%s: %d buckets, %d records of %d (faults %+v, sampled %v)", env, len(rows[env]), recs, api, faults.Environments[env], sampled[env])
		if !exact(env) && (recs >= api || recs == 0) {
			t.Errorf("%s (faults %+v): %d records of %d: the faults dropped nothing?", env, faults.Environments[env], recs, api)
		}
	}

	// The counters, read through Prometheus, hold the table's sums.
	var last string
	defer func() {
		if t.Failed() && last != "" {
			t.Log(last)
		}
	}()
	waitFor(t, "the counters to match log_completeness", 60*time.Second, func() bool {
		before := r.rows(t)
		vec := func(name string) map[string]float64 {
			out := map[string]float64{}
			for _, s := range prom.QueryVector(t, name) {
				out[string(s.Metric["environment_id"])] = float64(s.Value)
			}
			return out
		}
		buckets, api, recs := vec("edgepipe_rtld_reconciled_buckets_total"), vec("edgepipe_rtld_reconciled_api_requests_total"),
			vec("edgepipe_rtld_reconciled_log_records_total")
		after := r.rows(t)
		for _, env := range r.envs {
			var a, n float64
			for _, c := range after[env] {
				a, n = a+float64(c.api), n+float64(c.records)
			}
			if len(before[env]) != len(after[env]) || buckets[env] != float64(len(after[env])) || api[env] != a || recs[env] != n {
				last = fmt.Sprintf("%s: counters: buckets %v, api %v, records %v; table: %d buckets, %v, %v", env, buckets[env], api[env], recs[env], len(after[env]), a, n)
				return false
			}
		}
		return true
	})
	skipped := prom.QueryVector(t, "edgepipe_rtld_reconcile_skipped_buckets_total")
	for _, s := range skipped {
		if reason := string(s.Metric["reason"]); (reason != "profile_changed" && reason != "profile_unknown" && s.Value > 0) || s.Value > 1 {
			t.Errorf("skipped: %v", s)
		}
	}

	// The chart's alert expression on this data, as Prometheus evaluates
	// it (the run's hour is all within its 1h window): exactly the two
	// environments with faults are incomplete.
	expr := chartAlertExpr(t, "EdgepipeLogDeliveryIncomplete")
	var firing []string
	for _, s := range prom.QueryVector(t, expr) {
		firing = append(firing, string(s.Metric["environment_id"]))
	}
	slices.Sort(firing)
	want := []string{r.envs[dropBatches], r.envs[dropRecords]}
	slices.Sort(want)
	if !slices.Equal(firing, want) {
		t.Errorf("EdgepipeLogDeliveryIncomplete's condition holds for %v, want the two environments with faults %v\n%s", firing, want, expr)
	}

	var simFrom, simTo time.Time
	for _, byTime := range rows {
		for at := range byTime {
			if simFrom.IsZero() || at.Before(simFrom) {
				simFrom = at
			}
			if end := at.Add(5 * time.Minute); end.After(simTo) {
				simTo = end
			}
		}
	}
	r.checkDashboard(t, prom, wallStart, simFrom, simTo)
}

// waitSim waits until the simulated clock reaches at.
func (r *reconcileRun) waitSim(t *testing.T, at time.Time) {
	t.Helper()
	if d := at.Sub(r.clock.Now()); d > 0 {
		time.Sleep(time.Duration(float64(d) / simSpeed))
	}
}

// simAt returns the time of day hm ("15:04:05") on the simulated clock's
// day.
func simAt(t *testing.T, hm string) time.Time {
	t.Helper()
	d, err := time.Parse("15:04:05", hm)
	if err != nil {
		t.Fatal(err)
	}
	return time.Date(simStart.Year(), simStart.Month(), simStart.Day(), d.Hour(), d.Minute(), d.Second(), 0, time.UTC)
}

// TestReconcileThroughKills kills the receiver with SIGKILL in the middle
// of a bucket and right after a bucket ends, restarting it each time, and
// then damages its state file while it is down: every bucket compared
// holds exactly the simulator's requests and records (no false loss, no
// false 100%), the buckets around the kills are compared, and the buckets
// whose counts went with the state file are skipped as counts_lost.
func TestReconcileThroughKills(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the receiver against the simulator for a simulated hour")
	}
	r := startReconcileSim(t, 4, platformsim.DeliveryFaults{DropAckPercent: 10})
	addr := testenv.FreeAddr(t)
	base := "https://" + addr
	spoolDir := filepath.Join(t.TempDir(), "spool")
	p := startReceiver(t, r.receiverArgs(addr, base, spoolDir, "--web.config.file="+r.cert.webConfig(t)), receiverEnv)
	r.profiles(t)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.cert.pool}}, Timeout: 5 * time.Second}
	restart := func(what string) {
		t.Helper()
		p.kill9()
		t.Logf("receiver killed (%s) at %s", what, r.clock.Now().Format("15:04:05"))
		time.Sleep(300 * time.Millisecond) // the platform's retries fail meanwhile
		p.start()
		waitReady(t, client, base)
	}
	at := func(hm string) time.Time { return simAt(t, hm) }
	r.waitSim(t, at("10:17:30"))
	restart("within the bucket of 10:15")
	r.waitSim(t, at("10:25:04"))
	restart("as the bucket of 10:20 ended")

	// Down again, and the state file damaged meanwhile: the counts of the
	// buckets so far are gone.
	r.waitSim(t, at("10:32:30"))
	p.kill9()
	damaged := r.clock.Now()
	state := filepath.Join(spoolDir, "reconcile.state")
	fi, err := os.Stat(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(state, bytes.Repeat([]byte{0xa5}, int(fi.Size())), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("receiver killed and its state file damaged at %s", damaged.Format("15:04:05"))
	p.start()
	waitReady(t, client, base)

	rows := r.waitCompared(t, 6, 4*time.Minute)
	rowsAfter := func(env string, from time.Time) int {
		n := 0
		for at := range rows[env] {
			if !at.Before(from) {
				n++
			}
		}
		return n
	}
	waitFor(t, "buckets compared after the damage", 2*time.Minute, func() bool {
		rows = r.rows(t)
		for _, env := range r.envs {
			if rowsAfter(env, damaged) < 2 {
				return false
			}
		}
		return true
	})
	r.checkRows(t, rows, func(string) bool { return true })
	for _, env := range r.envs {
		for _, b := range []string{"10:15:00", "10:20:00"} {
			if _, ok := rows[env][at(b)]; !ok {
				t.Errorf("%s: the bucket of %s, where the receiver was killed, was not compared", env, b[:5])
			}
		}
		for at := range rows[env] {
			if at.Before(damaged) && !at.Add(5*time.Minute).Add(6*time.Minute).Before(damaged) {
				t.Errorf("%s: the bucket of %s was pending when the state was lost, yet it was compared", env, at.Format("15:04"))
			}
		}
	}
	metrics := string(scrapeText(t, client, base+"/metrics"))
	if !strings.Contains(metrics, `reason="counts_lost"`) {
		t.Errorf("no bucket skipped with reason counts_lost after the state file was damaged:\n%s", grepLines(metrics, "edgepipe_rtld_reconcile"))
	}
	t.Logf("after the last restart:\n%s", grepLines(metrics, "edgepipe_rtld_reconcile"))
}

// grepLines returns the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// roundRobin is "one address" in front of several receiver replicas: an
// HTTPS reverse proxy that sends each request to the next replica, so a
// batch the platform resends often lands on another replica than the first
// copy.
func roundRobin(t *testing.T, cert testCert, targets ...string) string {
	t.Helper()
	var n atomic.Uint64
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		u, _ := url.Parse("http://" + targets[int(n.Add(1))%len(targets)])
		pr.SetURL(u)
		pr.Out.Host = pr.In.Host
	}, ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)} // a replica stopped at the end
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert.tls}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + l.Addr().String()
}

// startReplicas starts two receiver replicas behind one address (each
// request to the next replica), counting in ClickHouse, rx-0 the one that
// compares; otherDSN, when set, is rx-1's ClickHouse.
func (r *reconcileRun) startReplicas(t *testing.T, otherDSN string) (addrs []string, rx []*receiverProcess) {
	t.Helper()
	addrs = []string{testenv.FreeAddr(t), testenv.FreeAddr(t)}
	base := roundRobin(t, r.cert, addrs...)
	for i, name := range []string{"rx-0", "rx-1"} {
		args := r.receiverArgs(addrs[i], base, filepath.Join(t.TempDir(), "spool"),
			"--reconcile.counts=clickhouse", "--reconcile.replica="+name, "--reconcile.leader=rx-0")
		if i == 1 && otherDSN != "" {
			for j, a := range args {
				if strings.HasPrefix(a, "--clickhouse.dsn=") {
					args[j] = "--clickhouse.dsn=" + otherDSN
				}
			}
		}
		rx = append(rx, startReceiver(t, args, receiverEnv))
	}
	return addrs, rx
}

// TestReconcileTwoReplicas runs two receiver replicas behind one address
// (each request to the next replica), with ClickHouse counts: each replica
// accepts part of every bucket's records and some batches twice (one copy
// on each), yet the one replica that compares (the leader) finds every
// bucket exact, the other publishes no reconciliation series, and the sum
// over both replicas, as a dashboard or an alert takes it, is the table's.
func TestReconcileTwoReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two receivers against the simulator for a simulated hour")
	}
	r := startReconcileSim(t, 4, platformsim.DeliveryFaults{DropAckPercent: 15})
	addrs, _ := r.startReplicas(t, "")
	prom := testenv.PrometheusScrape(t, testenv.ScrapeJob{Name: "receiver", Targets: addrs})
	r.profiles(t)

	rows := r.waitCompared(t, 6, 4*time.Minute)
	r.checkRows(t, rows, func(string) bool { return true })

	var last string
	waitFor(t, "the replicas' counters to add up to log_completeness", 60*time.Second, func() bool {
		for _, q := range []string{`count(edgepipe_rtld_reconciled_log_records_total{instance="` + addrs[1] + `"})`,
			`count(edgepipe_rtld_reconcile_skipped_buckets_total{instance="` + addrs[1] + `"})`} {
			if v := prom.QueryVector(t, q); len(v) > 0 {
				t.Fatalf("the replica that does not compare publishes reconciliation series: %s = %v", q, v)
			}
		}
		before := r.rows(t)
		sum := func(name string) map[string]float64 {
			out := map[string]float64{}
			for _, s := range prom.QueryVector(t, "sum by (environment_id) ("+name+")") {
				out[string(s.Metric["environment_id"])] = float64(s.Value)
			}
			return out
		}
		api, recs := sum("edgepipe_rtld_reconciled_api_requests_total"), sum("edgepipe_rtld_reconciled_log_records_total")
		after := r.rows(t)
		for _, env := range r.envs {
			var a, n float64
			for _, c := range after[env] {
				a, n = a+float64(c.api), n+float64(c.records)
			}
			if len(before[env]) != len(after[env]) || api[env] != a || recs[env] != n {
				last = fmt.Sprintf("%s: over the replicas api %v, records %v; table %v, %v", env, api[env], recs[env], a, n)
				return false
			}
		}
		return true
	})
	if t.Failed() {
		t.Log(last)
	}
	// Both replicas took part, and some batches were spooled on both (the
	// copies collapse under FINAL): more records accepted than the
	// simulator had acknowledged.
	accepted := prom.QueryVector(t, `edgepipe_rtld_records_received_total{status="accepted"}`)
	delivered := r.sim.Delivered() // after the scrape: it acknowledged at least what was accepted then, once
	if len(accepted) != 2 || accepted[0].Value == 0 || accepted[1].Value == 0 {
		t.Fatalf("each replica should have accepted part of the records: %v", accepted)
	}
	t.Logf("accepted %v and %v records; the simulator had %d acknowledged", accepted[0].Value, accepted[1].Value, delivered.RecordsAcknowledged)
	if float64(accepted[0].Value+accepted[1].Value) <= float64(delivered.RecordsAcknowledged) {
		t.Errorf("no batch was accepted by both replicas: the test did not exercise duplicates across replicas")
	}
	if skipped := prom.QueryVector(t, `edgepipe_rtld_reconcile_skipped_buckets_total > 0`); len(skipped) > len(r.envs) {
		t.Errorf("skipped: %v", skipped)
	}
}

// reconciled is what a receiver's reconciliation counters hold for one
// environment.
type reconciled struct {
	buckets, api, records float64
	skipped               map[string]float64 // by reason, those above 0
}

// reconciledCounters scrapes the edgepipe_rtld_reconciled_* and skipped
// counters of the receiver at metricsURL, by environment.
func reconciledCounters(t *testing.T, client *http.Client, metricsURL string) map[string]*reconciled {
	t.Helper()
	out := map[string]*reconciled{}
	get := func(m *dto.Metric) *reconciled {
		for _, l := range m.GetLabel() {
			if l.GetName() == "environment_id" {
				if out[l.GetValue()] == nil {
					out[l.GetValue()] = &reconciled{skipped: map[string]float64{}}
				}
				return out[l.GetValue()]
			}
		}
		t.Fatalf("a reconciliation series without environment_id: %v", m)
		return nil
	}
	for name, mf := range parseText(t, scrapeText(t, client, metricsURL)) {
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			switch name {
			case "edgepipe_rtld_reconciled_buckets_total":
				get(m).buckets = v
			case "edgepipe_rtld_reconciled_api_requests_total":
				get(m).api = v
			case "edgepipe_rtld_reconciled_log_records_total":
				get(m).records = v
			case "edgepipe_rtld_reconcile_skipped_buckets_total":
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" && v > 0 {
						get(m).skipped[l.GetValue()] = v
					}
				}
			}
		}
	}
	return out
}

// tcpGate relays TCP connections to a target until it is shut: then it
// drops the connections it relays and refuses new ones, until opened
// again (a network partition between a receiver and ClickHouse).
type tcpGate struct {
	target string
	l      net.Listener

	mu    sync.Mutex
	shut  bool
	conns map[net.Conn]bool
}

func newTCPGate(t *testing.T, target string) *tcpGate {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &tcpGate{target: target, l: l, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { l.Close(); g.set(true) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go g.relay(c)
		}
	}()
	return g
}

func (g *tcpGate) Addr() string { return g.l.Addr().String() }

// track adds c to the connections relayed, or reports that the gate is shut.
func (g *tcpGate) track(cs ...net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut {
		return false
	}
	for _, c := range cs {
		g.conns[c] = true
	}
	return true
}

func (g *tcpGate) relay(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", g.target)
	if err != nil {
		return
	}
	defer up.Close()
	if !g.track(c, up) {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

// set shuts the gate (dropping every connection) or opens it.
func (g *tcpGate) set(shut bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shut = shut
	if shut {
		for c := range g.conns {
			c.Close()
		}
		clear(g.conns)
	}
}

// TestReconcileTwoReplicasThroughRestarts is TestReconcileTwoReplicas
// (ClickHouse counts, two replicas behind one address, rx-0 compares) with
// each replica stopped within a bucket and restarted: the other one killed
// with SIGKILL while records of the bucket it took wait in its spool (its
// way to ClickHouse cut) and kept down past the bucket's due time, then the
// leader killed with SIGKILL, then the other one stopped with SIGTERM and
// kept down while a bucket falls due, then the leader stopped with
// SIGTERM. Every bucket from the first whole one on is compared (none
// skipped), the first only once the killed replica's records are in
// ClickHouse; log_completeness under FINAL holds exactly the simulator's
// requests and the records it delivered (no false loss, no false 100%);
// and the leader's counters, before each of its stops and at the end, hold
// as many records as API requests, with no bucket skipped but the one in
// which the profile was created.
func TestReconcileTwoReplicasThroughRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two receivers against the simulator for a simulated hour")
	}
	r := startReconcileSim(t, 3, platformsim.DeliveryFaults{DropAckPercent: 10})
	gate := newTCPGate(t, r.ch.Addr()) // the other replica's way to ClickHouse
	addrs, rx := r.startReplicas(t, "clickhouse://"+gate.Addr()+"/"+r.db)
	const leader, other = 0, 1
	r.profiles(t)
	// b0 is the first bucket the profiles were in place for all along.
	b0 := r.clock.Now().Truncate(5 * time.Minute).Add(5 * time.Minute)
	client := &http.Client{Timeout: 5 * time.Second}
	metricsURL := func(i int) string { return "http://" + addrs[i] + "/metrics" }
	checkCounters := func(when string) {
		t.Helper()
		for env, c := range reconciledCounters(t, client, metricsURL(leader)) {
			if c.records != c.api {
				t.Errorf("%s: the leader's counters of %s: %v records for %v API requests over %v buckets", when, env, c.records, c.api, c.buckets)
			}
			for reason, n := range c.skipped {
				if (reason != "profile_changed" && reason != "profile_unknown") || n > 1 {
					t.Errorf("%s: the leader skipped %v buckets of %s as %s", when, n, env, reason)
				}
			}
		}
	}
	// stop stops replica i at b0+at with SIGKILL or SIGTERM and starts it
	// again after down (wall time), returning when (platform time).
	stop := func(i int, at time.Duration, sig syscall.Signal, down time.Duration) time.Time {
		t.Helper()
		r.waitSim(t, b0.Add(at))
		name := map[syscall.Signal]string{syscall.SIGKILL: "SIGKILL", syscall.SIGTERM: "SIGTERM"}[sig]
		if i == leader {
			checkCounters("before the leader's " + name)
		}
		if sig == syscall.SIGKILL {
			rx[i].kill9()
		} else if err := rx[i].signal(sig); err != nil {
			t.Errorf("rx-%d after %s: %v", i, name, err)
		}
		t.Logf("rx-%d stopped with %s at %s", i, name, r.clock.Now().Format("15:04:05"))
		time.Sleep(down)
		if i == other {
			gate.set(false)
		}
		restarted := r.clock.Now()
		rx[i].start()
		waitReady(t, client, "http://"+addrs[i])
		return restarted
	}

	// The other replica loses ClickHouse within b0 and is killed with
	// records of b0 in its spool only; it stays down past b0's due time
	// (b0+11m).
	r.waitSim(t, b0.Add(time.Minute))
	gate.set(true)
	r.waitSim(t, b0.Add(2*time.Minute+30*time.Second))
	lag := -1.0
	for _, m := range parseText(t, scrapeText(t, client, metricsURL(other)))["edgepipe_rtld_sink_lag_entries"].GetMetric() {
		if hasLabel(m, "sink", "clickhouse") {
			lag = m.GetGauge().GetValue()
		}
	}
	if lag <= 0 {
		t.Fatalf("the other replica holds %v batches for ClickHouse before it is killed: the kill tests nothing", lag)
	}
	back := stop(other, 2*time.Minute+30*time.Second, syscall.SIGKILL, 9500*time.Millisecond)
	stop(leader, 13*time.Minute+30*time.Second, syscall.SIGKILL, 300*time.Millisecond)
	// Down while b0+5m falls due (the leader came back at about b0+13m50s:
	// due 6 minutes later).
	stop(other, 18*time.Minute+30*time.Second, syscall.SIGTERM, 2*time.Second)
	stop(leader, 22*time.Minute+30*time.Second, syscall.SIGTERM, 300*time.Millisecond)

	const buckets = 6
	var rows map[string]map[time.Time]completeness
	waitFor(t, fmt.Sprintf("the %d buckets from %s compared", buckets, b0.Format("15:04")), 2*time.Minute, func() bool {
		rows = r.rows(t)
		for _, env := range r.envs {
			if _, ok := rows[env][b0.Add((buckets-1)*5*time.Minute)]; !ok {
				return false
			}
		}
		return true
	})
	r.checkRows(t, rows, func(string) bool { return true })
	for _, env := range r.envs {
		for i := range buckets {
			at := b0.Add(time.Duration(i) * 5 * time.Minute)
			if _, ok := rows[env][at]; !ok {
				t.Errorf("%s: the bucket of %s was not compared", env, at.Format("15:04"))
			}
		}
	}
	// b0 was first compared after the killed replica came back and
	// delivered its records.
	first := r.ch.QueryUint64(t, fmt.Sprintf("SELECT toUInt64(min(reconciled_at)) FROM `%s`.log_completeness WHERE time = toDateTime(%d)", r.db, b0.Unix()))
	if at := time.Unix(int64(first), 0); at.Before(back) {
		t.Errorf("the bucket of %s was first compared at %s, before the replica killed with its records came back at %s",
			b0.Format("15:04"), at.UTC().Format("15:04:05"), back.Format("15:04:05"))
	}
	checkCounters("at the end")
	counters := reconciledCounters(t, client, metricsURL(leader))
	for _, env := range r.envs {
		if c := counters[env]; c == nil || c.buckets == 0 {
			t.Errorf("%s: the leader compared no bucket since its last restart", env)
		}
	}
	if c := reconciledCounters(t, client, metricsURL(other)); len(c) != 0 {
		t.Errorf("the replica that does not compare publishes reconciliation series of %d environments", len(c))
	}
	// Nothing was damaged: no replica says its reconcile state was.
	for i, p := range rx {
		b, err := os.ReadFile(p.log)
		if err != nil {
			t.Fatal(err)
		}
		if l := grepLines(string(b), "state file was damaged"); l != "" {
			t.Errorf("rx-%d, after its restarts:\n%s", i, l)
		}
	}
}

// TestReconcileWithoutMetricsScope: an API client without app.metrics. The
// receiver says so once, at start, skips every due bucket with reason
// forbidden and compares none, and ingest goes on: records reach
// ClickHouse.
func TestReconcileWithoutMetricsScope(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the receiver against the simulator")
	}
	r := startReconcileSim(t, 2, platformsim.DeliveryFaults{}, func(c *platformsim.Config) {
		c.Clients = []platformsim.Client{{ID: platformsim.DemoClientID, Secret: platformsim.DemoClientSecret, Scopes: []string{platformsim.ScopeRTLD}}}
	})
	addr := testenv.FreeAddr(t)
	base := "https://" + addr
	p := startReceiver(t, r.receiverArgs(addr, base, filepath.Join(t.TempDir(), "spool"), "--web.config.file="+r.cert.webConfig(t)), receiverEnv)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.cert.pool}}, Timeout: 5 * time.Second}
	forbidden := func() float64 {
		var n float64
		for _, env := range r.envs {
			n += scrape(client, base+"/metrics", `edgepipe_rtld_reconcile_skipped_buckets_total{environment_id="`+env+`",reason="forbidden"}`)
		}
		return n
	}
	waitFor(t, "buckets skipped as forbidden", 2*time.Minute, func() bool { return forbidden() >= 2*float64(len(r.envs)) })
	text := string(scrapeText(t, client, base+"/metrics"))
	for _, env := range r.envs {
		if n := scrape(client, base+"/metrics", `edgepipe_rtld_reconciled_buckets_total{environment_id="`+env+`"}`); n != 0 {
			t.Errorf("%s: %v buckets compared without the scope", env, n)
		}
	}
	if n := r.ch.QueryUint64(t, fmt.Sprintf("SELECT count() FROM `%s`.access_logs FINAL", r.db)); n == 0 {
		t.Error("no record reached ClickHouse: ingest was affected")
	}
	const warning = "lacks the app.metrics scope"
	if n := strings.Count(p.logs(), warning); n != 1 {
		t.Errorf("the log says %q %d times, want once:\n%s", warning, n, p.logs())
	}
	t.Logf("%s", grepLines(text, "edgepipe_rtld_reconcile"))
}
