package metrictables_test

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/backfill"
	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/rtld/reconcile"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/logtable"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// The ClickHouse 26.x tier of the exporter's sink: chDB behind testenv's
// HTTP(S) server (testenv.ChDB).

func TestMain(m *testing.M) { testenv.Main(m) }

// TestExporterOn26 runs the scheduler and the sink over an HTTP and an
// HTTPS DSN (certificate checked against the test CA) to ClickHouse 26.x:
// every dataset's table is created there as the sink writes it (codecs,
// LowCardinality, TTL, deduplication window) and holds exactly the
// simulator's rows under FINAL; a restarted sink resumes from it.
func TestExporterOn26(t *testing.T) {
	srv := testenv.ChDB(t)
	for _, tc := range []struct {
		name  string
		dsn   func(string) string
		tls   clickhouse.TLSOptions
		check func(*world)
	}{
		{name: "http", dsn: srv.DSN},
		{name: "https", dsn: srv.HTTPSDSN, tls: clickhouse.TLSOptions{CAFile: srv.CAFile()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorldAt(t, tc.dsn, 25)
			w.tls, w.retention = tc.tls, 90*24*time.Hour
			reg := prometheus.NewRegistry()
			sink := w.newSink(reg)
			r := w.startScheduler(sink)
			for range 3 {
				w.cycle(r)
			}
			flush(t, sink)
			n := w.compare(srv.Conn(t), t0.Add(-30*time.Minute), metricsapi.FiveMinutes.Truncate(w.clock.Now()))
			if d := testutilSum(t, reg, "edgepipe_clickhouse_dropped_rows_total"); d != 0 {
				t.Errorf("%v rows dropped", d)
			}
			create := srv.QueryString(t, "SELECT create_table_query FROM system.tables WHERE database = '"+w.db+"' AND name = 'edge_usage_by_country'")
			for _, want := range []string{"CODEC(T64, ZSTD(1))", "LowCardinality(String)", "TTL time + toIntervalSecond(7776000)", "non_replicated_deduplication_window = 1000"} {
				if !strings.Contains(create, want) {
					t.Errorf("edge_usage_by_country lacks %q:\n%s", want, create)
				}
			}
			// A restart resumes from the newest stored bucket, over HTTP(S) too.
			r.stop()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := sink.Close(ctx); err != nil {
				t.Fatal(err)
			}
			sink2 := w.newSink(nil)
			dss := w.datasets()
			points, err := sink2.Resume(ctx, &dss[0], metricsapi.FiveMinutes, w.envs)
			if err != nil || len(points) != len(w.envs) {
				t.Fatalf("Resume: %d points, %v", len(points), err)
			}
			t.Logf("%d rows exact under FINAL over %s; resume points for %d environments", n, tc.name, len(points))
		})
	}
}

// warnings is a slog handler that keeps every record at WARN and above:
// the schema manager logs, not returns, a refused ALTER of a table's TTL
// or settings.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	w.msgs = append(w.msgs, msg)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

// replicatedEngine matches the Replicated engine of a cluster's local
// table with its ZooKeeper path and replica arguments.
var replicatedEngine = regexp.MustCompile(`Replicated(\w+MergeTree)\('[^']*', '\{replica\}'(, )?`)

