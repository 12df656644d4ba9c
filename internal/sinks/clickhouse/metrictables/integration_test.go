package metrictables_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/schedule"
	"github.com/edgepipe/edgepipe/internal/schedule/fakeclock"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables/chtest"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// world is the simulator, a real ClickHouse and a metricsapi client over
// real HTTP, on a fake clock.
type world struct {
	t     *testing.T
	clock *fakeclock.Clock
	sim   *platformsim.Server
	ch    *testenv.ClickHouseServer
	dsn   string
	db    string
	api   *metricsapi.Client
	envs  []string
	log   *slog.Logger
	// cluster names the ClickHouse cluster the sink writes to ("": a
	// single server).
	cluster string
	// tls and retention configure the sink.
	tls       clickhouse.TLSOptions
	retention time.Duration
	// inventory adds the inventory's tables to schemaOn.
	inventory bool
}

// t0 is a bucket boundary the tests start at.
var t0 = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

func testLogger(_ testing.TB) *slog.Logger {
	if os.Getenv("EDGEPIPE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func newWorld(t *testing.T, envs int) *world {
	t.Helper()
	return newWorldOn(t, testenv.ClickHouse(t), envs)
}

// newWorldOn is newWorld with the sink writing to ch, a single server or a
// cluster's node.
func newWorldOn(t *testing.T, ch *testenv.ClickHouseServer, envs int) *world {
	t.Helper()
	w := newWorldAt(t, ch.DSN, envs)
	w.ch = ch
	return w
}

// newWorldAt is newWorld with the sink writing to the server whose DSN
// for a database dsnFor returns.
func newWorldAt(t *testing.T, dsnFor func(database string) string, envs int) *world {
	t.Helper()
	w := &world{t: t, clock: fakeclock.New(t0), log: testLogger(t)}
	var err error
	w.sim, err = platformsim.New(platformsim.Config{Seed: 7, Now: w.clock.Now, Environments: envs})
	if err != nil {
		t.Fatal(err)
	}
	base, err := w.sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.sim.Close() })
	w.api = chtest.MetricsClient(t, base)
	w.envs = w.sim.EnvironmentIDs()
	w.db = "cdn_" + strings.ToLower(strings.NewReplacer("/", "_", "-", "_").Replace(t.Name()))
	w.dsn = dsnFor(w.db)
	return w
}

