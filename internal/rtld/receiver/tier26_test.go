package receiver_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestReceiverHTTPSDSN26: the receiver binary with an https:// DSN to
// ClickHouse 26.x (chDB behind testenv's server, --clickhouse.tls.ca-file)
// takes 6,000 records from the simulator, which drops some
// acknowledgements (so batches arrive twice), and is killed with SIGKILL
// in the middle: count() FINAL equals the records the receiver
// acknowledged and the simulator generated, and so does count() without
// FINAL (the deduplication token of each INSERT).
func TestReceiverHTTPSDSN26(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the receiver")
	}
	const total = 6_000
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ch := testenv.ChDB(t)
	cert := newTestCert(t)
	sim, err := platformsim.New(platformsim.Config{
		Seed: 11, Properties: 1, Environments: 1,
		Delivery: platformsim.DeliveryConfig{
			BatchSize: 200, AgentsPerEnvironment: 2, RetryInterval: 100 * time.Millisecond, RequestTimeout: 10 * time.Second,
			TLSConfig: &tls.Config{RootCAs: cert.pool},
			Faults:    platformsim.DeliveryFaults{DropAckPercent: 5},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	apiURL, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	env := sim.EnvironmentIDs()[0]
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	base := "https://" + addr
	p := startReceiver(t,
		[]string{
			"--api.url=" + apiURL, "--auth.url=" + apiURL, "--environment-id=" + env,
			"--public-url=" + base, "--web.listen-address=" + addr, "--web.config.file=" + cert.webConfig(t),
			"--clickhouse.dsn=" + ch.HTTPSDSN("logs"), "--clickhouse.tls.ca-file=" + ch.CAFile(),
			"--spool.dir=" + filepath.Join(t.TempDir(), "spool"),
		},
		[]string{
			"EDGEPIPE_CLIENT_ID=" + platformsim.DemoClientID, "EDGEPIPE_CLIENT_SECRET=" + platformsim.DemoClientSecret,
			"EDGEPIPE_RTLD_USERNAME=platform", "EDGEPIPE_RTLD_PASSWORD=correct horse",
		},
	)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cert.pool}}, Timeout: 30 * time.Second}
	accepted := func() float64 {
		return scrape(client, base+"/metrics", `edgepipe_rtld_records_received_total{status="accepted"}`)
	}
	var profile int64
	waitFor(t, "the receiver to register its profile", 30*time.Second, func() bool {
		profile, err = profileID(ctx, t, apiURL, env)
		return err == nil
	})
	if err := sim.DeliverRecords(ctx, profile, total/2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "records to arrive before the kill", 30*time.Second, func() bool { return accepted() >= 1_000 })
	p.kill9()
	time.Sleep(300 * time.Millisecond)
	p.start()
	if err := sim.DeliverRecords(ctx, profile, total/2); err != nil {
		t.Fatal(err)
	}
	if err := sim.WaitDelivered(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sink to catch up", 60*time.Second, func() bool {
		return scrape(client, base+"/metrics", `edgepipe_rtld_sink_lag_entries{sink="clickhouse"}`) == 0
	})
	conn := ch.Conn(t)
	var final, raw uint64
	waitFor(t, "every record in ClickHouse", 60*time.Second, func() bool {
		err := conn.QueryRow(ctx, "SELECT count() FROM logs.access_logs FINAL").Scan(&final)
		return err == nil && final >= total
	})
	if err := conn.QueryRow(ctx, "SELECT count() FROM logs.access_logs").Scan(&raw); err != nil {
		t.Fatal(err)
	}
	st := sim.Delivered()
	t.Logf("simulator %+v; ClickHouse %d rows, %d under FINAL", st, raw, final)
	if st.RecordsGenerated != total || final != total {
		t.Fatalf("count() FINAL %d, simulator generated %d; want %d", final, st.RecordsGenerated, total)
	}
	if raw != final {
		rows, err := conn.Query(ctx, "SELECT agent_id, seq_num, count(), uniqExact(received_at), uniqExact(insert_version) FROM logs.access_logs GROUP BY agent_id, seq_num HAVING count() > 200")
		if err == nil {
			for rows.Next() {
				var agent string
				var seq int64
				var n, recv, ver uint64
				_ = rows.Scan(&agent, &seq, &n, &recv, &ver)
				t.Logf("agent %s seq %d: %d rows, %d received_at, %d insert versions", agent, seq, n, recv, ver)
			}
			rows.Close()
		}
		t.Errorf("count() %d without FINAL, %d with: duplicates", raw, final)
	}
}
