package receiver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/rtld/receiver"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/logtable"
	kafkasink "github.com/edgepipe/edgepipe/internal/sinks/kafka"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// incompressible returns n random base64 characters (lz4 cannot shrink them).
func incompressible(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, 1))
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

// TestRecordTooLargeForKafkaIsDeadLetteredAndReplayed is issue 9's Kafka
// must-show, on the receiver binary: the broker takes at most 100,000 bytes
// (message.max.bytes), 80 batches arrive with one 200 KB incompressible
// record in the middle. Every other record reaches Kafka (read back with
// kcat), the big one reaches ClickHouse and the Kafka dead-letter store,
// ingest never answers 503, and the metric counts 1. After the broker's
// limit is raised, `dead-letter replay --sink kafka` (run while the
// receiver runs) delivers it and empties the store.
func TestRecordTooLargeForKafkaIsDeadLetteredAndReplayed(t *testing.T) {
	const (
		env      = "0f6c2a9e-9999-4b1d-8f6e-00000000beef"
		topic    = "access-logs-dl"
		batches  = 80
		perBatch = 20
		bigAt    = 40 // the batch with the big record
		bigIndex = 7  // its position there
	)
	kafka := testenv.Kafka(t, testenv.KafkaBrokerConfigs(map[string]string{"message.max.bytes": "100000"}))
	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)
	addr := testenv.FreeAddr(t)
	spoolDir := filepath.Join(t.TempDir(), "spool")
	sinkFlags := []string{"--spool.dir=" + spoolDir, "--kafka.brokers=" + kafka.Addr(), "--kafka.topic=" + topic, "--clickhouse.dsn=" + ch.DSN(db)}
	secrets := []string{"EDGEPIPE_RTLD_USERNAME=platform", "EDGEPIPE_RTLD_PASSWORD=ingest-pass"}
	startReceiver(t, append([]string{"--no-register", "--environment-id=" + env, "--web.listen-address=" + addr, "--kafka.partitions=3"}, sinkFlags...), secrets)
	base := "http://" + addr
	client := &http.Client{Timeout: 30 * time.Second}
	waitReady(t, client, base)

	bigUUID := fmt.Sprintf("rec-%d-%d", bigAt, bigIndex)
	for b := 0; b < batches; b++ {
		var recs []string
		for i := 0; i < perBatch; i++ {
			uuid := fmt.Sprintf("rec-%d-%d", b, i)
			pad := fmt.Sprintf("/static/%d/%d.css", b, i)
			if uuid == bigUUID {
				pad = incompressible(9, 200_000)
			}
			recs = append(recs, fmt.Sprintf(`{"uuid":%q,"status_code":200,"path":%q,"host":"www.example.com"}`, uuid, pad))
		}
		code, body := postBatch(t, client, base+"/ingest/"+env, "platform", "ingest-pass", gzipBytes(t, jsonBatch(fmt.Sprintf("agent-%d", b%4), b/4, recs)), true)
		if code != http.StatusOK {
			t.Fatalf("batch %d: %d %s", b, code, body)
		}
	}
	metrics := base + "/metrics"
	waitFor(t, "both sinks to drain the spool", 90*time.Second, func() bool {
		return scrape(client, metrics, `edgepipe_rtld_sink_lag_entries{sink="kafka"}`) == 0 &&
			scrape(client, metrics, `edgepipe_rtld_sink_lag_entries{sink="clickhouse"}`) == 0
	})
	if n := scrape(client, metrics, `edgepipe_rtld_batches_received_total{status="unavailable"}`); n > 0 {
		t.Fatalf("ingest answered 503 %v times", n)
	}
	if n := scrape(client, metrics, `edgepipe_rtld_dead_letter_records_total{reason="message_too_large",sink="kafka"}`); n != 1 {
		t.Fatalf("edgepipe_rtld_dead_letter_records_total{sink=kafka} = %v, want 1", n)
	}
	if n := scrape(client, metrics, `edgepipe_rtld_dead_letter_stored_records{sink="kafka"}`); n != 1 {
		t.Fatalf("edgepipe_rtld_dead_letter_stored_records{sink=kafka} = %v, want 1", n)
	}

	// Kafka (read with kcat): every record but the big one.
	inKafka := func() map[string]testenv.KcatMessage {
		out := map[string]testenv.KcatMessage{}
		for _, m := range kafka.KcatConsume(t, topic) {
			var v struct {
				UUID string `json:"uuid"`
			}
			if m.Payload == nil || json.Unmarshal([]byte(*m.Payload), &v) != nil {
				t.Fatalf("message at %d/%d is not a record", m.Partition, m.Offset)
			}
			out[v.UUID] = m
		}
		return out
	}
	got := inKafka()
	if _, ok := got[bigUUID]; ok || len(got) != batches*perBatch-1 {
		t.Fatalf("Kafka holds %d distinct records (big one: %v), want the %d others", len(got), ok, batches*perBatch-1)
	}
	// ClickHouse: every record, the big one included.
	if n := ch.QueryUint64(t, "SELECT count() FROM "+db+".access_logs FINAL"); n != batches*perBatch {
		t.Fatalf("ClickHouse holds %d records, want %d", n, batches*perBatch)
	}
	if n := ch.QueryUint64(t, "SELECT count() FROM "+db+".access_logs FINAL WHERE uuid = '"+bigUUID+"' AND length(path) = 200000"); n != 1 {
		t.Fatalf("the big record is not in ClickHouse whole (%d rows)", n)
	}
	// The store, as an operator sees it.
	out, err := runCommand(t, append([]string{"dead-letter", "list"}, sinkFlags...), nil)
	if err != nil || !strings.Contains(out, "message_too_large") || !strings.Contains(out, "kafka: 1 record(s)") || !strings.Contains(out, "seq 10") {
		t.Fatalf("dead-letter list: %v\n%s", err, out)
	}
	t.Logf("dead-letter list:\n%s", out)
	out, err = runCommand(t, append([]string{"dead-letter", "list", "--json"}, sinkFlags...), nil)
	var letter struct {
		Sink        string          `json:"sink"`
		Reason      string          `json:"reason"`
		Error       string          `json:"error"`
		AgentID     string          `json:"agent_id"`
		SeqNum      int             `json:"seq_num"`
		RecordIndex int             `json:"record_index"`
		Record      json.RawMessage `json:"record"`
	}
	if err != nil || json.Unmarshal([]byte(strings.TrimSpace(out)), &letter) != nil || letter.Sink != "kafka" || letter.SeqNum != bigAt/4 ||
		letter.AgentID != fmt.Sprintf("agent-%d", bigAt%4) || letter.RecordIndex != bigIndex || !strings.Contains(string(letter.Record), bigUUID) ||
		!strings.Contains(letter.Error, "Message Size Too Large") {
		t.Fatalf("dead-letter list --json: %v\n%.400s", err, out)
	}

	// The operator raises the broker's limit and replays, receiver running.
	kafka.SetBrokerConfig(t, "message.max.bytes", "1048588")
	out, err = runCommand(t, append([]string{"dead-letter", "replay", "--sink", "kafka"}, sinkFlags...), secrets)
	if err != nil || !strings.Contains(out, "1 record(s) delivered and removed, 0 rejected again") {
		t.Fatalf("dead-letter replay: %v\n%s", err, out)
	}
	t.Logf("dead-letter replay:\n%s", out)
	got = inKafka()
	m, ok := got[bigUUID]
	if !ok || len(got) != batches*perBatch {
		t.Fatalf("after the replay Kafka holds %d distinct records (big one: %v), want %d", len(got), ok, batches*perBatch)
	}
	if idx, _ := m.Header("record_index"); idx != strconv.Itoa(bigIndex) {
		t.Errorf("replayed message has record_index %q, want %d", idx, bigIndex)
	}
	if seq, _ := m.Header("seq_num"); seq != strconv.Itoa(bigAt/4) {
		t.Errorf("replayed message has seq_num %q, want %d", seq, bigAt/4)
	}
	if m.Key == nil || *m.Key != env+"/"+letter.AgentID || len(*m.Payload) < 200_000 {
		t.Errorf("replayed message key %v, payload %d bytes", m.Key, len(*m.Payload))
	}
	if out, err := runCommand(t, append([]string{"dead-letter", "list"}, sinkFlags...), nil); err != nil || !strings.Contains(out, "no dead letters") {
		t.Fatalf("dead-letter list after the replay: %v\n%s", err, out)
	}
	if n := scrape(client, metrics, `edgepipe_rtld_dead_letter_stored_records{sink="kafka"}`); n > 0 {
		t.Fatalf("the running receiver still reports %v stored dead letters", n)
	}
}

