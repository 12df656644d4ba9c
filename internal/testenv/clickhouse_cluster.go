package testenv

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// What ClickHouse 18.16 (Debian's 18.16.1) does with cluster DDL through
// clickhouse-go v2.50, checked against a 2×2 cluster of this package by
// TestClickHouseCluster1816DDL and the other cluster tests:
//   - CREATE DATABASE IF NOT EXISTS db ON CLUSTER c works and can be
//     repeated; without IF NOT EXISTS a repeat fails with code 82 ("There
//     was an error on [host:port]: … already exists"). CREATE TABLE IF NOT
//     EXISTS … ON CLUSTER likewise. Macros work in ON CLUSTER '{cluster}'
//     and Distributed('{cluster}', …).
//   - ALTER TABLE <Distributed> ON CLUSTER c … fails with code 371 ("Table
//     dist isn't replicated, but shard #1 is replicated according to its
//     cluster definition") when the shards have internal_replication=true.
//     ALTER TABLE <Distributed> ADD COLUMN on each node, without ON CLUSTER,
//     works.
//   - ALTER TABLE <Replicated*MergeTree> ON CLUSTER c ADD COLUMN works: every
//     node of every shard gets the column. Without ON CLUSTER it reaches the
//     node's own shard only (through ZooKeeper).
//   - No ADD COLUMN IF NOT EXISTS (syntax error, code 62): read
//     system.columns on every node first.
//   - A node down: ON CLUSTER DDL waits distributed_ddl_task_timeout seconds
//     (default 180) and fails with code 159 ("… There are N unfinished hosts
//     (M of them are currently active), they are going to execute the query
//     in background"). The live nodes have run it; the down node runs it from
//     the queue in ZooKeeper when it starts again. For a Replicated ALTER, the
//     down node's live peer in its shard is reported unfinished too (it waits
//     for its peer). With distributed_ddl_task_timeout=0 the statement
//     returns at once, with no error and without waiting.
//   - Settings per query (clickhouse.Context(ctx, clickhouse.WithSettings(
//     clickhouse.Settings{…}))): the driver sends them to this old server
//     (revision 54412) as unsigned varints and accepts only int and bool
//     values. 18.16 reads Int64 settings such as distributed_ddl_task_timeout
//     as zigzag varints, so N arrives as N/2 (odd N as a negative number):
//     send 2×N. UInt64 and bool settings (insert_distributed_sync,
//     max_threads) arrive as sent.
//   - insert_distributed_sync=1 makes an INSERT into a Distributed table
//     return once each shard's block is written on one live replica (one
//     replica of a shard down does not fail it); the shard's other replicas
//     copy it asynchronously.
//   - There is no clusterAllReplicas (code 46), getMacro() or tcpPort().
//     cluster(c, db, t) reads one replica per shard, and remote('a,b,…', …)
//     unions the nodes' rows with nothing to tell them apart. To check a
//     schema on every node, list the hosts (SELECT host_address, port FROM
//     system.clusters WHERE cluster = 'c') and read each one's
//     system.columns, connected to it directly or through remote('host:port',
//     system, columns), one address at a time.
//   - system.clusters.is_local is 1 on every replica of the node's own shard,
//     not only the node itself (the port tells).
//   - A replica killed with SIGKILL and started again before its ZooKeeper
//     session expired fails to activate ("appears to be already active") and
//     retries 10s later: for about 10s it serves its old rows and does not
//     replicate.

// ClusterOptions shapes a ClickHouseCluster.
type ClusterOptions struct {
	// Name is the cluster's name in remote_servers, for ON CLUSTER and
	// Distributed tables; letters, digits and '_'. Default "edgepipe".
	Name string
	// Shards is the number of shards, default 1.
	Shards int
	// Replicas is the number of replicas of each shard, default 1.
	Replicas int
}

