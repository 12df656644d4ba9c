package metrictables_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/inventory"
	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorysink"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/inventorytables"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// newClusterWorld is newWorld with the sink writing to a cluster through
// its first node.
func newClusterWorld(t *testing.T, c *testenv.Cluster, envs int) *world {
	t.Helper()
	w := newWorldOn(t, c.Nodes[0].ClickHouseServer, envs)
	w.cluster = c.Name
	return w
}

// datasets lists the simulator's datasets.
func (w *world) datasets() []metricsapi.Dataset {
	w.t.Helper()
	dss, err := w.api.Datasets(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	return dss
}

// query returns the rows of a query with one String column, on node n.
func query(t *testing.T, n *testenv.ClusterNode, q string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := n.Conn(t).Query(ctx, q)
	if err != nil {
		t.Fatalf("%s on %s: %v", q, n.ReplicaName, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// checkReplicasAndShards checks every dataset's local tables: the replicas
// of each shard hold identical rows (count and a hash over every column,
// after SYSTEM SYNC REPLICA), and no environment has rows on two shards.
func (w *world) checkReplicasAndShards(c *testenv.Cluster) {
	w.t.Helper()
	for _, ds := range w.datasets() {
		local := fmt.Sprintf("`%s`.`%s_local`", w.db, ds.Name)
		cols := query(w.t, c.Nodes[0], fmt.Sprintf("SELECT name FROM system.columns WHERE database = '%s' AND table = '%s_local'", w.db, ds.Name))
		for i, col := range cols {
			cols[i] = "`" + col + "`"
		}
		digest := fmt.Sprintf("SELECT concat(toString(count()), '/', toString(sum(cityHash64(%s)))) FROM %s", strings.Join(cols, ", "), local)
		envsOf := map[int][]string{}
		for _, shard := range []int{1, 2} {
			var first string
			for _, n := range c.Shard(shard) {
				n.Exec(w.t, "SYSTEM SYNC REPLICA "+local)
				d := query(w.t, n, digest)[0]
				if first == "" {
					first = d
				} else if d != first {
					w.t.Errorf("%s: replica %s holds %s (rows/hash), replica %s %s", local, c.Shard(shard)[0].ReplicaName, first, n.ReplicaName, d)
				}
			}
			envsOf[shard] = query(w.t, c.Shard(shard)[0], "SELECT DISTINCT environment_id FROM "+local)
		}
		if len(envsOf[1]) == 0 || len(envsOf[2]) == 0 {
			w.t.Errorf("%s: environments per shard %d and %d: with %d environments both shards should have some", ds.Name, len(envsOf[1]), len(envsOf[2]), len(w.envs))
		}
		for _, e := range envsOf[1] {
			if slices.Contains(envsOf[2], e) {
				w.t.Errorf("%s: environment %s has rows on both shards", ds.Name, e)
			}
		}
	}
}

// syncReplicas waits until every replica has what its shard acknowledged
// (SYSTEM SYNC REPLICA on every node): a query through a Distributed table
// reads one replica of each shard, and a shard's other replicas copy an
// INSERT asynchronously.
func (w *world) syncReplicas(c *testenv.Cluster) {
	w.t.Helper()
	for _, ds := range w.datasets() {
		for _, n := range c.Nodes {
			n.Exec(w.t, fmt.Sprintf("SYSTEM SYNC REPLICA `%s`.`%s_local`", w.db, ds.Name))
		}
	}
}

// schemaOn returns, per dataset (and inventory table with w.inventory),
// the columns of its local and Distributed tables on node n ("" when
// missing), comma-separated.
func (w *world) schemaOn(n *testenv.ClusterNode) map[string]string {
	w.t.Helper()
	out := map[string]string{}
	var names []string
	for _, ds := range w.datasets() {
		names = append(names, ds.Name)
	}
	if w.inventory {
		names = append(names, inventorytables.TableEnvironments, inventorytables.TableTLSCertificates)
	}
	for _, name := range names {
		for _, table := range []string{name + "_local", name} {
			out[table] = strings.Join(query(w.t, n, fmt.Sprintf(
				"SELECT name FROM system.columns WHERE database = '%s' AND table = '%s' ORDER BY name", w.db, table)), ",")
		}
	}
	return out
}

// checkSchemaEverywhere fails unless every node has every dataset's local
// and Distributed tables with the same columns as the first node, and
// returns the first node's.
func (w *world) checkSchemaEverywhere(c *testenv.Cluster) map[string]string {
	w.t.Helper()
	want := w.schemaOn(c.Nodes[0])
	for table, cols := range want {
		if cols == "" {
			w.t.Errorf("no table %s on %s", table, c.Nodes[0].ReplicaName)
		}
	}
	for _, n := range c.Nodes[1:] {
		got := w.schemaOn(n)
		for table, cols := range want {
			if got[table] != cols {
				w.t.Errorf("%s on %s has columns [%s], on %s [%s]", table, n.ReplicaName, got[table], c.Nodes[0].ReplicaName, cols)
			}
		}
	}
	return want
}

// completeOn reports whether every node of c has every dataset's local
// and Distributed tables with all the columns the first node has.
func (w *world) completeOn(c *testenv.Cluster) bool {
	w.t.Helper()
	want := w.schemaOn(c.Nodes[0])
	for _, n := range c.Nodes {
		got := w.schemaOn(n)
		for table, cols := range want {
			if cols == "" || got[table] != cols {
				return false
			}
		}
	}
	return true
}

// TestExporterOnCluster runs the exporter's scheduler and ClickHouse sink
// against a real 2-shard × 2-replica ClickHouse 18.16 cluster with
// ZooKeeper (--clickhouse.cluster). The subtests share the cluster, each
// with a database of its own, one after the other (one stops a node).
func TestExporterOnCluster(t *testing.T) {
	c := testenv.ClickHouseCluster(t, testenv.ClusterOptions{Shards: 2, Replicas: 2})

	// From an empty cluster: every dataset exact under FINAL through the
	// Distributed table, replicas identical, shards disjoint by
	// environment, nothing dropped.
	t.Run("empty cluster", func(t *testing.T) {
		w := newClusterWorld(t, c, 25)
		reg := prometheus.NewRegistry()
		sink := w.newSink(reg)
		r := w.startScheduler(sink)
		for range 3 {
			w.cycle(r)
		}
		flush(t, sink)
		w.syncReplicas(c)
		n := w.compare(w.ch.Conn(t), t0.Add(-30*time.Minute), metricsapi.FiveMinutes.Truncate(w.clock.Now()))
		w.checkSchemaEverywhere(c)
		w.checkReplicasAndShards(c)
		if d := testutilSum(t, reg, "edgepipe_clickhouse_dropped_rows_total"); d != 0 {
			t.Errorf("%v rows dropped", d)
		}
		t.Logf("%d rows exact under FINAL through the Distributed tables", n)
	})

	// One replica down (kill -9) when the exporter starts, back 30 s later:
	// the schema, the inventory's tables included, is completed on it
	// within two recheck intervals without a single write (a table is
	// written only when its data changes),
	// edgepipe_clickhouse_incomplete_nodes says so meanwhile, nothing is
	// dropped, FINAL is exact and the replica catches up.
	t.Run("replica down at start", func(t *testing.T) {
		down := c.Node(2, 2)
		down.Kill()
		w := newClusterWorld(t, c, 25)
		w.inventory = true
		reg := prometheus.NewRegistry()
		sink := w.newSink(reg)
		killedAt := time.Now()
		inv := w.newInventorySink(sink, reg)
		r := w.startScheduler(sink)
		w.cycle(r)
		flush(t, sink)
		want := len(w.datasets()) + 2 // and environments, tls_certificates
		waitUntil(t, 30*time.Second, func() bool {
			return testutilSum(t, reg, "edgepipe_clickhouse_inventory_rows_written_total") == float64(len(w.envs)+1)
		})
		if n := testutilSum(t, reg, "edgepipe_clickhouse_incomplete_nodes"); n != float64(want) {
			t.Errorf("edgepipe_clickhouse_incomplete_nodes sums to %v with one node down, want one per dataset and inventory table (%d)", n, want)
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = inv.Close(ctx)
		}()
		for time.Since(killedAt) < 30*time.Second {
			time.Sleep(time.Second)
		}
		down.Start()
		backAt := time.Now()
		if schema := w.schemaOn(down); schema[w.datasets()[0].Name] != "" {
			t.Logf("the node had its tables as soon as it answered (a recheck came at once): %v", schema)
		}
		// No poll, no write: the sink's schema recheck alone completes it.
		limit := 2*clickhouse.RecheckInterval + 5*time.Second
		for !w.completeOn(c) {
			if time.Since(backAt) > limit {
				t.Fatalf("schema on %s still incomplete %s after it came back: %v", down.ReplicaName, limit, w.schemaOn(down))
			}
			time.Sleep(time.Second)
		}
		t.Logf("every table on all four nodes %s after the replica came back", time.Since(backAt).Round(time.Second))
		deadline := time.Now().Add(5 * time.Second)
		for testutilSum(t, reg, "edgepipe_clickhouse_incomplete_nodes") != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("edgepipe_clickhouse_incomplete_nodes still %v with every table on every node", testutilSum(t, reg, "edgepipe_clickhouse_incomplete_nodes"))
			}
			time.Sleep(200 * time.Millisecond)
		}
		w.cycle(r)
		flush(t, sink)
		w.syncReplicas(c)
		w.compare(w.ch.Conn(t), t0.Add(-30*time.Minute), metricsapi.FiveMinutes.Truncate(w.clock.Now()))
		w.checkSchemaEverywhere(c)
		w.checkReplicasAndShards(c)
		if d := testutilSum(t, reg, "edgepipe_clickhouse_dropped_rows_total"); d != 0 {
			t.Errorf("%v rows dropped", d)
		}
	})

	// A metric column dropped on the cluster (every local table and every
	// Distributed table), exporter restarted: the column is back on every
	// node and the rows written since are exact under FINAL.
	t.Run("dropped column", func(t *testing.T) {
		w := newClusterWorld(t, c, 25)
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
		before := w.checkSchemaEverywhere(c)

		const dataset, metric = "edge_usage_by_country", "requests_edge_total"
		c.Nodes[0].Exec(t, fmt.Sprintf("ALTER TABLE `%s`.`%s_local` ON CLUSTER %s DROP COLUMN %s", w.db, dataset, c.Name, metric))
		for _, n := range c.Nodes {
			n.Exec(t, fmt.Sprintf("ALTER TABLE `%s`.`%s` DROP COLUMN %s", w.db, dataset, metric))
		}
		if cols := w.schemaOn(c.Node(2, 2))[dataset]; strings.Contains(cols, metric) {
			t.Fatalf("%s still has %s after DROP COLUMN: %s", dataset, metric, cols)
		}

		restartedAt := metricsapi.FiveMinutes.Truncate(w.clock.Now())
		w.clock.Advance(5 * time.Minute)
		reg := prometheus.NewRegistry()
		sink2 := w.newSink(reg)
		r2 := w.startScheduler(sink2)
		w.cycle(r2)
		flush(t, sink2)
		after := w.checkSchemaEverywhere(c)
		if after[dataset] != before[dataset] || after[dataset+"_local"] != before[dataset+"_local"] {
			t.Errorf("columns after the restart %q / %q, before the drop %q / %q",
				after[dataset], after[dataset+"_local"], before[dataset], before[dataset+"_local"])
		}
		// The restarted scheduler re-polls its settle window (30 min): those
		// rows carry the metric again.
		w.syncReplicas(c)
		w.compare(w.ch.Conn(t), restartedAt.Add(-25*time.Minute), metricsapi.FiveMinutes.Truncate(w.clock.Now()))
		if d := testutilSum(t, reg, "edgepipe_clickhouse_dropped_rows_total"); d != 0 {
			t.Errorf("%v rows dropped", d)
		}
	})
}

// newInventorySink starts the inventory's sink on the metrics sink's
// connection, as the exporter does, and publishes a name for every
// environment and a certificate of the first.
func (w *world) newInventorySink(metrics *metrictables.Sink, reg prometheus.Registerer) *inventorysink.Sink {
	w.t.Helper()
	s, err := inventorysink.New(inventorysink.Config{Schemas: metrics, Logger: w.log, Registerer: reg, RetryMax: 300 * time.Millisecond})
	if err != nil {
		w.t.Fatal(err)
	}
	s.Start()
	envs := make([]inventory.Environment, len(w.envs))
	for i, e := range w.envs {
		envs[i] = inventory.Environment{ID: e, Name: fmt.Sprintf("env-%d", i), PropertyID: "p1", Property: "shop", OrganizationID: "o1"}
	}
	now := w.clock.Now()
	s.PublishEnvironments(now, envs)
	s.PublishCertificates(now, w.envs[0], []inventory.Certificate{{ID: "c1", EnvironmentID: w.envs[0], CommonName: "www.example.com",
		Status: "active", Expiration: now.Add(30 * 24 * time.Hour)}}, nil)
	return s
}

// waitUntil waits for cond, failing the test after limit.
func waitUntil(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", limit)
		}
	}
}