// inProcessReceiver runs a receiver in-process behind an httptest server
// until the test ends.
func inProcessReceiver(t *testing.T, cfg receiver.Config) (*receiver.Receiver, string) {
	t.Helper()
	if cfg.SpoolDir == "" {
		cfg.SpoolDir = t.TempDir()
	}
	cfg.Ingest.Username, cfg.Ingest.Password = "u", "p"
	rcv, err := receiver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rcv.Check(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rcv.Handler())
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- rcv.Run(runCtx) }()
	t.Cleanup(func() {
		srv.Close()
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return rcv, srv.URL
}

// drained reports whether every sink has delivered everything spooled.
func drained(rcv *receiver.Receiver) bool {
	for name, lag := range rcv.Spool().Stats().Readers {
		if name != rtld.GapReader && lag.Entries > 0 {
			return false
		}
	}
	return true
}

// TestClickHouseTableAsFound is issue 9's ClickHouse must-show on one
// running receiver (ClickHouse 18.16): an access_logs pre-created with
// status_code UInt16 and bytes_out UInt32 gets exact counts and sums;
// timestamps outside DateTime's range leave the column at its default and
// keep their raw value in extra; `DROP TABLE access_logs` while it runs is
// survived without a restart: the table is re-created and every batch
// acknowledged after the drop lands.
func TestClickHouseTableAsFound(t *testing.T) {
	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)
	ch.Exec(t, "CREATE TABLE "+db+".access_logs (environment_id String, agent_id String, datestamp String, seq_num Int64, "+
		"record_key String, record_index UInt32, profile_id String, format String, received_at DateTime, extra String, insert_version UInt64, "+
		"status_code UInt16, bytes_out UInt32) ENGINE = ReplacingMergeTree(insert_version) "+
		"ORDER BY (environment_id, profile_id, agent_id, datestamp, seq_num, record_key, record_index)")
	rcv, base := inProcessReceiver(t, receiver.Config{ClickHouse: &logtable.Config{DSN: ch.DSN(db)}})
	client := &http.Client{Timeout: 30 * time.Second}
	post := func(agent string, seq int, recs []string) {
		t.Helper()
		if code, body := postBatch(t, client, base+"/ingest/env", "u", "p", jsonBatch(agent, seq, recs), false); code != http.StatusOK {
			t.Fatalf("batch %s/%d: %d %s", agent, seq, code, body)
		}
	}

	// Narrower integer columns: exact counts and sums.
	const batches, per = 30, 100
	var sumStatus, sumBytes uint64
	for b := 0; b < batches; b++ {
		var recs []string
		for i := 0; i < per; i++ {
			status, bytes := []int{200, 204, 301, 404, 503}[(b+i)%5], uint64(4_000_000_000-b*1000-i) // near UInt32's top
			sumStatus += uint64(status)
			sumBytes += bytes
			recs = append(recs, fmt.Sprintf(`{"uuid":"n-%d-%d","timestamp":1763856000.25,"status_code":%d,"bytes_out":%d}`, b, i, status, bytes))
		}
		post("a", b, recs)
	}
	waitFor(t, "the batches in ClickHouse", 60*time.Second, func() bool { return drained(rcv) })
	var count, st, bo uint64
	if err := ch.Conn(t).QueryRow(context.Background(), "SELECT count(), sum(toUInt64(status_code)), sum(toUInt64(bytes_out)) FROM "+db+".access_logs FINAL").Scan(&count, &st, &bo); err != nil {
		t.Fatal(err)
	}
	if count != batches*per || st != sumStatus || bo != sumBytes {
		t.Fatalf("count %d, sum(status_code) %d, sum(bytes_out) %d; want %d, %d, %d", count, st, bo, batches*per, sumStatus, sumBytes)
	}
	t.Logf("UInt16/UInt32 columns: %d rows, sum(status_code) %d, sum(bytes_out) %d", count, st, bo)

	// Timestamps DateTime cannot hold.
	post("ts", 0, []string{`{"uuid":"ts-1","timestamp":5000000000.5}`, `{"uuid":"ts-2","timestamp":4294967296}`, `{"uuid":"ts-3","timestamp":-5}`, `{"uuid":"ts-4","timestamp":4294967295.5}`})
	waitFor(t, "the timestamp batch in ClickHouse", 60*time.Second, func() bool { return drained(rcv) })
	rows, err := ch.Conn(t).Query(context.Background(), "SELECT uuid, toUnixTimestamp(timestamp), timestamp_us, extra FROM "+db+".access_logs FINAL WHERE agent_id = 'ts' ORDER BY uuid")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var uuid, extra string
		var ts, us uint32
		if err := rows.Scan(&uuid, &ts, &us, &extra); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %d %d %s", uuid, ts, us, extra))
	}
	rows.Close()
	want := []string{
		`ts-1 0 0 {"timestamp":5000000000.5}`,
		`ts-2 0 0 {"timestamp":4294967296}`,
		`ts-3 0 0 {"timestamp":-5}`,
		`ts-4 4294967295 500000 `,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("timestamps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// DROP TABLE while the receiver runs.
	ch.Exec(t, "DROP TABLE "+db+".access_logs")
	const after = 12
	for b := 0; b < after; b++ {
		var recs []string
		for i := 0; i < per; i++ {
			recs = append(recs, fmt.Sprintf(`{"uuid":"d-%d-%d","status_code":200,"bytes_out":1}`, b, i))
		}
		post("d", b, recs)
	}
	waitFor(t, "the batches acknowledged after the drop in the re-created table", 60*time.Second, func() bool {
		return drained(rcv) && ch.QueryUint64(t, "SELECT count() FROM system.tables WHERE database = '"+db+"' AND name = 'access_logs'") == 1
	})
	if n := ch.QueryUint64(t, "SELECT count() FROM "+db+".access_logs FINAL"); n != after*per {
		t.Fatalf("re-created table holds %d rows, want the %d acknowledged after the drop", n, after*per)
	}
	if n := ch.QueryUint64(t, "SELECT toUInt64(sum(bytes_out)) FROM "+db+".access_logs FINAL"); n != after*per {
		t.Fatalf("sum(bytes_out) = %d", n)
	}
}

// TestInvalidUTF8IsRefused: the three shapes of bad UTF-8 get 400
// (malformed, with the offset) whatever the encoding, and nothing of them
// reaches Kafka or ClickHouse; a valid batch after them does.
func TestInvalidUTF8IsRefused(t *testing.T) {
	kafka := testenv.Kafka(t)
	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)
	rcv, base := inProcessReceiver(t, receiver.Config{
		Kafka:      &kafkasink.Config{Brokers: kafka.Brokers(), Topic: "utf8", CreateTopic: true},
		ClickHouse: &logtable.Config{DSN: ch.DSN(db)},
	})
	client := &http.Client{Timeout: 30 * time.Second}
	for _, tc := range []struct {
		name, body string
		offset     int
	}{
		{"bad byte", "[{\"uuid\":\"x1\",\"path\":\"/\xff\xfe\"}]", 23},
		{"cut sequence", "[{\"uuid\":\"x2\",\"path\":\"/caf\xc3\"}]", 26},
		{"bad byte in a key", "[{\"uuid\":\"x3\",\"pa\xfeth\":\"/\"}]", 17},
	} {
		for _, gz := range []bool{false, true} {
			body := []byte(tc.body)
			if gz {
				body = gzipBytes(t, body)
			}
			code, resp := postBatch(t, client, base+"/ingest/env", "u", "p", body, gz)
			var e struct {
				Error  string `json:"error"`
				Offset *int   `json:"offset"`
			}
			_ = json.Unmarshal([]byte(resp), &e)
			if code != http.StatusBadRequest || e.Offset == nil || *e.Offset != tc.offset || !strings.Contains(e.Error, "UTF-8") {
				t.Errorf("%s (gzip %v): %d %s, want 400 naming offset %d", tc.name, gz, code, resp, tc.offset)
			}
		}
	}
	if code, resp := postBatch(t, client, base+"/ingest/env", "u", "p", []byte(`[{"uuid":"ok","path":"/café"}]`), false); code != http.StatusOK {
		t.Fatalf("valid batch: %d %s", code, resp)
	}
	waitFor(t, "the valid batch delivered", 60*time.Second, func() bool { return drained(rcv) })
	if recs := kafka.Records(t, "utf8"); len(recs) != 1 || !strings.Contains(string(recs[0].Value), `"ok"`) {
		t.Fatalf("Kafka holds %d records", len(recs))
	}
	if n := ch.QueryUint64(t, "SELECT count() FROM "+db+".access_logs"); n != 1 {
		t.Fatalf("ClickHouse holds %d rows, want 1", n)
	}
	if n := scrape(client, base+"/metrics", `edgepipe_rtld_batches_received_total{status="malformed"}`); n != 6 {
		t.Fatalf("malformed batches counted: %v, want 6", n)
	}
}