// TestStatementsOn26 runs every statement the schema manager issues for
// the exporter's tables on ClickHouse 26.x and fails on any the server
// refuses:
//   - single server, as written: CREATE DATABASE and CREATE TABLE of every
//     dataset (from a narrower column set), ALTER TABLE … ADD COLUMN with
//     MODIFY ORDER BY for a new dimension, ALTER … MODIFY TTL (a changed
//     retention, with materialize_ttl_after_modify = 0: no mutation
//     rewrites the table) and ALTER … MODIFY SETTING (a table made
//     before the deduplication window);
//   - the inventory's tables, environments and tls_certificates, the
//     receiver's access_logs with its per-minute rollup (table and
//     materialized view) and its reconciliation's log_completeness and
//     log_delivery_progress, created and ensured again;
//   - cluster form, of every table of both programs (the datasets,
//     access_logs and its rollup, log_completeness,
//     log_delivery_progress, the backfill's progress table, environments
//     and tls_certificates): every statement of
//     CreateStatements with --clickhouse.cluster parsed by 26.x as written
//     (EXPLAIN AST); the local table run on the plain engine (chDB cannot
//     replicate: no ZooKeeper, and ON CLUSTER needs one), the Distributed
//     table and the view (from access_logs_local into
//     access_logs_1m_local) run as written without ON CLUSTER over
//     testenv.ChDBCluster.
func TestStatementsOn26(t *testing.T) {
	srv := testenv.ChDB(t)
	w := newWorldAt(t, srv.DSN, 5)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logged := &warnings{}
	open := func() (*clickhouse.DB, *clickhouse.Schema) {
		db, err := clickhouse.Open(ctx, w.dsn, clickhouse.WithLogger(slog.New(logged)))
		if err != nil {
			t.Fatal(err)
		}
		s := clickhouse.NewSchema(db, slog.New(logged))
		t.Cleanup(func() { _ = s.Close(); _ = db.Close() })
		return db, s
	}
	db, schema := open()
	v := db.Version()
	if !v.AtLeast(26, 1) {
		t.Fatalf("chDB is ClickHouse %s, want 26.x", v)
	}
	const retention, retention2 = 90 * 24 * time.Hour, 120 * 24 * time.Hour
	for _, ds := range w.datasets() {
		labels, metrics := ds.LabelNames(), ds.MetricNames()
		if len(labels) == 0 {
			t.Fatalf("%s has no dimension to add", ds.Name)
		}
		if len(metrics) > 1 {
			metrics = metrics[:len(metrics)-1]
		}
		narrow := metrictables.TableSpec(ds.Name, metrictables.MetricsColumns(&ds, labels[:len(labels)-1], metrics), v, retention)
		full := metrictables.TableSpec(ds.Name, metrictables.MetricsColumns(&ds, nil, nil), v, retention)
		if _, err := schema.Ensure(ctx, narrow); err != nil {
			t.Fatalf("%s: create: %v", ds.Name, err)
		}
		st, err := schema.Ensure(ctx, full)
		if err != nil {
			t.Fatalf("%s: add columns: %v", ds.Name, err)
		}
		if len(st.Columns) != len(full.Columns) || !strings.Contains(st.SortingKey, labels[len(labels)-1]) {
			t.Errorf("%s after ADD COLUMN: %d columns (want %d), sorting key %q (want it to end with %s)", ds.Name, len(st.Columns), len(full.Columns), st.SortingKey, labels[len(labels)-1])
		}
	}
	// A restart with another retention: MODIFY TTL, nothing rewritten.
	_, schema2 := open()
	for _, ds := range w.datasets() {
		full := metrictables.TableSpec(ds.Name, metrictables.MetricsColumns(&ds, nil, nil), v, retention2)
		if _, err := schema2.Ensure(ctx, full); err != nil {
			t.Fatal(err)
		}
		create := srv.QueryString(t, "SELECT create_table_query FROM system.tables WHERE database = '"+w.db+"' AND name = '"+ds.Name+"'")
		if !strings.Contains(create, fmt.Sprintf("toIntervalSecond(%d)", int64(retention2/time.Second))) {
			t.Errorf("%s: retention not changed:\n%s", ds.Name, create)
		}
	}
	if n := srv.QueryUint64(t, "SELECT count() FROM system.mutations WHERE database = '"+w.db+"'"); n != 0 {
		t.Errorf("%d mutations after the retention changed: MODIFY TTL materialized the TTL (rewriting every part)", n)
	}
	// The inventory's tables (environments, tls_certificates), as the
	// exporter writes them and the receiver makes environments, and the
	// receiver's reconciliation tables: created, then ensured again by a
	// restarted program.
	for _, spec := range []*clickhouse.Table{inventorytables.EnvironmentsTable(), inventorytables.CertificatesTable(), reconcile.Completeness(), reconcile.Progress()} {
		for _, s := range []*clickhouse.Schema{schema, schema2} {
			if _, err := s.Ensure(ctx, spec); err != nil {
				t.Fatalf("%s: %v", spec.Name, err)
			}
		}
		if create := srv.QueryString(t, "SELECT create_table_query FROM system.tables WHERE database = '"+w.db+"' AND name = '"+spec.Name+"'"); !strings.Contains(create, "non_replicated_deduplication_window = 1000") {
			t.Errorf("%s has no deduplication window:\n%s", spec.Name, create)
		}
	}
	// access_logs and its per-minute rollup (table and view), as the
	// receiver makes them, then ensured again by a restarted receiver.
	accessLogs, err := logtable.TableSpec(v, accesslog.Fields(), nil, retention)
	if err != nil {
		t.Fatal(err)
	}
	rollup, err := logtable.RollupSpec(v, accessLogs, retention)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*clickhouse.Schema{schema, schema2} {
		for _, spec := range []*clickhouse.Table{accessLogs, rollup} {
			if _, err := s.Ensure(ctx, spec); err != nil {
				t.Fatalf("%s: %v", spec.Name, err)
			}
		}
	}
	if deps := srv.QueryString(t, "SELECT toString(dependencies_table) FROM system.tables WHERE database = '"+w.db+"' AND name = 'access_logs'"); deps != "['"+logtable.RollupView+"']" {
		t.Errorf("access_logs feeds %s, want the rollup's view", deps)
	}
	if create := srv.QueryString(t, "SELECT create_table_query FROM system.tables WHERE database = '"+w.db+"' AND name = '"+logtable.RollupTable+"'"); !strings.Contains(create, "non_replicated_deduplication_window = 1000") {
		t.Errorf("%s has no deduplication window:\n%s", logtable.RollupTable, create)
	}
	// A table made before the deduplication window gets it.
	ds := w.datasets()[0]
	old := metrictables.TableSpec("made_by_21_3", metrictables.MetricsColumns(&ds, nil, nil), clickhouse.Version{Major: 21, Minor: 3}, 0)
	for _, s := range clickhouse.CreateStatements(w.db, "", clickhouse.Version{Major: 21, Minor: 3}, old) {
		srv.Exec(t, s)
	}
	if _, err := schema2.Ensure(ctx, metrictables.TableSpec("made_by_21_3", metrictables.MetricsColumns(&ds, nil, nil), v, 0)); err != nil {
		t.Fatal(err)
	}
	if create := srv.QueryString(t, "SELECT create_table_query FROM system.tables WHERE database = '"+w.db+"' AND name = 'made_by_21_3'"); !strings.Contains(create, "non_replicated_deduplication_window = 1000") {
		t.Errorf("a table made before the deduplication window did not get it:\n%s", create)
	}

	// Cluster forms, of every table of both programs.
	clusterDB := w.db + "_cluster"
	var specs []*clickhouse.Table
	for _, ds := range w.datasets() {
		specs = append(specs, metrictables.TableSpec(ds.Name, metrictables.MetricsColumns(&ds, nil, nil), v, retention))
	}
	specs = append(specs, accessLogs, rollup, reconcile.Completeness(), reconcile.Progress(), backfill.ProgressTableSpec(),
		inventorytables.EnvironmentsTable(), inventorytables.CertificatesTable())
	for _, spec := range specs {
		for i, stmt := range clickhouse.CreateStatements(clusterDB, testenv.ChDBCluster, v, spec) {
			srv.Exec(t, "EXPLAIN AST "+stmt)
			plain := strings.Replace(stmt, " ON CLUSTER `"+testenv.ChDBCluster+"`", "", 1)
			if i == 1 {
				if !replicatedEngine.MatchString(plain) {
					t.Fatalf("%s: no Replicated engine in the cluster form:\n%s", spec.Name, plain)
				}
				plain = replicatedEngine.ReplaceAllString(plain, "$1(")
			}
			srv.Exec(t, plain)
		}
	}
	if n := srv.QueryUint64(t, "SELECT count() FROM system.tables WHERE database = '"+clusterDB+"' AND engine = 'Distributed'"); n != uint64(len(specs)) {
		t.Errorf("%d Distributed tables, want %d", n, len(specs))
	}
	logged.mu.Lock()
	defer logged.mu.Unlock()
	for _, m := range logged.msgs {
		t.Errorf("logged: %s", m)
	}
}

