package receiver_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestClusterExactlyOnceThroughCrash runs the receiver binary with
// --clickhouse.cluster against a real 2-shard × 2-replica ClickHouse 18.16
// cluster with ZooKeeper: 2,000 records delivered by the simulator over
// HTTPS (some acknowledgements lost, so some batches arrive twice), the
// receiver killed with SIGKILL in the middle, land exactly once: count()
// under FINAL and uniqExact(uuid) through the Distributed table are 2,000,
// read through another node than the receiver writes to; both shards hold
// records, and each shard's replicas hold the same rows. The receiver also
// makes the environments table the Access logs dashboard joins, on every
// node.
func TestClusterExactlyOnceThroughCrash(t *testing.T) {
	const total = 2_000
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	c := testenv.ClickHouseCluster(t, testenv.ClusterOptions{Shards: 2, Replicas: 2})
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
}