func (w *world) newSink(reg prometheus.Registerer) *metrictables.Sink {
	w.t.Helper()
	s, err := metrictables.NewSink(metrictables.SinkConfig{
		DSN: w.dsn, Logger: w.log, Registerer: reg, Now: w.clock.Now, Cluster: w.cluster, TLS: w.tls, Retention: w.retention,
		RetryMax: 300 * time.Millisecond, InsertTimeout: 10 * time.Second,
	})
	if err != nil {
		w.t.Fatal(err)
	}
	s.Start()
	w.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

type staticEnvs []string

func (s staticEnvs) Environments(context.Context) ([]string, error) { return s, nil }

// pollCounter is a schedule.Observer that lets the test wait for polls.
type pollCounter struct {
	mu        sync.Mutex
	polls     int
	revisions int
	errs      []error
	cond      *sync.Cond
}

func newPollCounter() *pollCounter {
	p := &pollCounter{}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func (p *pollCounter) ObservePoll(r schedule.PollReport) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.polls++
	p.revisions += r.Revisions
	if r.Err != nil {
		p.errs = append(p.errs, r.Err)
	}
	p.cond.Broadcast()
}

func (p *pollCounter) ObservePublishError(string, string, error) {}

func (p *pollCounter) waitPolls(t *testing.T, n int) {
	t.Helper()
	deadline := time.AfterFunc(60*time.Second, func() {
		p.mu.Lock()
		p.polls = -1 << 30
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer deadline.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.polls >= 0 && p.polls < n {
		p.cond.Wait()
	}
	if p.polls < 0 {
		t.Fatalf("timed out waiting for %d polls", n)
	}
	if len(p.errs) > 0 {
		t.Fatalf("poll errors: %v", p.errs)
	}
}

// running is a scheduler run by a test.
type running struct {
	polls  *pollCounter
	cancel context.CancelFunc
	done   chan struct{}
	sets   int // datasets polled per cycle
}

// startScheduler runs a scheduler over every dataset, publishing to sink
// and resuming from it, and waits for the first round of polls.
func (w *world) startScheduler(sink *metrictables.Sink) *running {
	w.t.Helper()
	dss, err := w.api.Datasets(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	r := &running{polls: newPollCounter(), done: make(chan struct{}), sets: len(dss)}
	sched, err := schedule.New(schedule.Config{
		Granularity:       metricsapi.FiveMinutes,
		PollInterval:      5 * time.Minute,
		DiscoveryInterval: 24 * time.Hour,
		Concurrency:       6,
		DatasetSource:     w.api,
		Environments:      staticEnvs(w.envs),
		Fetcher:           w.api,
		Resume:            sink,
		Publishers:        []schedule.NamedPublisher{{Name: "clickhouse", Publisher: sink}},
		Observer:          r.polls,
		Clock:             w.clock,
		Logger:            w.log,
	})
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		_ = sched.Run(ctx)
	}()
	w.t.Cleanup(r.stop)
	r.polls.waitPolls(w.t, r.sets)
	return r
}

func (r *running) stop() {
	r.cancel()
	<-r.done
}

// cycle advances the clock by one poll interval and waits for every
// dataset's poll.
func (w *world) cycle(r *running) {
	w.t.Helper()
	r.polls.mu.Lock()
	n := r.polls.polls
	r.polls.mu.Unlock()
	// Every loop sleeps until the next boundary before the clock moves.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.clock.BlockUntil(ctx, r.sets+1); err != nil {
		w.t.Fatalf("scheduler loops did not go to sleep: %v", err)
	}
	w.clock.Advance(5 * time.Minute)
	r.polls.waitPolls(w.t, n+r.sets)
}

func flush(t *testing.T, s *metrictables.Sink) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// compare checks that ClickHouse holds exactly the simulator's rows of
// every dataset over [from, to): same keys, every value equal.
func (w *world) compare(conn driver.Conn, from, to time.Time) (total int) {
	w.t.Helper()
	dss, err := w.api.Datasets(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	if len(dss) != 6 {
		w.t.Errorf("simulator serves %d datasets, want 6", len(dss))
	}
	for i := range dss {
		ds := &dss[i]
		want := chtest.Truth(w.t, w.api, ds, w.envs, from, to)
		got := chtest.Stored(w.t, conn, w.db, ds, from, to)
		if len(want) == 0 {
			w.t.Errorf("%s: the simulator has no rows in [%s, %s): the comparison would prove nothing", ds.Name, from, to)
		}
		if len(got) != len(want) {
			w.t.Errorf("%s: %d rows in ClickHouse (FINAL), simulator has %d", ds.Name, len(got), len(want))
		}
		chtest.Compare(w.t, ds, want, got)
		total += len(want)
	}
	return total
}

func countRows(t *testing.T, conn driver.Conn, q string) uint64 {
	t.Helper()
	var n uint64
	if err := conn.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// TestSchedulerToClickHouseMatchesSimulator: all six datasets after a few
// poll cycles equal the simulator's rows exactly, and buckets revised by
// late data are replaced (more rows written than FINAL shows).
func TestSchedulerToClickHouseMatchesSimulator(t *testing.T) {
	w := newWorld(t, 25)
	reg := prometheus.NewRegistry()
	sink := w.newSink(reg)
	r := w.startScheduler(sink)
	for range 4 {
		w.cycle(r)
	}
	flush(t, sink)
	conn := w.ch.Conn(t)
	from := t0.Add(-30 * time.Minute) // the first poll's settle window
	to := metricsapi.FiveMinutes.Truncate(w.clock.Now())
	n := w.compare(conn, from, to)
	t.Logf("%d rows equal across six datasets in [%s, %s)", n, from.Format(time.RFC3339), to.Format(time.RFC3339))

	r.polls.mu.Lock()
	revisions := r.polls.revisions
	r.polls.mu.Unlock()
	if revisions == 0 {
		t.Fatal("no bucket was revised: late data should revise recent buckets")
	}
	raw := countRows(t, conn, fmt.Sprintf("SELECT count() FROM `%s`.edge_usage_by_country", w.db))
	final := countRows(t, conn, fmt.Sprintf("SELECT count() FROM `%s`.edge_usage_by_country FINAL", w.db))
	if raw <= final {
		t.Errorf("edge_usage_by_country: %d rows written, %d under FINAL: expected revisions as extra rows", raw, final)
	}
	t.Logf("%d revisions published; edge_usage_by_country %d rows written, %d under FINAL", revisions, raw, final)

	written := testutilSum(t, reg, "edgepipe_clickhouse_rows_written_total")
	if written == 0 {
		t.Error("edgepipe_clickhouse_rows_written_total is 0")
	}
}

func testutilSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.Counter != nil {
				sum += m.Counter.GetValue()
			}
			if m.Gauge != nil {
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

// TestClickHouseKilledMidRun: ClickHouse dies (SIGKILL) while polls go on;
// the sink queues and retries, and after the restart every bucket is there
// exactly once under FINAL.
func TestClickHouseKilledMidRun(t *testing.T) {
	w := newWorld(t, 25)
	reg := prometheus.NewRegistry()
	sink := w.newSink(reg)
	r := w.startScheduler(sink)
	w.cycle(r)
	flush(t, sink)

	w.ch.Kill()
	for range 3 {
		w.cycle(r) // polls keep going: Publish never blocks on ClickHouse
	}
	if q := sink.QueuedRows(); q == 0 {
		t.Fatal("nothing queued while ClickHouse was down")
	}
	time.Sleep(500 * time.Millisecond) // let the writer fail at least once
	w.ch.Start()
	w.cycle(r)
	flush(t, sink)

	if errs := testutilSum(t, reg, "edgepipe_clickhouse_insert_errors_total"); errs == 0 {
		t.Error("no insert error counted while ClickHouse was down")
	}
	if d := testutilSum(t, reg, "edgepipe_clickhouse_dropped_rows_total"); d != 0 {
		t.Errorf("%v rows dropped", d)
	}
	conn := w.ch.Conn(t)
	from := t0.Add(-30 * time.Minute)
	to := metricsapi.FiveMinutes.Truncate(w.clock.Now())
	w.compare(conn, from, to)
}

// TestExporterRestartBackfillsGap: the scheduler stops for two hours; a new
// one (fresh state, as after a restart) resumes from ClickHouse's newest
// bucket, so the gap is filled.
func TestExporterRestartBackfillsGap(t *testing.T) {
	w := newWorld(t, 25)
	sink := w.newSink(nil)
	r := w.startScheduler(sink)
	w.cycle(r)
	flush(t, sink)
	r.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := sink.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	stoppedAt := metricsapi.FiveMinutes.Truncate(w.clock.Now())

	w.clock.Advance(2 * time.Hour)
	sink2 := w.newSink(nil)
	r2 := w.startScheduler(sink2)
	w.cycle(r2)
	flush(t, sink2)

	conn := w.ch.Conn(t)
	gapFrom, gapTo := stoppedAt, stoppedAt.Add(2*time.Hour)
	var inGap uint64
	if err := conn.QueryRow(context.Background(), fmt.Sprintf(
		"SELECT count() FROM `%s`.edge_usage_by_country FINAL WHERE time >= toDateTime(%d) AND time < toDateTime(%d)",
		w.db, gapFrom.Unix(), gapTo.Unix())).Scan(&inGap); err != nil {
		t.Fatal(err)
	}
	if inGap == 0 {
		t.Fatal("nothing stored in the gap: the restart did not resume from ClickHouse")
	}
	w.compare(conn, t0.Add(-30*time.Minute), metricsapi.FiveMinutes.Truncate(w.clock.Now()))
}

// TestSchemaErrorRepairedNotDropped: a column dropped under a running sink
// makes its next INSERT fail (code 16); the sink counts a schema error,
// restores the column and writes the rows again: nothing is dropped, and
// the buckets written since are exact under FINAL.
func TestSchemaErrorRepairedNotDropped(t *testing.T) {
	w := newWorld(t, 25)
	reg := prometheus.NewRegistry()
	sink := w.newSink(reg)
	r := w.startScheduler(sink)
	w.cycle(r)
	flush(t, sink)
	w.ch.Exec(t, fmt.Sprintf("ALTER TABLE `%s`.edge_errors DROP COLUMN requests_edge_total", w.db))
	droppedAt := metricsapi.FiveMinutes.Truncate(w.clock.Now())
	w.cycle(r)
	flush(t, sink)
	w.cycle(r)
	flush(t, sink)
	// Buckets from the drop on are (re)published after it; older ones keep
	// the column's default, as after any DROP COLUMN.
	w.compare(w.ch.Conn(t), droppedAt, metricsapi.FiveMinutes.Truncate(w.clock.Now()))
	if d := testutilSum(t, reg, "edgepipe_clickhouse_dropped_rows_total"); d != 0 {
		t.Errorf("%v rows dropped", d)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	schemaErrors := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "edgepipe_clickhouse_insert_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "class" && l.GetValue() == "schema" {
					schemaErrors += m.GetCounter().GetValue()
				}
			}
		}
	}
	if schemaErrors == 0 {
		t.Error("no insert error of class schema counted: the test did not hit the dropped column")
	}
}

// TestDroppedDatabaseRecreated: the whole database dropped under a running
// sink: the schema manager (connected without a database) re-creates it
// and the tables, the queued rows are written, nothing is dropped.
func TestDroppedDatabaseRecreated(t *testing.T) {
	w := newWorld(t, 25)
	reg := prometheus.NewRegistry()
	sink := w.newSink(reg)
	r := w.startScheduler(sink)
	w.cycle(r)
	flush(t, sink)
	w.ch.Exec(t, fmt.Sprintf("DROP DATABASE `%s`", w.db))
	droppedAt := metricsapi.FiveMinutes.Truncate(w.clock.Now())
	w.cycle(r)
	flush(t, sink)
	w.cycle(r)
	flush(t, sink)
	w.compare(w.ch.Conn(t), droppedAt, metricsapi.FiveMinutes.Truncate(w.clock.Now()))
	if d := testutilSum(t, reg, "edgepipe_clickhouse_dropped_rows_total"); d != 0 {
		t.Errorf("%v rows dropped", d)
	}
}
