package receiver_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestEndToEndExactlyOnceThroughCrashesAndOutages is the receiver's main
// must-show: 50,000 records delivered by the simulator over HTTPS land
// exactly once in ClickHouse (count() under FINAL) and at least once in
// Kafka with every uuid present (checked with franz-go and with kcat),
// while the receiver is killed with SIGKILL once, ClickHouse is stopped for
// a while and the Kafka broker is down for a while. The simulator also
// drops some acknowledgements, so the receiver sees duplicate batches.
func TestEndToEndExactlyOnceThroughCrashesAndOutages(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	const total = 50_000
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)
	kafka := testenv.Kafka(t)
	topic := "cdn-access-logs"
	cert := newTestCert(t)

	sim, apiURL := startSimulator(t, cert, platformsim.Config{
		Seed: 7, Properties: 1, Environments: 1,
		Delivery: platformsim.DeliveryConfig{
			BatchSize: 500, AgentsPerEnvironment: 3, RetryInterval: 100 * time.Millisecond,
			RequestTimeout: 10 * time.Second,
			Faults:         platformsim.DeliveryFaults{DropAckPercent: 5},
		},
	})
	env := sim.EnvironmentIDs()[0]
	p, base := startSimulatedReceiver(t, cert, apiURL, []string{env},
		"--kafka.brokers="+kafka.Addr(), "--kafka.topic="+topic, "--kafka.partitions=3",
		"--clickhouse.dsn="+ch.DSN(db), "--spool.dir="+filepath.Join(t.TempDir(), "spool"),
		"--spool.segment-bytes=4MiB", "--ingest.max-decoded-bytes=8MiB", "--ingest.max-body-bytes=4MiB",
	)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cert.pool}}, Timeout: 30 * time.Second}
	metrics := base + "/metrics"
	accepted := func() float64 {
		return scrape(client, metrics, `edgepipe_rtld_records_received_total{status="accepted"}`)
	}

	profile := waitProfile(ctx, t, apiURL, env)

	// Phase 1: a crash in the middle of a delivery.
	if err := sim.DeliverRecords(ctx, profile, 20_000); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "records to arrive before the crash", 30*time.Second, func() bool { return accepted() >= 6_000 })
	p.kill9()
	t.Logf("receiver killed with SIGKILL; simulator stats %+v", sim.Delivered())
	time.Sleep(300 * time.Millisecond) // the platform's retries fail meanwhile
	p.start()
	waitFor(t, "the restarted receiver", 30*time.Second, func() bool { return accepted() >= 0 })

	// Phase 2: ClickHouse down while batches arrive.
	ch.Stop()
	if err := sim.DeliverRecords(ctx, profile, 15_000); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if lag := scrape(client, metrics, `edgepipe_rtld_sink_lag_entries{sink="clickhouse"}`); lag <= 0 {
		t.Errorf("ClickHouse down, yet its sink lag is %v", lag)
	}
	ch.Start()

	// Phase 3: the Kafka broker down while batches arrive.
	kafka.Pause()
	if err := sim.DeliverRecords(ctx, profile, 15_000); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	kafka.Resume()

	if err := sim.WaitDelivered(ctx); err != nil {
		t.Fatal(err)
	}
	st := sim.Delivered()
	t.Logf("simulator: %+v", st)
	if st.RecordsGenerated != total || st.RecordsDropped != 0 {
		t.Fatalf("simulator generated %d and dropped %d records", st.RecordsGenerated, st.RecordsDropped)
	}
	uuids := map[string]bool{}
	for _, u := range sim.GeneratedUUIDs() {
		uuids[u] = true
	}
	if len(uuids) != total {
		t.Fatalf("simulator generated %d distinct uuids, want %d", len(uuids), total)
	}

	// Both sinks caught up: nothing is left behind in the spool. Wait for
	// it before reading the sinks: Kafka holds duplicates (at least once),
	// so its message count can reach the total while the sink is still
	// retrying after the broker's outage.
	waitFor(t, "both sinks to catch up", 90*time.Second, func() bool {
		return scrape(client, metrics, `edgepipe_rtld_sink_lag_entries{sink="kafka"}`) == 0 &&
			scrape(client, metrics, `edgepipe_rtld_sink_lag_entries{sink="clickhouse"}`) == 0
	})

	// ClickHouse: exactly once under FINAL.
	conn := ch.Conn(t)
	var final, distinct, raw uint64
	waitFor(t, "every record in ClickHouse", 90*time.Second, func() bool {
		if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT count(), uniqExact(uuid) FROM `%s`.access_logs FINAL", db)).Scan(&final, &distinct); err != nil {
			return false
		}
		return final >= total
	})
	_ = conn.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM `%s`.access_logs", db)).Scan(&raw)
	t.Logf("ClickHouse: %d rows, %d under FINAL, %d distinct uuids", raw, final, distinct)
	if final != total || distinct != total {
		t.Fatalf("ClickHouse FINAL: %d rows and %d distinct uuids, want %d of each", final, distinct, total)
	}

	// Kafka: at least once, every uuid present.
	recs := kafka.WaitForRecords(t, topic, total, 90*time.Second)
	inKafka := map[string]bool{}
	for _, r := range recs {
		var v struct {
			UUID string `json:"uuid"`
		}
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("Kafka value is not a record: %v", err)
		}
		inKafka[v.UUID] = true
	}
	missing := 0
	for u := range uuids {
		if !inKafka[u] {
			missing++
		}
	}
	t.Logf("Kafka: %d messages, %d distinct uuids, %d missing", len(recs), len(inKafka), missing)
	if missing != 0 {
		t.Fatalf("%d uuids missing from Kafka", missing)
	}

	// kcat (librdkafka) sees the same records, with their headers.
	kc := kafka.KcatConsume(t, topic)
	inKcat := map[string]bool{}
	for _, m := range kc {
		if m.Payload == nil {
			continue
		}
		var v struct {
			UUID string `json:"uuid"`
		}
		if err := json.Unmarshal([]byte(*m.Payload), &v); err != nil {
			t.Fatalf("kcat payload: %v", err)
		}
		inKcat[v.UUID] = true
		if e, _ := m.Header("environment_id"); e != env {
			t.Fatalf("kcat message without environment_id header: %+v", m.Headers)
		}
	}
	if len(kc) != len(recs) || len(inKcat) != total {
		t.Fatalf("kcat saw %d messages (%d uuids), franz-go %d", len(kc), len(inKcat), len(recs))
	}

	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := client.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d", path, resp.StatusCode)
		}
	}

	// Ingest refusals on the live receiver: nothing is stored for them.
	before := accepted()
	ingest := base + "/ingest/" + env
	good := gzipBytes(t, []byte(`[{"uuid":"refused"}]`))
	if code, body := postBatch(t, client, ingest, simRTLDUser, "wrong", good, true); code != http.StatusUnauthorized {
		t.Errorf("wrong password: %d %s", code, body)
	}
	if code, body := postBatch(t, client, ingest, simRTLDUser, simRTLDPass, gzipBytes(t, []byte(`[{"uuid":`)), true); code != http.StatusBadRequest {
		t.Errorf("malformed body: %d %s", code, body)
	}
	if code, body := postBatch(t, client, ingest, simRTLDUser, simRTLDPass, make([]byte, 5<<20), false); code != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %d %s", code, body)
	}
	heapBefore := scrape(client, metrics, "go_memstats_heap_sys_bytes")
	if code, body := postBatch(t, client, ingest, simRTLDUser, simRTLDPass, gzipBomb(t, 256), true); code != http.StatusRequestEntityTooLarge {
		t.Errorf("gzip bomb: %d %s", code, body)
	}
	heapAfter := scrape(client, metrics, "go_memstats_heap_sys_bytes")
	t.Logf("heap from the OS: %.0f MiB before the 256 MiB gzip bomb, %.0f MiB after", heapBefore/(1<<20), heapAfter/(1<<20))
	if heapAfter-heapBefore > 96<<20 {
		t.Errorf("gzip bomb grew the receiver's heap by %.0f MiB", (heapAfter-heapBefore)/(1<<20))
	}
	if after := accepted(); after != before {
		t.Errorf("refused requests stored records: %v -> %v", before, after)
	}
	if n := scrape(client, metrics, `edgepipe_rtld_batches_received_total{status="unauthorized"}`); n < 1 {
		t.Errorf("unauthorized counter %v", n)
	}

	if err := p.stop(); err != nil {
		t.Fatalf("receiver exit: %v", err)
	}
}
