package sandbox_test

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgepipe/edgepipe/internal/sandbox"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	a, err := sandbox.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestClickHouse starts a server, creates a table through the native
// protocol, and checks Stop leaves no process behind.
func TestClickHouse(t *testing.T) {
	if _, _, err := sandbox.ClickHouseCommand(); err != nil {
		testenv.Binary(t, "clickhouse-server") // skips, or fails with CI=true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ch, err := sandbox.StartClickHouse(ctx, sandbox.ClickHouseOptions{Dir: filepath.Join(t.TempDir(), "ch"), Addr: freeAddr(t), HTTPAddr: freeAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			ch.Stop()
		}
	})
	opts, err := clickhouse.ParseDSN(ch.DSN("default"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "CREATE TABLE t (x UInt8) ENGINE = Memory"); err != nil {
		t.Fatal(err)
	}
	if err := conn.Exec(ctx, "INSERT INTO t (x) SELECT 7"); err != nil {
		t.Fatal(err)
	}
	var x uint8
	if err := conn.QueryRow(ctx, "SELECT x FROM t").Scan(&x); err != nil || x != 7 {
		t.Fatalf("SELECT x: %d, %v", x, err)
	}
	pid := ch.Pid()
	ch.Stop()
	stopped = true
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("clickhouse-server (pid %d) still exists after Stop: %v", pid, err)
	}
}

// TestKafka produces a record to the broker and consumes it back.
func TestKafka(t *testing.T) {
	k, err := sandbox.StartKafka(freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := kgo.NewClient(kgo.SeedBrokers(k.Addr()), kgo.ConsumeTopics("t"), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if err := client.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte("hello")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	fetches := client.PollFetches(ctx)
	if err := fetches.Err(); err != nil {
		t.Fatal(err)
	}
	if recs := fetches.Records(); len(recs) != 1 || string(recs[0].Value) != "hello" {
		t.Fatalf("consumed %v", recs)
	}
}
