package receiver_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestKafkaWrongPasswordKeepsBatchesUntilFixed runs the receiver binary
// against a SASL (SCRAM-SHA-256) broker with a wrong password: batches are
// still accepted and kept in the spool, the Kafka worker keeps retrying with
// a clear error in the log (never the password), and after a restart with
// the right password every record arrives.
func TestKafkaWrongPasswordKeepsBatchesUntilFixed(t *testing.T) {
	const (
		topic     = "sasl-e2e"
		env       = "0f6c2a9e-2222-4b1d-8f6e-00000000abcd"
		wrongPass = "wrong-kafka-pass-4711"
		batches   = 3
		perBatch  = 10
	)
	kafka := testenv.Kafka(t, testenv.KafkaSASL(testenv.KafkaUser{Mechanism: "SCRAM-SHA-256", Username: "edgepipe", Password: "right-kafka-pass"}))
	addr := testenv.FreeAddr(t)
	args := []string{
		"--no-register", "--environment-id=" + env, "--web.listen-address=" + addr, "--spool.dir=" + t.TempDir(),
		"--kafka.brokers=" + kafka.Addr(), "--kafka.topic=" + topic, "--kafka.partitions=1",
		"--kafka.sasl.mechanism=scram-sha-256", "--log.level=debug",
	}
	secrets := []string{"EDGEPIPE_RTLD_USERNAME=platform", "EDGEPIPE_RTLD_PASSWORD=ingest-pass", "EDGEPIPE_KAFKA_USERNAME=edgepipe"}
	p := startReceiver(t, args, append(secrets, "EDGEPIPE_KAFKA_PASSWORD="+wrongPass))

	base := "http://" + addr
	client := &http.Client{Timeout: 10 * time.Second}
	waitFor(t, "the receiver to listen", 30*time.Second, func() bool {
		resp, err := client.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	for b := 0; b < batches; b++ {
		var recs []string
		for i := 0; i < perBatch; i++ {
			recs = append(recs, fmt.Sprintf(`{"uuid":"sasl-%d-%d"}`, b, i))
		}
		body := gzipBytes(t, []byte("["+strings.Join(recs, ",")+"]"))
		if code, resp := postBatch(t, client, base+"/ingest/"+env, "platform", "ingest-pass", body, true); code/100 != 2 {
			t.Fatalf("batch %d: %d %s (ingest must not depend on Kafka)", b, code, resp)
		}
	}
	metrics := base + "/metrics"
	waitFor(t, "the Kafka worker to fail and retry", 30*time.Second, func() bool {
		return scrape(client, metrics, `edgepipe_rtld_sink_errors_total{sink="kafka"}`) >= 2
	})
	if lag := scrape(client, metrics, `edgepipe_rtld_sink_lag_entries{sink="kafka"}`); lag < batches {
		t.Errorf("Kafka lag %v entries, want the %d undelivered batches kept", lag, batches)
	}
	if recs := kafka.Records(t, topic); len(recs) != 0 {
		t.Fatalf("%d records reached Kafka with a wrong password", len(recs))
	}
	if err := p.stop(); err != nil {
		t.Fatalf("stopping the receiver: %v", err)
	}
	logs := p.logs()
	if !strings.Contains(logs, "SASL authentication failed") {
		t.Errorf("the log does not say that SASL authentication failed:\n%s", logs)
	}
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "SASL") {
			t.Logf("receiver log: %s", line)
			break
		}
	}
	if strings.Contains(logs, wrongPass) || strings.Contains(logs, "ingest-pass") {
		t.Fatalf("the log holds a password:\n%s", logs)
	}

	// Fixed credentials, same spool: everything accepted earlier arrives.
	p.env = append(slices.Clone(secrets), "EDGEPIPE_KAFKA_PASSWORD=right-kafka-pass")
	p.start()
	recs := kafka.WaitForRecords(t, topic, batches*perBatch, 60*time.Second)
	seen := map[string]bool{}
	for _, r := range recs {
		var v struct {
			UUID string `json:"uuid"`
		}
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("value %q: %v", r.Value, err)
		}
		seen[v.UUID] = true
	}
	if len(seen) != batches*perBatch {
		t.Fatalf("%d distinct records in Kafka, want %d", len(seen), batches*perBatch)
	}
	waitFor(t, "the Kafka lag to drain", 30*time.Second, func() bool {
		return scrape(client, metrics, `edgepipe_rtld_sink_lag_entries{sink="kafka"}`) == 0
	})
}