// Cluster is a replicated, sharded ClickHouse cluster started for one test:
// one ZooKeeper and Shards×Replicas clickhouse-server processes on loopback,
// each a ClickHouseServer of its own (directory, ports, Stop/Kill/Start).
//
// Every node's config.xml has the same remote_servers entry for the cluster
// (every shard with internal_replication=true, so a Distributed table writes
// one replica of a shard and the Replicated*MergeTree table copies it to the
// others), the zookeeper section, distributed_ddl (for ON CLUSTER) and its
// own macros: {cluster} the cluster's name, {shard} the node's shard number
// ("1", "2", …) and {replica} its ReplicaName ("s1r1", "s1r2", …), for
// table paths like '/clickhouse/tables/{shard}/db/t' with replica
// '{replica}'.
type Cluster struct {
	// Name is the cluster's name (ClusterOptions.Name).
	Name string
	// ZooKeeper is the cluster's coordination service.
	ZooKeeper *ZooKeeperServer
	// Nodes lists every node, shard by shard: shard 1's replicas first.
	Nodes []*ClusterNode
}

// ClusterNode is one clickhouse-server of a Cluster.
type ClusterNode struct {
	*ClickHouseServer
	// Shard is the node's shard number, from 1, and its {shard} macro.
	Shard int
	// Replica is the node's place among its shard's replicas, from 1.
	Replica int
	// ReplicaName is the node's {replica} macro, "s<Shard>r<Replica>",
	// unique in the cluster.
	ReplicaName string
	// interserverPort is where the other replicas fetch parts from.
	interserverPort int
}

// clusterZooKeeperSessionTimeout is the nodes' ZooKeeper session timeout:
// a killed node's is_active znodes last this long, and a restarted replica
// waits for them to expire before it becomes active again. Within what
// ZooKeeperServer allows (1s to 10s); not shorter, so a busy machine does not
// expire live sessions.
const clusterZooKeeperSessionTimeout = 6 * time.Second

var clusterNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ClickHouseCluster starts a ZooKeeper and the cluster's nodes (in parallel)
// for the test, waits until every node answers, sees ZooKeeper and lists the
// whole cluster in system.clusters, and kills them all on cleanup. A missing
// clickhouse-server, java or zookeeper skips the test (run `make deps`), or
// fails it when CI=true.
func ClickHouseCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	if opts.Name == "" {
		opts.Name = "edgepipe"
	}
	if opts.Shards == 0 {
		opts.Shards = 1
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	if !clusterNameRE.MatchString(opts.Name) || opts.Shards < 0 || opts.Replicas < 0 {
		t.Fatalf("testenv: bad ClusterOptions %+v", opts)
	}
	clickHouseCommand(t) // skip or fail before starting ZooKeeper
	c := &Cluster{Name: opts.Name, ZooKeeper: ZooKeeper(t)}
	for s := 1; s <= opts.Shards; s++ {
		for r := 1; r <= opts.Replicas; r++ {
			c.Nodes = append(c.Nodes, &ClusterNode{
				ClickHouseServer: newClickHouseServer(t),
				Shard:            s,
				Replica:          r,
				ReplicaName:      fmt.Sprintf("s%dr%d", s, r),
			})
		}
	}
	// Every node's config names every node's port, so a port taken before
	// its server bound it means new ports and configs for all.
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		if err = c.configure(); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		err = c.start()
		if err == nil {
			return c
		}
		clash := false
		for _, n := range c.Nodes {
			n.Kill()
			clash = clash || addrInUse(n.logs())
		}
		if !clash {
			break
		}
	}
	t.Fatalf("testenv: start clickhouse cluster %s: %v", c.Name, err)
	return nil
}

// configure picks every node's ports and writes every config.xml.
func (c *Cluster) configure() error {
	for _, n := range c.Nodes {
		if err := n.pickPorts(); err != nil {
			return err
		}
		p, err := stablePort()
		if err != nil {
			return err
		}
		n.interserverPort = p
	}
	for _, n := range c.Nodes {
		if err := n.writeConfig(c.sections(n)); err != nil {
			return err
		}
	}
	return nil
}