// TestClickHouseKilledMidRun26: ClickHouse 26.x killed with SIGKILL while
// the sink writes and polls go on, then started again: every bucket is
// exact under FINAL, and no row is stored twice (a revision is another row,
// with another version; a retried INSERT the server had stored before it
// died would be the same row again). Merges are stopped so that they
// cannot collapse a copy before the count.
func TestClickHouseKilledMidRun26(t *testing.T) {
	srv := testenv.ChDB(t)
	w := newWorldAt(t, srv.DSN, 25)
	reg := prometheus.NewRegistry()
	sink := w.newSink(reg)
	r := w.startScheduler(sink)
	w.cycle(r)
	flush(t, sink)
	stopMerges := func() {
		for _, ds := range w.datasets() {
			srv.Exec(t, "SYSTEM STOP MERGES `"+w.db+"`.`"+ds.Name+"`")
		}
	}
	stopMerges()
	for _, delay := range []time.Duration{0, 20 * time.Millisecond, 80 * time.Millisecond} {
		go func() {
			time.Sleep(delay)
			srv.Kill()
		}()
		w.cycle(r) // the sink writes while the server dies
		time.Sleep(300 * time.Millisecond)
		srv.Start()
		stopMerges()
		flush(t, sink)
	}
	w.compare(srv.Conn(t), t0.Add(-30*time.Minute), metricsapi.FiveMinutes.Truncate(w.clock.Now()))
	var stored uint64
	for _, ds := range w.datasets() {
		table := "`" + w.db + "`.`" + ds.Name + "`"
		stored += srv.QueryUint64(t, "SELECT count() FROM "+table)
		if dup := srv.QueryUint64(t, "SELECT toUInt64(count() - uniqExact(*)) FROM "+table); dup != 0 {
			t.Errorf("%s: %d rows stored twice", ds.Name, dup)
		}
	}
	if d := testutilSum(t, reg, "edgepipe_clickhouse_dropped_rows_total"); d != 0 {
		t.Errorf("%v rows dropped", d)
	}
	t.Logf("%d rows stored, %v counted as written, %v insert errors", stored,
		testutilSum(t, reg, "edgepipe_clickhouse_rows_written_total"), testutilSum(t, reg, "edgepipe_clickhouse_insert_errors_total"))
}
