package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// clusterRow is a row of the test tables: key, value, ReplacingMergeTree
// version.
type clusterRow struct {
	K       uint64 `ch:"k"`
	V       uint64 `ch:"v"`
	Version uint64 `ch:"version"`
}

// createClusterTables creates db.local, a ReplicatedReplacingMergeTree on
// every node, and db.dist, a Distributed table over it sharded by k (so
// with 2 shards of weight 1, shard 1 gets the even keys and shard 2 the odd).
func createClusterTables(t *testing.T, c *Cluster, db string) {
	t.Helper()
	c.Nodes[0].Exec(t, "CREATE TABLE "+db+".local ON CLUSTER "+c.Name+
		" (k UInt64, v UInt64, version UInt64) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/"+db+
		"/local', '{replica}', version) ORDER BY k")
	c.Nodes[0].Exec(t, "CREATE TABLE "+db+".dist ON CLUSTER "+c.Name+" AS "+db+".local ENGINE = Distributed("+c.Name+", "+db+", local, k)")
}

// insertDistributed inserts keys [from, to) with v = k*version through
// db.dist on node n, synchronously: with insert_distributed_sync=1 the
// INSERT returns once each shard's block is written on one of its replicas.
func insertDistributed(t *testing.T, n *ClusterNode, db string, from, to, version uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx = clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_distributed_sync": 1}))
	b, err := n.Conn(t).PrepareBatch(ctx, "INSERT INTO "+db+".dist (k, v, version)")
	if err != nil {
		t.Fatalf("prepare insert on %s: %v", n.ReplicaName, err)
	}
	for k := from; k < to; k++ {
		if err := b.Append(k, k*version, version); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatalf("insert through %s.dist on %s: %v", db, n.ReplicaName, err)
	}
}

// localRows returns every row of db.local on node n (no FINAL: the parts as
// they are), ordered.
func localRows(ctx context.Context, n *ClusterNode, db string) ([]clusterRow, error) {
	conn, err := clickhouse.Open(n.options("default"))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var rows []clusterRow
	err = conn.Select(ctx, &rows, "SELECT k, v, version FROM "+db+".local ORDER BY k, version")
	return rows, err
}

