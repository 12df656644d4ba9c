package clickhouse

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

func testLogger() *slog.Logger {
	if os.Getenv("EDGEPIPE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// eventsTable is a small table of the shape the sinks use.
func eventsTable(cols ...string) *Table {
	t := &Table{
		Name: "events",
		Columns: []Column{
			{Name: "env", Type: "String"},
			{Name: "at", Type: "DateTime('UTC')"},
			{Name: "v", Type: "UInt64"},
		},
		Engine:        "ReplacingMergeTree",
		EngineArgs:    []string{"v"},
		PartitionBy:   "toDate(at)",
		OrderBy:       []string{"env", "at"},
		ShardingKey:   "cityHash64(env)",
		RetentionTime: "at",
	}
	for _, c := range cols {
		t.Columns = append(t.Columns, Column{Name: c, Type: "UInt64"})
	}
	return t
}

// nodeColumns returns the columns of database.table on node n (nil when the
// table is missing).
func nodeColumns(t *testing.T, n *testenv.ClusterNode, database, table string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rows, err := n.Conn(t).Query(ctx, "SELECT name FROM system.columns WHERE database = "+QuoteString(database)+" AND table = "+QuoteString(table)+" ORDER BY name")
	if err != nil {
		t.Fatalf("columns of %s.%s on %s: %v", database, table, n.ReplicaName, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// wantEverywhere fails unless every node has events_local and events with
// exactly cols.
func wantEverywhere(t *testing.T, c *testenv.Cluster, database string, cols ...string) {
	t.Helper()
	want := append([]string{"at", "env", "v"}, cols...)
	slices.Sort(want)
	for _, n := range c.Nodes {
		for _, table := range []string{"events_local", "events"} {
			if got := nodeColumns(t, n, database, table); !slices.Equal(got, want) {
				t.Errorf("%s.%s on %s has columns %v, want %v", database, table, n.ReplicaName, got, want)
			}
		}
	}
}

func openCluster(t *testing.T, c *testenv.Cluster, n *testenv.ClusterNode, database string) (*DB, *Schema) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := Open(ctx, n.DSN(database), WithCluster(c.Name), WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	s := NewSchema(db, testLogger())
	t.Cleanup(func() {
		_ = s.Close()
		_ = db.Close()
	})
	return db, s
}

func ensure(t *testing.T, s *Schema, tbl *Table) (*TableState, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	return s.Ensure(ctx, tbl)
}

// ensureComplete calls Ensure every second, as writers do every
// RecheckInterval, until it reports the table complete.
func ensureComplete(t *testing.T, s *Schema, tbl *Table) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := ensure(t, s, tbl)
		if err == nil && st.Complete {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("schema not complete within 60s: %+v, %v", st, err)
		}
		time.Sleep(time.Second)
	}
}

func insertEvents(t *testing.T, db *DB, cols []string, rows [][]any) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return db.Insert(ctx, "events", cols, rows)
}

// TestSchemaOnCluster runs the schema manager against a real 2-shard ×
// 2-replica ClickHouse 18.16 cluster with ZooKeeper; the subtests share it,
// each in a database of its own.
func TestSchemaOnCluster(t *testing.T) {
	c := testenv.ClickHouseCluster(t, testenv.ClusterOptions{Shards: 2, Replicas: 2})

	t.Run("fresh cluster: created ON CLUSTER on every node", func(t *testing.T) {
		database := "fresh"
		db, s := openCluster(t, c, c.Node(1, 1), database)
		ddlTasks := "SELECT count() FROM system.zookeeper WHERE path = '/clickhouse/task_queue/ddl'"
		before := c.Nodes[0].QueryUint64(t, ddlTasks)
		st, err := ensure(t, s, eventsTable())
		if err != nil {
			t.Fatal(err)
		}
		if n := c.Nodes[0].QueryUint64(t, ddlTasks) - before; n != 3 {
			t.Errorf("%d ON CLUSTER statements queued, want 3 (database, local table, Distributed table)", n)
		}
		if !st.Complete || len(st.Columns) != 3 {
			t.Errorf("state %+v, want complete with 3 columns", st)
		}
		wantEverywhere(t, c, database)
		// Synchronous inserts: rows are on their shards when Insert returns.
		if err := insertEvents(t, db, []string{"env", "at", "v"}, [][]any{
			{"a", time.Unix(1e9, 0), uint64(1)}, {"b", time.Unix(1e9, 0), uint64(2)}, {"c", time.Unix(1e9, 0), uint64(3)},
		}); err != nil {
			t.Fatal(err)
		}
		// Each shard's rows are on one of its replicas at least (the other
		// copies them from ZooKeeper's log later).
		var onShards uint64
		for _, shard := range []int{1, 2} {
			var most uint64
			for _, n := range c.Shard(shard) {
				most = max(most, n.QueryUint64(t, "SELECT count() FROM fresh.events_local"))
			}
			onShards += most
		}
		if onShards != 3 {
			t.Errorf("%d rows in the shards' local tables right after the INSERT, want 3", onShards)
		}
		// A second Ensure changes nothing and stays complete.
		if st, err := ensure(t, s, eventsTable()); err != nil || !st.Complete {
			t.Errorf("second Ensure: %+v, %v", st, err)
		}
	})

	t.Run("a replica down at first start is completed when it is back", func(t *testing.T) {
		database := "partial"
		down := c.Node(2, 2)
		down.Stop()
		db, s := openCluster(t, c, c.Node(1, 1), database)
		// What `check` sees first: the table missing on every node, the
		// one down named; and it creates nothing.
		ictx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		r, err := s.Inspect(ictx, eventsTable())
		cancel()
		if err != nil || r.Exists || r.Nodes != 4 || r.Incomplete != 4 || len(r.Unreachable) != 1 || !strings.Contains(r.Unreachable[0], down.Addr()) || r.Problem != nil {
			t.Errorf("Inspect with %s down: %+v, %v", down.Addr(), r, err)
		}
		if got := nodeColumns(t, c.Node(1, 1), database, "events_local"); got != nil {
			t.Fatalf("Inspect created %s.events_local: %v", database, got)
		}
		st, err := ensure(t, s, eventsTable())
		if err != nil {
			t.Fatal(err)
		}
		if st.Complete {
			t.Error("Ensure reports complete with a node down")
		}
		if err := insertEvents(t, db, []string{"env", "at", "v"}, [][]any{{"a", time.Unix(1e9, 0), uint64(1)}, {"b", time.Unix(1e9, 0), uint64(1)}}); err != nil {
			t.Fatalf("insert with a replica down: %v", err)
		}
		down.Start()
		if got := nodeColumns(t, down, database, "events"); got != nil {
			t.Fatalf("the node that was down already has %s.events (%v): the test proves nothing", database, got)
		}
		// Writers call Ensure again every RecheckInterval while incomplete.
		ensureComplete(t, s, eventsTable())
		wantEverywhere(t, c, database)
	})

	t.Run("a dropped column comes back on every node", func(t *testing.T) {
		database := "dropped"
		_, s := openCluster(t, c, c.Node(2, 1), database)
		if _, err := ensure(t, s, eventsTable("extra")); err != nil {
			t.Fatal(err)
		}
		c.Nodes[0].Exec(t, "ALTER TABLE dropped.events_local ON CLUSTER "+c.Name+" DROP COLUMN extra")
		for _, n := range c.Nodes {
			n.Exec(t, "ALTER TABLE dropped.events DROP COLUMN extra")
		}
		wantEverywhere(t, c, database)
		if _, err := ensure(t, s, eventsTable("extra")); err != nil {
			t.Fatal(err)
		}
		wantEverywhere(t, c, database, "extra")
	})

	t.Run("on 18.16 a new column waits until every replica is active", func(t *testing.T) {
		database := "waits"
		db, s := openCluster(t, c, c.Node(1, 1), database)
		if _, err := ensure(t, s, eventsTable()); err != nil {
			t.Fatal(err)
		}
		down := c.Node(1, 2)
		down.Stop()
		// Three columns: 18.16 would refuse to start a replica that
		// missed them.
		_, err := ensure(t, s, eventsTable("c1", "c2", "c3"))
		var se *SchemaError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "active") {
			t.Fatalf("Ensure with a replica of the shard down: %v, want a SchemaError saying the ALTER waits", err)
		}
		if got := nodeColumns(t, c.Node(2, 1), database, "events_local"); len(got) != 6 {
			t.Errorf("shard 2 (all replicas up) has %v, want the new columns", got)
		}
		if err := insertEvents(t, db, []string{"env", "at", "v", "c1"}, [][]any{{"a", time.Unix(1e9, 0), uint64(1), uint64(1)}}); ErrorClass(err) != ClassSchema {
			t.Errorf("insert of the new column before the schema is complete: %v, want a schema error", err)
		}
		down.Start() // would fail the test if the replica could not start
		ensureComplete(t, s, eventsTable("c1", "c2", "c3"))
		wantEverywhere(t, c, database, "c1", "c2", "c3")
		if err := insertEvents(t, db, []string{"env", "at", "v", "c1"}, [][]any{{"a", time.Unix(1e9, 0), uint64(1), uint64(1)}}); err != nil {
			t.Errorf("insert once complete: %v", err)
		}
	})

	t.Run("a plain table under the Distributed table's name is refused", func(t *testing.T) {
		database := "plain"
		c.Node(1, 2).Exec(t, "CREATE DATABASE plain")
		c.Node(1, 2).Exec(t, "CREATE TABLE plain.events (env String, at DateTime('UTC'), v UInt64) ENGINE = MergeTree ORDER BY env")
		_, s := openCluster(t, c, c.Node(1, 1), database)
		_, err := ensure(t, s, eventsTable())
		if err == nil || !strings.Contains(err.Error(), "not the Distributed table") {
			t.Fatalf("Ensure with a MergeTree events on %s: %v, want an error naming it", c.Node(1, 2).ReplicaName, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		r, err := s.Inspect(ctx, eventsTable())
		if err != nil || r.Problem == nil || !strings.Contains(r.Problem.Error(), "not the Distributed table") {
			t.Errorf("Inspect with a MergeTree events on %s: %+v, %v; want the same problem as its Problem", c.Node(1, 2).ReplicaName, r, err)
		}
	})

	t.Run("retention without TTL drops old partitions on every shard", func(t *testing.T) {
		database := "expire"
		db, s := openCluster(t, c, c.Node(1, 1), database)
		tbl := eventsTable()
		tbl.Retention = 48 * time.Hour
		if _, err := ensure(t, s, tbl); err != nil {
			t.Fatal(err)
		}
		now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
		var rows [][]any
		for d := 0; d < 5; d++ {
			for _, env := range []string{"a", "b", "c", "d"} {
				rows = append(rows, []any{env, now.Add(-time.Duration(d) * 24 * time.Hour), uint64(1)})
			}
		}
		if err := insertEvents(t, db, []string{"env", "at", "v"}, rows); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		dropped, err := s.Expire(ctx, tbl, now)
		if err != nil {
			t.Fatal(err)
		}
		// Days 0..4 back; the retention keeps days 0, 1 and 2 (day 2's
		// newest row is exactly 48h old: not older).
		var left uint64
		for _, shard := range []int{1, 2} {
			for _, n := range c.Shard(shard) {
				deadline := time.Now().Add(20 * time.Second)
				for {
					got := n.QueryUint64(t, "SELECT count() FROM expire.events_local WHERE at < toDateTime("+
						strconv.FormatInt(now.Add(-48*time.Hour).Unix(), 10)+")")
					if got == 0 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s still has %d expired rows", n.ReplicaName, got)
					}
					time.Sleep(200 * time.Millisecond)
				}
			}
			left += c.Node(shard, 1).QueryUint64(t, "SELECT count() FROM expire.events_local")
		}
		if left != 12 {
			t.Errorf("%d rows left, want 12 (three days × four environments)", left)
		}
		if dropped < 2 {
			t.Errorf("Expire dropped %d partitions, want at least 2 (two days on each shard that has them)", dropped)
		}
		if again, err := s.Expire(ctx, tbl, now.Add(time.Minute)); err != nil || again != 0 {
			t.Errorf("Expire within the hour: %d, %v; want nothing done", again, err)
		}
	})
}