// sections renders a node's cluster sections of config.xml.
func (c *Cluster) sections(node *ClusterNode) string {
	var b strings.Builder
	fmt.Fprintf(&b, `    <interserver_http_host>127.0.0.1</interserver_http_host>
    <interserver_http_port>%d</interserver_http_port>
    <zookeeper>
        <node><host>127.0.0.1</host><port>%d</port></node>
        <session_timeout_ms>%d</session_timeout_ms>
    </zookeeper>
    <distributed_ddl>
        <path>/clickhouse/task_queue/ddl</path>
    </distributed_ddl>
    <macros>
        <cluster>%s</cluster>
        <shard>%d</shard>
        <replica>%s</replica>
    </macros>
    <remote_servers>
        <%s>
`, node.interserverPort, c.ZooKeeper.Port(), clusterZooKeeperSessionTimeout.Milliseconds(),
		c.Name, node.Shard, node.ReplicaName, c.Name)
	for i, n := range c.Nodes {
		if i == 0 || c.Nodes[i-1].Shard != n.Shard {
			b.WriteString("            <shard>\n                <internal_replication>true</internal_replication>\n")
		}
		fmt.Fprintf(&b, "                <replica><host>127.0.0.1</host><port>%d</port></replica>\n", n.tcpPort)
		if i == len(c.Nodes)-1 || c.Nodes[i+1].Shard != n.Shard {
			b.WriteString("            </shard>\n")
		}
	}
	fmt.Fprintf(&b, "        </%s>\n    </remote_servers>\n", c.Name)
	return b.String()
}

// start starts every node at once and waits until each is ready; errors
// carry the failing nodes' logs.
func (c *Cluster) start() error {
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.start(); err != nil {
				errs[i] = fmt.Errorf("node %s (%s): %w\n--- clickhouse log (%s) ---\n%s", n.ReplicaName, n.Addr(), err, n.dir, n.logs())
				return
			}
			if err := waitFor(context.Background(), n.proc, clickHouseStartTimeout, 100*time.Millisecond, func(ctx context.Context) error {
				return c.nodeReady(ctx, n)
			}); err != nil {
				errs[i] = fmt.Errorf("node %s (%s): %w\n--- clickhouse log (%s) ---\n%s", n.ReplicaName, n.Addr(), err, n.dir, n.logs())
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// nodeReady checks that the node reads ZooKeeper and has the whole cluster
// in system.clusters, finding itself in it.
func (c *Cluster) nodeReady(ctx context.Context, n *ClusterNode) error {
	conn, err := clickhouse.Open(n.options("default"))
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer conn.Close()
	var znodes uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.zookeeper WHERE path = '/'").Scan(&znodes); err != nil {
		return fmt.Errorf("read zookeeper through the node: %w", err)
	}
	// is_local is 1 on every replica of the node's own shard on 18.16.
	var hosts, self uint64
	if err := conn.QueryRow(ctx, "SELECT count(), countIf(is_local = 1 AND port = ?) FROM system.clusters WHERE cluster = ?",
		n.tcpPort, c.Name).Scan(&hosts, &self); err != nil {
		return fmt.Errorf("system.clusters: %w", err)
	}
	if int(hosts) != len(c.Nodes) || self != 1 {
		return fmt.Errorf("system.clusters lists %d hosts of cluster %s, %d of them local with port %d; want %d and 1", hosts, c.Name, self, n.tcpPort, len(c.Nodes))
	}
	return nil
}

// Node returns the node of shard (from 1) and replica (from 1).
func (c *Cluster) Node(shard, replica int) *ClusterNode {
	for _, n := range c.Nodes {
		if n.Shard == shard && n.Replica == replica {
			return n
		}
	}
	panic("testenv: no cluster node s" + strconv.Itoa(shard) + "r" + strconv.Itoa(replica))
}

// Shard returns the nodes of shard (from 1), its replicas in order.
func (c *Cluster) Shard(shard int) []*ClusterNode {
	var nodes []*ClusterNode
	for _, n := range c.Nodes {
		if n.Shard == shard {
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// NewDatabase creates a database with a unique name derived from the test's
// name on every node (CREATE DATABASE … ON CLUSTER, run on the first node)
// and returns that name.
func (c *Cluster) NewDatabase(t testing.TB) string {
	t.Helper()
	name := uniqueName(t, "t_")
	c.Nodes[0].Exec(t, "CREATE DATABASE "+name+" ON CLUSTER "+c.Name)
	return name
}