// TestReceiverRefusesToStart: an access_logs column of a type that cannot
// hold its field, and a record limit Kafka cannot take, stop the binary at
// start with an error that names the column, or both flags.
func TestReceiverRefusesToStart(t *testing.T) {
	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)
	ch.Exec(t, "CREATE TABLE "+db+".access_logs (environment_id String, status_code Date, extra String) ENGINE = MergeTree ORDER BY environment_id")
	secrets := []string{"EDGEPIPE_RTLD_USERNAME=platform", "EDGEPIPE_RTLD_PASSWORD=ingest-pass"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"incompatible column", []string{"--clickhouse.dsn=" + ch.DSN(db)}, []string{"column status_code", "type Date"}},
		{"record limit over the Kafka limit", []string{"--kafka.brokers=127.0.0.1:1", "--ingest.max-record-bytes=4MiB"}, []string{"--ingest.max-record-bytes", "--kafka.max-message-bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--no-register", "--environment-id=env", "--web.listen-address=" + testenv.FreeAddr(t), "--spool.dir=" + t.TempDir()}, tc.args...)
			out, err := runCommand(t, args, secrets)
			if err == nil {
				t.Fatalf("the receiver started:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Fatalf("the error does not name %q:\n%s", w, out)
				}
			}
			t.Logf("%s", strings.TrimSpace(out))
		})
	}
}
