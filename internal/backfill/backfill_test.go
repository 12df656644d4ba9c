package backfill_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgepipe/edgepipe/internal/backfill"
	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables/chtest"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

var now = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)

func testLogger() *slog.Logger {
	if os.Getenv("EDGEPIPE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

type fixture struct {
	sim  *platformsim.Server
	api  *metricsapi.Client
	ch   *testenv.ClickHouseServer
	db   string
	sink *metrictables.Sink
	conn driver.Conn
	dss  []metricsapi.Dataset
	envs []string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureOn(t, testenv.ClickHouse(t), "")
}

// newFixtureOn is newFixture writing to ch, a single server or a node of
// cluster.
func newFixtureOn(t *testing.T, ch *testenv.ClickHouseServer, cluster string) *fixture {
	t.Helper()
	f := &fixture{ch: ch}
	var err error
	f.sim, err = platformsim.New(platformsim.Config{Seed: 11, Now: func() time.Time { return now }, Environments: 25})
	if err != nil {
		t.Fatal(err)
	}
	base, err := f.sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.sim.Close() })
	f.api = chtest.MetricsClient(t, base)
	f.envs = f.sim.EnvironmentIDs()
	if len(f.envs) != 25 {
		t.Fatalf("simulator has %d environments, want 25", len(f.envs))
	}
	f.dss, err = f.api.Datasets(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f.db = "bf_" + strings.ToLower(t.Name())
	f.sink = newSink(t, f.ch.DSN(f.db), cluster)
	f.conn = f.ch.Conn(t)
	return f
}

// newSink returns a metrics sink writing to dsn (on cluster, if set),
// closed on cleanup.
func newSink(t *testing.T, dsn, cluster string) *metrictables.Sink {
	t.Helper()
	sink, err := metrictables.NewSink(metrictables.SinkConfig{DSN: dsn, Cluster: cluster, Logger: testLogger(), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sink.Close(context.Background()) })
	return sink
}

func (f *fixture) config(t *testing.T, from, to time.Time) backfill.Config {
	t.Helper()
	return f.configFor(t, f.sink, from, to)
}

// configFor is config with writes and progress through sink.
func (f *fixture) configFor(t *testing.T, sink *metrictables.Sink, from, to time.Time) backfill.Config {
	t.Helper()
	schema, err := sink.Schema(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	prog, err := backfill.NewClickHouseProgress(context.Background(), schema)
	if err != nil {
		t.Fatal(err)
	}
	return backfill.Config{
		Datasets: f.dss, Environments: f.envs, Granularity: metricsapi.FiveMinutes,
		From: from, To: to, Fetcher: f.api, Writer: sink, Progress: prog,
		Logger: testLogger(), Now: func() time.Time { return now },
	}
}

// aggregate is a dataset's row count and per-metric sums over a range.
type aggregate struct {
	rows uint64
	sums []float64
}

// truthAggregate sums the simulator's rows request by request (so the 7
// days never sit in memory at once).
func (f *fixture) truthAggregate(t *testing.T, ds *metricsapi.Dataset, from, to time.Time) aggregate {
	t.Helper()
	a := aggregate{sums: make([]float64, len(ds.Metrics))}
	for day := from; day.Before(to); day = day.Add(24 * time.Hour) {
		end := day.Add(24 * time.Hour)
		if end.After(to) {
			end = to
		}
		res, err := f.api.Data(context.Background(), metricsapi.Query{
			Dataset: ds.Name, Environments: f.envs, Granularity: metricsapi.FiveMinutes, Start: day, End: end,
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.Rows {
			a.rows++
			for i, m := range ds.Metrics {
				j := slices.Index(res.Metrics, m.Name)
				v := r.Values[j]
				if metricsapi.Classify(m.Name).Kind == metricsapi.KindCount {
					v = math.Round(max(v, 0))
				}
				if !math.IsNaN(v) {
					a.sums[i] += v
				}
			}
		}
	}
	return a
}

func (f *fixture) storedAggregate(t *testing.T, ds *metricsapi.Dataset, from, to time.Time) aggregate {
	t.Helper()
	sel := []string{"count()"}
	for _, m := range ds.Metrics {
		sel = append(sel, fmt.Sprintf("sum(if(isNaN(toFloat64(`%s`)), 0, toFloat64(`%s`)))", m.Name, m.Name))
	}
	q := fmt.Sprintf("SELECT %s FROM `%s`.`%s` FINAL WHERE granularity = 'FIVE_MINUTES' AND time >= toDateTime(%d) AND time < toDateTime(%d)",
		strings.Join(sel, ", "), f.db, ds.Name, from.Unix(), to.Unix())
	a := aggregate{sums: make([]float64, len(ds.Metrics))}
	dest := []any{&a.rows}
	for i := range a.sums {
		dest = append(dest, &a.sums[i])
	}
	if err := f.conn.QueryRow(context.Background(), q).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return a
}

// TestBackfillSevenDays loads 7 days of FIVE_MINUTES data of 25
// environments, interrupted once (as by Ctrl-C) and resumed, and checks
// the request limits at the simulator and the stored rows against it.
func TestBackfillSevenDays(t *testing.T) {
	f := newFixture(t)
	// All six datasets are 5.9M rows and take about ten minutes on a small
	// machine (the comparison refetches everything); by default the test
	// loads two datasets, EDGEPIPE_BACKFILL_ALL=1 loads all six.
	if os.Getenv("EDGEPIPE_BACKFILL_ALL") == "" {
		f.dss = slices.DeleteFunc(f.dss, func(d metricsapi.Dataset) bool {
			return d.Name != "edge_errors" && d.Name != "origin_offload"
		})
	}
	from, to := now.Add(-7*24*time.Hour), now
	cfg := f.config(t, from, to)
	chunks, _, err := backfill.Plan(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// datasets × 7 days × ceil(25/20) environment batches.
	if want := len(f.dss) * 7 * 2; len(chunks) != want {
		t.Fatalf("planned %d chunks, want %d", len(chunks), want)
	}

	// First run: interrupted after 10 chunks.
	ctx, cancel := context.WithCancel(context.Background())
	stopAfter := &cancelAfter{n: 10, cancel: cancel}
	cfg.Reporter = stopAfter
	sum1, err := backfill.Run(ctx, cfg)
	cancel()
	if err == nil {
		t.Fatal("interrupted run returned no error")
	}
	if sum1.Loaded != 10 {
		t.Fatalf("interrupted run loaded %d chunks, want 10", sum1.Loaded)
	}
	requestsFirst := len(f.sim.Stats().Data)

	// Second run resumes.
	var out strings.Builder
	cfg.Reporter = backfill.NewReporter(&out, false)
	sum2, err := backfill.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sum2.Skipped != 10 || sum2.Loaded != len(chunks)-10 {
		t.Errorf("resumed run: skipped %d, loaded %d; want 10 and %d", sum2.Skipped, sum2.Loaded, len(chunks)-10)
	}
	if !strings.Contains(out.String(), "backfill done") {
		t.Errorf("no final progress line:\n%s", out.String())
	}
	t.Logf("progress output:\n%s", out.String())

	st := f.sim.Stats()
	if got := len(st.Data); got != len(chunks) || requestsFirst != 10 {
		t.Errorf("data requests: %d in all (%d in the first run), want %d (10)", got, requestsFirst, len(chunks))
	}
	maxEnvs, maxRange := 0, time.Duration(0)
	for _, r := range st.Data {
		if r.Status != 200 {
			t.Errorf("request %s %s..%s answered %d", r.Dataset, r.Start, r.End, r.Status)
		}
		maxEnvs = max(maxEnvs, len(r.Environments))
		maxRange = max(maxRange, r.End.Sub(r.Start))
		if r.Granularity != metricsapi.FiveMinutes {
			t.Errorf("request with granularity %s", r.Granularity)
		}
	}
	if maxEnvs > 20 || maxRange > 24*time.Hour {
		t.Errorf("limits broken: up to %d environments and %s per request", maxEnvs, maxRange)
	}
	t.Logf("%d requests, at most %d environments and %s each; %d rows in %s", len(st.Data), maxEnvs, maxRange,
		sum1.Rows+sum2.Rows, sum1.Elapsed+sum2.Elapsed)

	for i := range f.dss {
		ds := &f.dss[i]
		want := f.truthAggregate(t, ds, from, to)
		got := f.storedAggregate(t, ds, from, to)
		if want.rows == 0 {
			t.Errorf("%s: simulator has no rows", ds.Name)
		}
		if got.rows != want.rows {
			t.Errorf("%s: %d rows stored, simulator has %d", ds.Name, got.rows, want.rows)
		}
		for j := range want.sums {
			if d := math.Abs(got.sums[j] - want.sums[j]); d > 1e-9*math.Max(1, math.Abs(want.sums[j])) {
				t.Errorf("%s: sum of %s = %v, simulator %v", ds.Name, ds.Metrics[j].Name, got.sums[j], want.sums[j])
			}
		}
	}
	// Every value of the last day of one dataset, row by row.
	for i := range f.dss {
		if f.dss[i].Name == "origin_offload" {
			f.compareRows(t, &f.dss[i], now.Add(-24*time.Hour), now)
		}
	}
}

// compareRows checks every stored row of ds in [from, to) against the
// simulator's, value by value.
func (f *fixture) compareRows(t *testing.T, ds *metricsapi.Dataset, from, to time.Time) {
	t.Helper()
	want := chtest.Truth(t, f.api, ds, f.envs, from, to)
	got := chtest.Stored(t, f.conn, f.db, ds, from, to)
	if len(got) != len(want) {
		t.Errorf("%s: %d rows stored in the last day, simulator has %d", ds.Name, len(got), len(want))
	}
	if chtest.Compare(t, ds, want, got) == 0 {
		t.Logf("%s: %d rows of the last day equal value by value", ds.Name, len(got))
	}
}

// cancelAfter is a Reporter that cancels the run after n chunks, as Ctrl-C
// would.
type cancelAfter struct {
	n, seen int
	cancel  context.CancelFunc
}

func (c *cancelAfter) Start(int, int) {}
func (c *cancelAfter) Chunk(backfill.Chunk, int) {
	if c.seen++; c.seen == c.n {
		c.cancel()
	}
}
func (c *cancelAfter) Finish(backfill.Summary, error) {}

// TestBackfillValuesThatAreNot: chunks whose answers hold values that are
// not numbers or malformed rows load their good rows, never write a row
// without every count (a 0 there would replace a good row), are not
// recorded as done, and the run says so; run again against sound answers,
// the same chunks load whole and the table equals the simulator.
func TestBackfillValuesThatAreNot(t *testing.T) {
	f := newFixture(t)
	f.dss = slices.DeleteFunc(f.dss, func(d metricsapi.Dataset) bool { return d.Name != "edge_errors" })
	ds := &f.dss[0]
	bad := platformsim.Faults{BadValues: platformsim.BadNull, BadValueRate: 0.3, MalformedRowRate: 0.1}

	// Stored good rows are not replaced by a bad answer.
	from, to := now.Add(-6*time.Hour), now.Add(-3*time.Hour)
	if _, err := backfill.Run(context.Background(), f.config(t, from, to)); err != nil {
		t.Fatal(err)
	}
	truth := chtest.Truth(t, f.api, ds, f.envs, from, to)
	f.sim.SetFaults(bad)
	cfg := f.config(t, from, to)
	cfg.Progress = backfill.Fresh{Progress: cfg.Progress} // load everything again
	sum, err := backfill.Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "run the same command again") || sum.Incomplete == 0 {
		t.Fatalf("run with bad answers: %+v, %v; want incomplete chunks and the advice to run again", sum, err)
	}
	if chtest.Compare(t, ds, truth, chtest.Stored(t, f.conn, f.db, ds, from, to)) > 0 {
		t.Error("the bad answers changed stored rows")
	}

	// A range first loaded from bad answers is not recorded as done: the
	// same command, once the answers are sound, loads it whole.
	from, to = now.Add(-3*time.Hour), now
	sum, err = backfill.Run(context.Background(), f.config(t, from, to))
	if err == nil || sum.Incomplete != sum.Loaded || sum.Loaded == 0 {
		t.Fatalf("run with bad answers: %+v, %v; want every chunk incomplete", sum, err)
	}
	t.Logf("with bad answers: %+v (%v)", sum, err)
	f.sim.SetFaults(platformsim.Faults{})
	truth = chtest.Truth(t, f.api, ds, f.envs, from, to)
	sum, err = backfill.Run(context.Background(), f.config(t, from, to))
	if err != nil || sum.Skipped != 0 || sum.Loaded != sum.Chunks || sum.Incomplete != 0 {
		t.Fatalf("run again: %+v, %v; want every chunk loaded whole", sum, err)
	}
	if chtest.Compare(t, ds, truth, chtest.Stored(t, f.conn, f.db, ds, from, to)) > 0 {
		t.Error("stored rows differ from the simulator")
	}
	if sum, err = backfill.Run(context.Background(), f.config(t, from, to)); err != nil || sum.Skipped != sum.Chunks {
		t.Errorf("third run: %+v, %v; want everything recorded as done", sum, err)
	}
}

// TestBackfillOnCluster loads two days of one dataset into a 2-shard ×
// 2-replica ClickHouse cluster, interrupted after two chunks and resumed
// through another node: the progress table is replicated and read through
// its Distributed table, so the second run skips what the first loaded,
// and the rows equal the simulator's.
func TestBackfillOnCluster(t *testing.T) {
	c := testenv.ClickHouseCluster(t, testenv.ClusterOptions{Shards: 2, Replicas: 2})
	f := newFixtureOn(t, c.Node(1, 1).ClickHouseServer, c.Name)
	f.dss = slices.DeleteFunc(f.dss, func(d metricsapi.Dataset) bool { return d.Name != "origin_offload" })
	from, to := now.Add(-2*24*time.Hour), now
	cfg := f.config(t, from, to)
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Reporter = &cancelAfter{n: 2, cancel: cancel}
	sum1, err := backfill.Run(ctx, cfg)
	cancel()
	if err == nil || sum1.Loaded != 2 {
		t.Fatalf("interrupted run: loaded %d chunks, err %v; want 2 and an error", sum1.Loaded, err)
	}

	// A shard's second replica copies the progress rows asynchronously; a
	// run started at once could read a replica that has not yet (and fetch
	// a chunk again: harmless, but not what this test checks).
	local := fmt.Sprintf("`%s`.`%s_local`", f.db, backfill.ProgressTable)
	for _, n := range c.Nodes {
		n.Exec(t, "SYSTEM SYNC REPLICA "+local)
	}
	other := c.Node(2, 2)
	cfg2 := f.configFor(t, newSink(t, other.DSN(f.db), c.Name), from, to)
	sum2, err := backfill.Run(context.Background(), cfg2)
	if err != nil {
		t.Fatal(err)
	}
	// 2 days × 2 batches of environments.
	if sum2.Skipped != 2 || sum2.Loaded != 2 {
		t.Errorf("resumed through %s: skipped %d, loaded %d; want 2 and 2", other.ReplicaName, sum2.Skipped, sum2.Loaded)
	}
	ds := &f.dss[0]
	// Read once every replica has what its shard acknowledged (a query
	// through the Distributed table reads one replica of each shard).
	for _, n := range c.Nodes {
		n.Exec(t, fmt.Sprintf("SYSTEM SYNC REPLICA `%s`.`%s_local`", f.db, ds.Name))
	}
	want, got := f.truthAggregate(t, ds, from, to), f.storedAggregate(t, ds, from, to)
	if want.rows == 0 || got.rows != want.rows {
		t.Errorf("%s: %d rows through the Distributed table, simulator has %d", ds.Name, got.rows, want.rows)
	}
	for j := range want.sums {
		if d := math.Abs(got.sums[j] - want.sums[j]); d > 1e-9*math.Max(1, math.Abs(want.sums[j])) {
			t.Errorf("%s: sum of %s = %v, simulator %v", ds.Name, ds.Metrics[j].Name, got.sums[j], want.sums[j])
		}
	}
	// Every chunk recorded once across the shards, on both replicas of each.
	var chunks uint64
	for _, shard := range []int{1, 2} {
		var first uint64
		for i, n := range c.Shard(shard) {
			n.Exec(t, "SYSTEM SYNC REPLICA "+local)
			got := n.QueryUint64(t, "SELECT count() FROM "+local+" FINAL")
			if i == 0 {
				first = got
			} else if got != first {
				t.Errorf("shard %d: %s has %d progress rows, %s %d", shard, c.Shard(shard)[0].ReplicaName, first, n.ReplicaName, got)
			}
		}
		chunks += first
	}
	if chunks != 4 {
		t.Errorf("%d chunks recorded across the shards, want 4", chunks)
	}
}
