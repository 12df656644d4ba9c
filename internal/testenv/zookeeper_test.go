package testenv

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestZooKeeperFourLetterWords(t *testing.T) {
	t.Parallel()
	zk := ZooKeeper(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct{ cmd, want string }{
		{"ruok", "imok"},
		{"srvr", "Mode: standalone"},
		{"mntr", "zk_server_state\tstandalone"},
		{"conf", "not in the whitelist"}, // not allowed by zoo.cfg
	} {
		out, err := zk.Command(ctx, tc.cmd)
		if err != nil {
			t.Fatalf("%s: %v", tc.cmd, err)
		}
		if !strings.Contains(out, tc.want) {
			t.Errorf("%s: got %q, want it to contain %q", tc.cmd, out, tc.want)
		}
	}
	zk.Stop()
	if out, err := zk.Command(ctx, "ruok"); err == nil {
		t.Fatalf("ZooKeeper answers %q after Stop", out)
	}
	zk.Start()
	if out, err := zk.Command(ctx, "ruok"); err != nil || out != "imok" {
		t.Fatalf("ruok after Stop and Start: %q, %v", out, err)
	}
}

// znodeCount reads zk_znode_count from mntr.
func znodeCount(ctx context.Context, t *testing.T, zk *ZooKeeperServer) int {
	t.Helper()
	out, err := zk.Command(ctx, "mntr")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "zk_znode_count\t"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatalf("mntr zk_znode_count %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("mntr has no zk_znode_count: %q", out)
	return 0
}

// TestZooKeeperRestartKeepsData kills ZooKeeper under a 1×2 cluster and
// starts it again on the same port and data: the znodes are still there and
// replication works again.
func TestZooKeeperRestartKeepsData(t *testing.T) {
	t.Parallel()
	c := ClickHouseCluster(t, ClusterOptions{Shards: 1, Replicas: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := c.NewDatabase(t)
	createClusterTables(t, c, db)
	before := znodeCount(ctx, t, c.ZooKeeper)
	if before < 20 {
		t.Fatalf("%d znodes after creating a replicated table, want the table's tree", before)
	}

	addr := c.ZooKeeper.Addr()
	c.ZooKeeper.Kill()
	if _, err := c.ZooKeeper.Command(ctx, "ruok"); err == nil {
		t.Fatal("ZooKeeper answers after Kill")
	}
	c.ZooKeeper.Start()
	if c.ZooKeeper.Addr() != addr {
		t.Fatalf("address changed across restart: %s → %s", addr, c.ZooKeeper.Addr())
	}
	if after := znodeCount(ctx, t, c.ZooKeeper); after < before {
		t.Fatalf("%d znodes after restart, %d before", after, before)
	}

	// The nodes reconnect; a write on replica 1 reaches replica 2. Until
	// replica 1 has its session back its table is read-only, so retry.
	deadline := time.Now().Add(time.Minute)
	for {
		err := c.Node(1, 1).Conn(t).Exec(ctx, "INSERT INTO "+db+".local (k, v, version) SELECT number AS k, number AS v, 1 FROM system.numbers LIMIT 10")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("insert after ZooKeeper restart: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitReplicasEqual(t, c, db, 1, 10, time.Minute)
}