// waitReplicasEqual polls until every replica of each shard holds the same
// rows in db.local, at least want of them on each shard (rows, not keys:
// before a merge a replaced key has two rows), and returns each shard's rows.
func waitReplicasEqual(t *testing.T, c *Cluster, db string, shards int, want int, timeout time.Duration) map[int][]clusterRow {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got, why := map[int][]clusterRow{}, ""
		for s := 1; s <= shards && why == ""; s++ {
			for _, n := range c.Shard(s) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				rows, err := localRows(ctx, n, db)
				cancel()
				switch {
				case err != nil:
					why = fmt.Sprintf("%s: %v", n.ReplicaName, err)
				case len(rows) < want:
					why = fmt.Sprintf("%s has %d rows, want at least %d", n.ReplicaName, len(rows), want)
				case n.Replica == 1:
					got[s] = rows
				case !reflect.DeepEqual(rows, got[s]):
					why = fmt.Sprintf("%s has %d rows, %s has %d, not the same", n.ReplicaName, len(rows), c.Node(s, 1).ReplicaName, len(got[s]))
				}
				if why != "" {
					break
				}
			}
		}
		if why == "" {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas not in sync after %s: %s", timeout, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rssKiB returns a process's resident memory from /proc (Linux), 0 if unknown.
func rssKiB(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// TestClickHouseClusterDistributedReplicated checks the 2×2 cluster end to
// end: ON CLUSTER DDL reaches every node, a synchronous insert through the
// Distributed table lands on both replicas of the right shard, the shards
// are disjoint, and FINAL through the Distributed table is exact.
func TestClickHouseClusterDistributedReplicated(t *testing.T) {
	t.Parallel()
	started := time.Now()
	c := ClickHouseCluster(t, ClusterOptions{Shards: 2, Replicas: 2})
	t.Logf("ZooKeeper + %d ClickHouse nodes ready in %s", len(c.Nodes), time.Since(started).Round(time.Millisecond))

	db := c.NewDatabase(t)
	for _, n := range c.Nodes {
		if got := n.QueryUint64(t, "SELECT count() FROM system.databases WHERE name = '"+db+"'"); got != 1 {
			t.Fatalf("database %s on %s: %d, want 1 (CREATE DATABASE ON CLUSTER)", db, n.ReplicaName, got)
		}
	}
	createClusterTables(t, c, db)
	for _, n := range c.Nodes {
		if got := n.QueryUint64(t, "SELECT count() FROM system.tables WHERE database = '"+db+"' AND name IN ('local', 'dist')"); got != 2 {
			t.Fatalf("tables on %s: %d of local and dist, want 2", n.ReplicaName, got)
		}
		if got := n.QueryUint64(t, "SELECT count() FROM system.replicas WHERE database = '"+db+"' AND table = 'local' AND replica_name = '"+n.ReplicaName+
			"' AND zookeeper_path = '/clickhouse/tables/"+strconv.Itoa(n.Shard)+"/"+db+"/local'"); got != 1 {
			t.Fatalf("%s: system.replicas has no replica %s at /clickhouse/tables/%d/%s/local: macros not applied", n.ReplicaName, n.ReplicaName, n.Shard, db)
		}
	}

	const keys = 1000
	insertDistributed(t, c.Node(1, 1), db, 0, keys, 1)
	insertDistributed(t, c.Node(2, 2), db, 0, keys/2, 2) // replaces half of the keys
	shards := waitReplicasEqual(t, c, db, 2, 1, time.Minute)

	// Shard 1 holds exactly the even keys, shard 2 the odd: disjoint, and
	// together every key.
	seen := map[uint64]int{}
	for s, rows := range shards {
		for _, r := range rows {
			if int(r.K%2)+1 != s {
				t.Fatalf("key %d on shard %d; sharding by k puts it on shard %d", r.K, s, r.K%2+1)
			}
			seen[r.K] = s
		}
	}
	if len(seen) != keys {
		t.Fatalf("%d distinct keys over both shards, want %d", len(seen), keys)
	}

	wantSum := uint64(0)
	for k := uint64(0); k < keys; k++ {
		if k < keys/2 {
			wantSum += 2 * k
		} else {
			wantSum += k
		}
	}
	for _, n := range []*ClusterNode{c.Node(1, 2), c.Node(2, 1)} {
		if got := n.QueryUint64(t, "SELECT count() FROM "+db+".dist FINAL"); got != keys {
			t.Fatalf("SELECT count() FROM dist FINAL on %s = %d, want %d", n.ReplicaName, got, keys)
		}
		if got := n.QueryUint64(t, "SELECT sum(v) FROM "+db+".dist FINAL"); got != wantSum {
			t.Fatalf("SELECT sum(v) FROM dist FINAL on %s = %d, want %d (version 2 wins)", n.ReplicaName, got, wantSum)
		}
	}

	// The HTTP interface of every node answers the same.
	for _, n := range c.Nodes {
		resp, err := http.Get("http://" + n.HTTPAddr() + "/?query=" + url.QueryEscape("SELECT count() FROM "+db+".dist FINAL"))
		if err != nil {
			t.Fatalf("HTTP query on %s: %v", n.ReplicaName, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != strconv.Itoa(keys) {
			t.Fatalf("HTTP query on %s: %s %q %v, want 200 %d", n.ReplicaName, resp.Status, body, err, keys)
		}
	}

	total := 0
	for _, n := range c.Nodes {
		kib := rssKiB(n.proc.cmd.Process.Pid)
		total += kib
		t.Logf("%s RSS %d MiB", n.ReplicaName, kib/1024)
	}
	zk := rssKiB(c.ZooKeeper.proc.cmd.Process.Pid)
	t.Logf("ClickHouse nodes RSS total %d MiB; ZooKeeper RSS %d MiB", total/1024, zk/1024)
}

// TestClickHouseClusterReplicaCatchesUp kills one replica (SIGKILL), inserts
// through the Distributed table while it is down, restarts it on the same
// data, and waits until it holds the same rows as its live peer.
func TestClickHouseClusterReplicaCatchesUp(t *testing.T) {
	t.Parallel()
	c := ClickHouseCluster(t, ClusterOptions{Shards: 2, Replicas: 2})
	db := c.NewDatabase(t)
	createClusterTables(t, c, db)
	insertDistributed(t, c.Node(1, 1), db, 0, 100, 1)
	before := waitReplicasEqual(t, c, db, 2, 50, time.Minute)

	down := c.Node(2, 2)
	down.Kill()
	if down.Running() {
		t.Fatal("s2r2 running after Kill")
	}
	// Shard 2's block goes to its live replica s2r1.
	insertDistributed(t, c.Node(1, 1), db, 100, 300, 1)
	if got := c.Node(2, 1).QueryUint64(t, "SELECT count() FROM "+db+".local"); got != 150 {
		t.Fatalf("s2r1 holds %d rows while s2r2 is down, want 150 (odd keys below 300)", got)
	}
	restarted := time.Now()
	down.Start()
	after := waitReplicasEqual(t, c, db, 2, 150, time.Minute)
	t.Logf("s2r2 caught up %s after its restart", time.Since(restarted).Round(time.Millisecond))
	if len(after[2]) != 150 || len(before[2]) != 50 {
		t.Fatalf("shard 2 rows: %d before, %d after; want 50 and 150", len(before[2]), len(after[2]))
	}
	if got := down.QueryUint64(t, "SELECT count() FROM "+db+".dist FINAL"); got != 300 {
		t.Fatalf("count() FROM dist FINAL on the restarted node = %d, want 300", got)
	}
}

// exceptionCode returns the server exception's code in err, or 0.
func exceptionCode(err error) int32 {
	var ex *clickhouse.Exception
	if errors.As(err, &ex) {
		return ex.Code
	}
	return 0
}

// TestClickHouseCluster1816DDL pins down what 18.16 accepts for cluster DDL
// (see the comment at the top of clickhouse_cluster.go), so that code built
// on these facts learns of a change here.
func TestClickHouseCluster1816DDL(t *testing.T) {
	t.Parallel()
	c := ClickHouseCluster(t, ClusterOptions{Shards: 2, Replicas: 2})
	n1 := c.Node(1, 1)
	conn := n1.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := conn.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.Version.Major != 18 {
		t.Skipf("facts specific to 18.x; server is %s", v)
	}
	exec := func(sql string) error { return conn.Exec(ctx, sql) }
	db := uniqueName(t, "t_")

	// CREATE DATABASE IF NOT EXISTS … ON CLUSTER is idempotent; without
	// IF NOT EXISTS a second run fails (82, from the hosts).
	for range 2 {
		if err := exec("CREATE DATABASE IF NOT EXISTS " + db + " ON CLUSTER " + c.Name); err != nil {
			t.Fatalf("CREATE DATABASE IF NOT EXISTS ON CLUSTER: %v", err)
		}
	}
	if err := exec("CREATE DATABASE " + db + " ON CLUSTER " + c.Name); exceptionCode(err) != 82 {
		t.Errorf("CREATE DATABASE of an existing database ON CLUSTER: %v, want code 82", err)
	}
	createClusterTables(t, c, db)

	// ALTER of the Distributed table ON CLUSTER: refused (371) because the
	// shards have internal_replication.
	err = exec("ALTER TABLE " + db + ".dist ON CLUSTER " + c.Name + " ADD COLUMN w UInt64")
	if exceptionCode(err) != 371 || !strings.Contains(err.Error(), "isn't replicated, but shard") {
		t.Errorf("ALTER <Distributed> ON CLUSTER: %v, want code 371 (isn't replicated, but shard … is replicated)", err)
	}
	// ALTER of the Replicated local table ON CLUSTER reaches every node.
	if err := exec("ALTER TABLE " + db + ".local ON CLUSTER " + c.Name + " ADD COLUMN w UInt64"); err != nil {
		t.Fatalf("ALTER <Replicated> ON CLUSTER ADD COLUMN: %v", err)
	}
	// The Distributed table is altered node by node, without ON CLUSTER.
	for _, n := range c.Nodes {
		n.Exec(t, "ALTER TABLE "+db+".dist ADD COLUMN w UInt64")
	}
	for _, n := range c.Nodes {
		if got := n.QueryUint64(t, "SELECT count() FROM system.columns WHERE database = '"+db+"' AND name = 'w'"); got != 2 {
			t.Errorf("%s: column w in %d of local and dist, want 2", n.ReplicaName, got)
		}
	}
	// Without ON CLUSTER, ALTER of a Replicated table reaches the node's
	// shard only (through ZooKeeper), not the other shard.
	n1.Exec(t, "ALTER TABLE "+db+".local ADD COLUMN z UInt64")
	deadline := time.Now().Add(time.Minute)
	for c.Node(1, 2).QueryUint64(t, "SELECT count() FROM system.columns WHERE database = '"+db+"' AND table = 'local' AND name = 'z'") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("ALTER <Replicated> ADD COLUMN on s1r1 did not reach s1r2")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, n := range c.Shard(2) {
		if got := n.QueryUint64(t, "SELECT count() FROM system.columns WHERE database = '"+db+"' AND table = 'local' AND name = 'z'"); got != 0 {
			t.Errorf("ALTER <Replicated> on shard 1 reached %s of shard 2", n.ReplicaName)
		}
	}
	// No IF NOT EXISTS on ADD COLUMN (syntax error 62): check system.columns.
	if err := exec("ALTER TABLE " + db + ".local ON CLUSTER " + c.Name + " ADD COLUMN IF NOT EXISTS w UInt64"); exceptionCode(err) != 62 {
		t.Errorf("ADD COLUMN IF NOT EXISTS: %v, want syntax error 62", err)
	}

	// No clusterAllReplicas (46); cluster() reads one replica per shard;
	// remote('host:port', system, columns) reads one node.
	if err := exec("SELECT * FROM clusterAllReplicas(" + c.Name + ", system.one)"); exceptionCode(err) != 46 {
		t.Errorf("clusterAllReplicas: %v, want code 46 (unknown table function)", err)
	}
	for _, n := range c.Nodes {
		got := n1.QueryUint64(t, "SELECT count() FROM remote('"+n.Addr()+"', system, columns) WHERE database = '"+db+"' AND table = 'local'")
		want := uint64(4) // k, v, version, w
		if n.Shard == 1 {
			want = 5 // and z
		}
		if got != want {
			t.Errorf("remote('%s', system, columns): %d columns of local, want %d", n.Addr(), got, want)
		}
	}
	if got := n1.QueryUint64(t, "SELECT count() FROM cluster("+c.Name+", system, one)"); got != 2 {
		t.Errorf("cluster(%s, system, one): %d rows, want 2 (one replica per shard)", c.Name, got)
	}

	// clickhouse-go sends settings to 18.16 (revision 54412) as unsigned
	// varints; 18.16 reads Int64 settings such as
	// distributed_ddl_task_timeout as zigzag varints, so N arrives as N/2
	// (odd N as a negative number). UInt64 and bool settings arrive intact.
	for _, tc := range []struct {
		name string
		sent int
		want string
	}{
		{"distributed_ddl_task_timeout", 10, "5"},
		{"distributed_ddl_task_timeout", 11, "-6"},
		{"max_threads", 3, "3"},
		{"insert_distributed_sync", 1, "1"},
	} {
		sctx := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{tc.name: tc.sent}))
		var got string
		if err := conn.QueryRow(sctx, "SELECT value FROM system.settings WHERE name = ?", tc.name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("setting %s sent as %d arrives as %s, want %s", tc.name, tc.sent, got, tc.want)
		}
	}

	// A node down: ON CLUSTER waits distributed_ddl_task_timeout seconds,
	// then fails with 159; the statement has run on the live nodes, and the
	// down node runs it from the queue when it comes back. Timeout 0: the
	// statement returns at once without waiting.
	down := c.Node(2, 2)
	down.Kill()
	timeoutCtx := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"distributed_ddl_task_timeout": 2 * 2})) // 2s
	start := time.Now()
	err = conn.Exec(timeoutCtx, "CREATE TABLE "+db+".m ON CLUSTER "+c.Name+" (k UInt64) ENGINE = Memory")
	took := time.Since(start)
	if exceptionCode(err) != 159 || !strings.Contains(err.Error(), "unfinished hosts") {
		t.Errorf("ON CLUSTER with a node down: %v, want code 159 (unfinished hosts)", err)
	}
	if took < 2*time.Second || took > 20*time.Second {
		t.Errorf("ON CLUSTER with a node down returned after %s, want about distributed_ddl_task_timeout (2s)", took)
	}
	noWaitCtx := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"distributed_ddl_task_timeout": 0}))
	if err := conn.Exec(noWaitCtx, "CREATE TABLE "+db+".m2 ON CLUSTER "+c.Name+" (k UInt64) ENGINE = Memory"); err != nil {
		t.Errorf("ON CLUSTER with distributed_ddl_task_timeout=0 and a node down: %v, want no error", err)
	}
	for _, n := range c.Nodes[:3] {
		if got := n.QueryUint64(t, "SELECT count() FROM system.tables WHERE database = '"+db+"' AND name = 'm'"); got != 1 {
			t.Errorf("%s (up): table m %d, want 1 despite the 159", n.ReplicaName, got)
		}
	}
	down.Start()
	deadline = time.Now().Add(time.Minute)
	for down.QueryUint64(t, "SELECT count() FROM system.tables WHERE database = '"+db+"' AND name IN ('m', 'm2')") != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the restarted node did not run the queued ON CLUSTER statements")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
