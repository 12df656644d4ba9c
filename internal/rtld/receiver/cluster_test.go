package receiver_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/edgepipe/edgepipe/internal/platformsim"
	chsink "github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestReceiverOnCluster runs the receiver binary with --clickhouse.cluster
// against a real 2-shard × 2-replica ClickHouse 18.16 cluster with
// ZooKeeper. The subtests share the cluster, each with a database of its
// own, one after the other (one stops a node).
func TestReceiverOnCluster(t *testing.T) {
	c := testenv.ClickHouseCluster(t, testenv.ClusterOptions{Shards: 2, Replicas: 2})
	t.Run("exactly once through crash", func(t *testing.T) { clusterExactlyOnceThroughCrash(t, c) })
	t.Run("replica down at start", func(t *testing.T) { clusterReplicaDownAtStart(t, c) })
}

// clusterExactlyOnceThroughCrash: 2,000 records delivered by the simulator over
// HTTPS (some acknowledgements lost, so some batches arrive twice), the
// receiver killed with SIGKILL in the middle, land exactly once: count()
// under FINAL and uniqExact(uuid) through the Distributed table are 2,000,
// read through another node than the receiver writes to; both shards hold
// records, and each shard's replicas hold the same rows. The receiver also
// makes the environments table the Access logs dashboard joins, on every
// node, and the per-minute rollup (clusterRollup).
func clusterExactlyOnceThroughCrash(t *testing.T, c *testenv.Cluster) {
	const total = 2_000
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const db = "logs"
	cert := newTestCert(t)
	sim, apiURL := startSimulator(t, cert, platformsim.Config{
		Seed: 5, Properties: 1, Environments: 1,
		Delivery: platformsim.DeliveryConfig{
			BatchSize: 50, AgentsPerEnvironment: 3, RetryInterval: 100 * time.Millisecond,
			RequestTimeout: 10 * time.Second,
			Faults:         platformsim.DeliveryFaults{DropAckPercent: 10},
		},
	})
	env := sim.EnvironmentIDs()[0]
	p, _ := startSimulatedReceiver(t, cert, apiURL, []string{env},
		"--clickhouse.dsn="+c.Node(1, 1).DSN(db), "--clickhouse.cluster="+c.Name,
		"--spool.dir="+filepath.Join(t.TempDir(), "spool"),
	)
	profile := waitProfile(ctx, t, apiURL, env)

	reader := c.Node(2, 1).Conn(t) // not the node the receiver writes to
	counts := func() (final, uuids uint64, err error) {
		err = reader.QueryRow(ctx, fmt.Sprintf("SELECT count(), uniqExact(uuid) FROM %s.access_logs FINAL", db)).Scan(&final, &uuids)
		return final, uuids, err
	}

	// The platform sends 50 records every 100ms; the receiver is killed
	// once ClickHouse holds some of them, while more keep coming.
	generated := make(chan error, 1)
	go func() {
		for range total / 50 {
			if err := sim.DeliverRecords(ctx, profile, 50); err != nil {
				generated <- err
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		generated <- nil
	}()
	var atKill uint64
	var err error
	waitFor(t, "records in ClickHouse before the crash", 60*time.Second, func() bool {
		atKill, _, err = counts()
		return err == nil && atKill >= 200
	})
	p.kill9()
	t.Logf("receiver killed with SIGKILL; %d records in ClickHouse under FINAL; simulator %+v", atKill, sim.Delivered())
	time.Sleep(300 * time.Millisecond) // the platform's retries fail meanwhile
	p.start()
	if err := <-generated; err != nil {
		t.Fatal(err)
	}
	if err := sim.WaitDelivered(ctx); err != nil {
		t.Fatal(err)
	}
	if st := sim.Delivered(); st.RecordsGenerated != total || st.RecordsDropped != 0 {
		t.Fatalf("simulator generated %d and dropped %d records", st.RecordsGenerated, st.RecordsDropped)
	}

	var final, uuids uint64
	waitFor(t, "every record in ClickHouse", 90*time.Second, func() bool {
		final, uuids, err = counts()
		return err == nil && final >= total
	})
	var raw uint64
	if err := reader.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM %s.access_logs", db)).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	t.Logf("through the Distributed table on %s: %d rows, %d under FINAL, %d distinct uuids (%d under FINAL at the kill)",
		c.Node(2, 1).ReplicaName, raw, final, uuids, atKill)
	if final != total || uuids != total {
		t.Fatalf("FINAL through the Distributed table: %d rows and %d distinct uuids, want %d of each", final, uuids, total)
	}
	if atKill >= total {
		t.Errorf("every record was in ClickHouse when the receiver was killed: the crash tested nothing")
	}

	// Sharded by record identity: both shards hold records; a shard's
	// replicas hold the same rows.
	for _, shard := range []int{1, 2} {
		var first uint64
		for i, n := range c.Shard(shard) {
			n.Exec(t, "SYSTEM SYNC REPLICA "+db+".access_logs_local")
			got := n.QueryUint64(t, "SELECT count() FROM "+db+".access_logs_local")
			if i == 0 {
				first = got
				if got == 0 {
					t.Errorf("shard %d holds no records", shard)
				}
			} else if got != first {
				t.Errorf("shard %d: %s holds %d rows, %s %d", shard, c.Shard(shard)[0].ReplicaName, first, n.ReplicaName, got)
			}
		}
	}

	// The environments table the Access logs dashboard joins for names,
	// made by the receiver alone in its cluster form on every node, empty:
	// the dashboard's join names the environment by its ID.
	for _, n := range c.Nodes {
		var engines string
		if err := n.Conn(t).QueryRow(ctx, "SELECT arrayStringConcat(groupArray(concat(name, ' ', engine)), ', ') FROM (SELECT name, engine FROM system.tables WHERE database = '"+
			db+"' AND name LIKE 'environments%' ORDER BY name)").Scan(&engines); err != nil {
			t.Fatal(err)
		}
		if engines != "environments Distributed, environments_local ReplicatedReplacingMergeTree" {
			t.Errorf("%s: environments tables %q", n.ReplicaName, engines)
		}
	}
	var name string
	if err := reader.QueryRow(ctx, fmt.Sprintf("SELECT if(env_name = '', environment_id, env_name) FROM (SELECT DISTINCT environment_id FROM %[1]s.access_logs) AS logs "+
		"ANY LEFT JOIN (SELECT environment_id, environment AS env_name FROM %[1]s.environments FINAL) AS names USING environment_id", db)).Scan(&name); err != nil || name != env {
		t.Errorf("environment named %q (%v) through the receiver's environments table, want its ID %s", name, err, env)
	}
	clusterRollup(ctx, t, c, db, total, uint64(sim.Delivered().Retries)*50)
}

// clusterRollup checks the per-minute rollup on the cluster c after the
// receiver wrote total records to database db: its tables and view on
// every node, fed by access_logs_local; key by key through the Distributed
// tables, the rollup counts exactly what access_logs holds under FINAL,
// although the platform resent batches (resent records), some of them to
// the restarted receiver that the killed one had spooled but not
// acknowledged (ingest stores each batch once, so no copy reaches an
// INSERT); an INSERT repeated with the same rows (a retry after a lost
// acknowledgement) is dropped by the Replicated access_logs_local and not
// counted by the view, while the same records in another INSERT are; the
// documented rebuild, in its cluster form, makes the rollup equal to FINAL
// key by key.
func clusterRollup(ctx context.Context, t *testing.T, c *testenv.Cluster, db string, total, resent uint64) {
	t.Helper()
	for _, n := range c.Nodes {
		var engines, feeds string
		if err := n.Conn(t).QueryRow(ctx, "SELECT arrayStringConcat(groupArray(concat(name, ' ', engine)), ', ') FROM (SELECT name, engine FROM system.tables WHERE database = '"+
			db+"' AND name LIKE 'access_logs_1m%' ORDER BY name)").Scan(&engines); err != nil {
			t.Fatal(err)
		}
		if err := n.Conn(t).QueryRow(ctx, "SELECT arrayStringConcat(dependencies_table, ', ') FROM system.tables WHERE database = '"+db+"' AND name = 'access_logs_local'").Scan(&feeds); err != nil {
			t.Fatal(err)
		}
		if engines != "access_logs_1m Distributed, access_logs_1m_local ReplicatedAggregatingMergeTree, access_logs_1m_mv MaterializedView" || feeds != "access_logs_1m_mv" {
			t.Errorf("%s: rollup tables %q, access_logs_local feeds %q", n.ReplicaName, engines, feeds)
		}
	}
	conn := c.Node(1, 1).Conn(t)
	sync := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_distributed_sync": 1}))
	// read returns, through the Distributed tables, the rollup's requests,
	// access_logs' records under FINAL, and the keys where the rollup holds
	// fewer, and other numbers, than FINAL.
	type counts struct{ rollup, final, fewer, other uint64 }
	read := func() counts {
		t.Helper()
		for _, n := range c.Nodes { // a read through a Distributed table sees one replica of each shard
			n.Exec(t, "SYSTEM SYNC REPLICA "+db+".access_logs_local")
			n.Exec(t, "SYSTEM SYNC REPLICA "+db+".access_logs_1m_local")
		}
		var got counts
		if err := c.Node(2, 2).Conn(t).QueryRow(ctx, fmt.Sprintf(`SELECT toUInt64(sum(r)), toUInt64(sum(f)), toUInt64(countIf(r < f)), toUInt64(countIf(r != f)) FROM (
				SELECT k, sum(r) AS r, sum(f) AS f FROM (
					SELECT concat(environment_id, toString(minute), toString(status_code), cache_status, pop) AS k,
						toUInt64(countMerge(requests_state)) AS r, toUInt64(0) AS f
					FROM %[1]s.access_logs_1m GROUP BY k
					UNION ALL
					SELECT concat(environment_id, toString(toStartOfMinute(timestamp)), toString(status_code), cache_status, pop) AS k,
						toUInt64(0) AS r, toUInt64(count()) AS f
					FROM %[1]s.access_logs FINAL GROUP BY k)
				GROUP BY k)`, db)).Scan(&got.rollup, &got.final, &got.fewer, &got.other); err != nil {
			t.Fatal(err)
		}
		return got
	}
	run := read()
	t.Logf("after the receiver's run the rollup counts %d records, access_logs FINAL %d (the platform resent %d records)", run.rollup, run.final, resent)
	if run.other != 0 || run.final != total || run.rollup != total {
		t.Fatalf("after the receiver's run: %+v; want %d under FINAL and in the rollup, key by key (the platform resent %d records)", run, total, resent)
	}

	// 100 new records, inserted twice with the same blocks.
	insert := fmt.Sprintf(`INSERT INTO %s.access_logs (environment_id, agent_id, datestamp, seq_num, record_key, record_index, timestamp, uuid, status_code, cache_status, pop, bytes_out, total_time, insert_version)
		SELECT 'env-retry', 'agent-1', '20261127', toInt64(number), '', toUInt32(0), toDateTime('2026-11-27 10:00:00') + number * 7, toString(number),
			200 + (number %% 3) * 100, 'TCP_HIT', 'fra', number, number / 100, toUInt64(1)
		FROM system.numbers LIMIT 100`, db)
	for range 2 {
		if err := conn.Exec(sync, insert); err != nil {
			t.Fatal(err)
		}
	}
	if got := read(); got.rollup != run.rollup+100 || got.final != total+100 {
		t.Fatalf("after an INSERT repeated: %+v; want the rollup %d (100 more) and %d under FINAL", got, run.rollup+100, total+100)
	}
	// The same records in another INSERT (other blocks): counted again.
	if err := conn.Exec(sync, strings.Replace(insert, "toUInt64(1)", "toUInt64(2)", 1)); err != nil {
		t.Fatal(err)
	}
	if got := read(); got.rollup != run.rollup+200 || got.final != total+100 {
		t.Fatalf("after 100 records inserted again in another INSERT: %+v; want the rollup %d and %d under FINAL", got, run.rollup+200, total+100)
	}

	stmts := testenv.DocSQL(t, "docs/clickhouse.md", "## access_logs_1m: the per-minute rollup", "DELETE WHERE")
	for i, s := range stmts {
		s = strings.ReplaceAll(s, "cdn.", db+".")
		s = strings.Replace(s, "access_logs_1m DELETE", "access_logs_1m_local ON CLUSTER "+c.Name+" DELETE", 1)
		stmts[i] = strings.ReplaceAll(s, "2026-11-27 12:00:00", "2100-01-01 00:00:00")
	}
	stmts = append([]string{"SET insert_distributed_sync = 1"}, stmts...)
	if err := testenv.ExecSession(ctx, conn, stmts); err != nil {
		t.Fatalf("the documented rebuild on the cluster: %v", err)
	}
	for _, n := range c.Nodes {
		waitFor(t, "the rebuild's DELETE on "+n.ReplicaName, 60*time.Second, func() bool {
			return n.QueryUint64(t, "SELECT count() FROM system.mutations WHERE database = '"+db+"' AND is_done = 0") == 0
		})
	}
	if got := read(); got.other != 0 || got.rollup != total+100 || got.final != total+100 {
		t.Fatalf("after the documented rebuild: %+v; want the rollup equal to FINAL key by key, %d", got, total+100)
	}
}

// receiverTables are the tables and views the receiver keeps on every node
// of a cluster, by name, with their engines: access_logs and its
// per-minute rollup (tables and view), the environments table the Access
// logs dashboard joins, and the reconciliation's log_completeness and
// log_delivery_progress (ClickHouse counts).
var receiverTables = map[string]string{
	"access_logs": "Distributed", "access_logs_local": "ReplicatedReplacingMergeTree",
	"access_logs_1m": "Distributed", "access_logs_1m_local": "ReplicatedAggregatingMergeTree", "access_logs_1m_mv": "MaterializedView",
	"environments": "Distributed", "environments_local": "ReplicatedReplacingMergeTree",
	"log_completeness": "Distributed", "log_completeness_local": "ReplicatedReplacingMergeTree",
	"log_delivery_progress": "Distributed", "log_delivery_progress_local": "ReplicatedReplacingMergeTree",
}

// receiverTablesOn lists what node n lacks of receiverTables in database
// db (missing, another engine, or a rollup view access_logs_local does not
// feed); nil when it has everything.
func receiverTablesOn(ctx context.Context, t *testing.T, n *testenv.ClusterNode, db string) []string {
	t.Helper()
	rows, err := n.Conn(t).Query(ctx, "SELECT name, engine, arrayStringConcat(dependencies_table, ',') FROM system.tables WHERE database = '"+db+"'")
	if err != nil {
		return []string{err.Error()}
	}
	defer rows.Close()
	found := map[string]string{}
	var feeds string
	for rows.Next() {
		var name, engine, deps string
		if err := rows.Scan(&name, &engine, &deps); err != nil {
			t.Fatal(err)
		}
		found[name] = engine
		if name == "access_logs_local" {
			feeds = deps
		}
	}
	var lacks []string
	for _, name := range slices.Sorted(maps.Keys(receiverTables)) {
		if found[name] != receiverTables[name] {
			lacks = append(lacks, fmt.Sprintf("%s (%q)", name, found[name]))
		}
	}
	if feeds != "access_logs_1m_mv" {
		lacks = append(lacks, fmt.Sprintf("access_logs_local feeds %q", feeds))
	}
	return lacks
}

// clusterReplicaDownAtStart: one replica down (kill -9) when the receiver
// starts, with ClickHouse counts: the receiver makes its schema on the
// other three nodes (access_logs, the rollup and its view, environments,
// log_completeness, log_delivery_progress) and takes records,
// edgepipe_clickhouse_incomplete_nodes counts the missing node for each of
// its tables; once the replica is back, within two recheck intervals and
// without a restart, it has every table and view and the gauge is 0.
func clusterReplicaDownAtStart(t *testing.T, c *testenv.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const db = "logs_down"
	down := c.Node(2, 2)
	down.Kill()
	cert := newTestCert(t)
	sim, apiURL := startSimulator(t, cert, platformsim.Config{
		Seed: 6, Properties: 1, Environments: 1,
		Delivery: platformsim.DeliveryConfig{BatchSize: 50, AgentsPerEnvironment: 2, RetryInterval: 100 * time.Millisecond, RequestTimeout: 10 * time.Second},
	})
	env := sim.EnvironmentIDs()[0]
	_, base := startSimulatedReceiver(t, cert, apiURL, []string{env},
		"--clickhouse.dsn="+c.Node(1, 1).DSN(db), "--clickhouse.cluster="+c.Name, "--reconcile.counts=clickhouse",
		"--spool.dir="+filepath.Join(t.TempDir(), "spool"),
	)
	if err := sim.DeliverRecords(ctx, waitProfile(ctx, t, apiURL, env), 100); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cert.pool}}, Timeout: 10 * time.Second}
	// incomplete returns edgepipe_clickhouse_incomplete_nodes by table.
	incomplete := func() map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		for _, m := range parseText(t, scrapeText(t, client, base+"/metrics"))["edgepipe_clickhouse_incomplete_nodes"].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "table" {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
		return out
	}
	tables := []string{"access_logs", "access_logs_1m", "environments", "log_completeness", "log_delivery_progress"}
	// state says what is not yet as wanted while the node is down.
	state := func() []string {
		var out []string
		for _, n := range c.Nodes {
			if n == down {
				continue
			}
			if lacks := receiverTablesOn(ctx, t, n, db); lacks != nil {
				out = append(out, n.ReplicaName+" lacks "+strings.Join(lacks, ", "))
			}
		}
		inc := incomplete()
		for _, table := range tables {
			if inc[table] != 1 {
				out = append(out, fmt.Sprintf("edgepipe_clickhouse_incomplete_nodes{table=%q} is %v, want 1", table, inc[table]))
			}
		}
		if n := c.Node(1, 1).QueryUint64(t, "SELECT count() FROM "+db+".access_logs FINAL"); n != 100 {
			out = append(out, fmt.Sprintf("%d records under FINAL, want 100", n))
		}
		return out
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		wrong := state()
		if wrong == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with %s down, after 60 s:\n%s", down.ReplicaName, strings.Join(wrong, "\n"))
		}
	}
	down.Start()
	backAt := time.Now()
	limit := 2*chsink.RecheckInterval + 5*time.Second
	for lacks := receiverTablesOn(ctx, t, down, db); lacks != nil; lacks = receiverTablesOn(ctx, t, down, db) {
		if time.Since(backAt) > limit {
			t.Fatalf("%s still lacks %s %s after it came back", down.ReplicaName, strings.Join(lacks, ", "), limit)
		}
		time.Sleep(time.Second)
	}
	t.Logf("every table and view on all four nodes %s after the replica came back", time.Since(backAt).Round(time.Second))
	waitFor(t, "edgepipe_clickhouse_incomplete_nodes back to 0", 10*time.Second, func() bool {
		inc := incomplete()
		for _, table := range tables {
			if v, ok := inc[table]; !ok || v != 0 {
				return false
			}
		}
		return true
	})
	for _, n := range c.Nodes {
		if lacks := receiverTablesOn(ctx, t, n, db); lacks != nil {
			t.Errorf("%s lacks %s", n.ReplicaName, strings.Join(lacks, ", "))
		}
	}
}
