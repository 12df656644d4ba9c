package receiver_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestSimulateDemo runs `rtld-receiver --simulate` as `make demo` would: the
// receiver registers its profiles in the in-process simulator, which posts
// batches over TLS to it, and the records reach Kafka and ClickHouse.
func TestSimulateDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the receiver")
	}
	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)
	kafka := testenv.Kafka(t)
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	p := startReceiver(t, []string{
		"--simulate", "--simulate.traffic-scale=2", "--simulate.environments=2",
		"--web.listen-address=" + addr, "--spool.dir=" + filepath.Join(t.TempDir(), "spool"),
		"--kafka.brokers=" + kafka.Addr(), "--clickhouse.dsn=" + ch.DSN(db),
	}, nil)
	conn := ch.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rows, envs uint64
	waitFor(t, "simulated records in ClickHouse", 45*time.Second, func() bool {
		err := conn.QueryRow(ctx, fmt.Sprintf("SELECT count(), uniqExact(environment_id) FROM `%s`.access_logs FINAL", db)).Scan(&rows, &envs)
		return err == nil && rows > 0 && envs == 2
	})
	recs := kafka.WaitForRecords(t, "cdn-access-logs", 1, 30*time.Second)
	accepted := scrape(http.DefaultClient, "http://"+addr+"/metrics", `edgepipe_rtld_records_received_total{status="accepted"}`)
	t.Logf("ClickHouse %d rows from %d environments, Kafka %d messages, %v records accepted", rows, envs, len(recs), accepted)
	if err := p.stop(); err != nil {
		t.Fatalf("receiver exit: %v", err)
	}
}
