package receiver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/rtld/receiver"
	kafkasink "github.com/edgepipe/edgepipe/internal/sinks/kafka"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

var threeRecords = []string{`{"uuid":"r1","status_code":200}`, `{"uuid":"r2","status_code":200}`, `{"uuid":"r3","status_code":404}`}

// ingestStatus posts body and returns the HTTP status and the answer's
// status field; safe to call from any goroutine.
func ingestStatus(client *http.Client, url string, body []byte) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.SetBasicAuth("u", "p")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
	}
	data, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(data, &out)
	return resp.StatusCode, out.Status, nil
}

// TestCopiesOfABatchReachKafkaOnce: 16 copies of one json batch posted at
// once to a running receiver, and a resend right after the answers, store
// the batch once: 3 records accepted, 48 acknowledged as duplicates, and
// kcat reads 3 messages from the topic.
func TestCopiesOfABatchReachKafkaOnce(t *testing.T) {
	const copies = 16
	kafka := testenv.Kafka(t)
	rcv, base := inProcessReceiver(t, receiver.Config{
		Kafka:  &kafkasink.Config{Brokers: kafka.Brokers(), Topic: "copies", CreateTopic: true},
		Logger: slog.New(slog.DiscardHandler),
	})
	client := &http.Client{Timeout: 30 * time.Second}
	body := gzipBytes(t, jsonBatch("agent-1", 0, threeRecords))
	start := make(chan struct{})
	statuses := make(chan string, copies+1)
	var wg sync.WaitGroup
	for range copies {
		wg.Go(func() {
			<-start
			code, status, err := ingestStatus(client, base+"/ingest/env", body)
			if err != nil || code != http.StatusOK {
				t.Errorf("copy: %d %v", code, err)
			}
			statuses <- status
		})
	}
	close(start)
	wg.Wait()
	if code, status, err := ingestStatus(client, base+"/ingest/env", body); err != nil || code != http.StatusOK || status != rtld.StatusDuplicate {
		t.Errorf("the resend: %d %q %v, want 200 duplicate", code, status, err)
	}
	close(statuses)
	count := map[string]int{}
	for s := range statuses {
		count[s]++
	}
	if count[rtld.StatusAccepted] != 1 || count[rtld.StatusDuplicate] != copies-1 {
		t.Errorf("answers %v: want 1 accepted and %d duplicates", count, copies-1)
	}
	waitFor(t, "the batch delivered", 60*time.Second, func() bool { return drained(rcv) })
	if msgs := kafka.KcatConsume(t, "copies"); len(msgs) != len(threeRecords) {
		t.Fatalf("kcat read %d messages, want %d", len(msgs), len(threeRecords))
	}
	metrics := base + "/metrics"
	if n := scrape(client, metrics, `edgepipe_rtld_records_received_total{status="accepted"}`); n != 3 {
		t.Errorf("accepted records counted: %v, want 3", n)
	}
	if n := scrape(client, metrics, `edgepipe_rtld_records_received_total{status="duplicate"}`); n != 3*copies {
		t.Errorf("duplicate records counted: %v, want %d", n, 3*copies)
	}
}

// TestResendAfterRestartIsADuplicate: a batch the previous run spooled
// before its gap tracker saved (a crash that also lost the answer) and
// that the platform resends as soon as the receiver is back, before the
// tracker has read the spool, is answered as a duplicate, not stored again.
func TestResendAfterRestartIsADuplicate(t *testing.T) {
	cfg := receiver.Config{
		SpoolDir: t.TempDir(),
		Ingest:   rtld.IngestConfig{Username: "u", Password: "p"},
		Logger:   slog.New(slog.DiscardHandler),
	}
	body := gzipBytes(t, jsonBatch("agent-1", 0, threeRecords))

	first, err := receiver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(first.Handler())
	// Not running: its gap tracker never reads the batch.
	if code, status, err := ingestStatus(srv.Client(), srv.URL+"/ingest/env", body); err != nil || status != rtld.StatusAccepted {
		t.Fatalf("first copy: %d %q %v", code, status, err)
	}
	srv.Close()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second, err := receiver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv = httptest.NewServer(second.Handler())
	defer srv.Close()
	type answer struct {
		code   int
		status string
		err    error
	}
	resent := make(chan answer, 1)
	go func() {
		code, status, err := ingestStatus(srv.Client(), srv.URL+"/ingest/env", body)
		resent <- answer{code, status, err}
	}()
	time.Sleep(200 * time.Millisecond) // the resend arrives before the tracker runs
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- second.Run(ctx) }()
	defer func() {
		srv.Close()
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	if a := <-resent; a.err != nil || a.code != http.StatusOK || a.status != rtld.StatusDuplicate {
		t.Fatalf("the resend after the restart: %d %q %v, want 200 duplicate", a.code, a.status, a.err)
	}
	metrics := srv.URL + "/metrics"
	if n := scrape(srv.Client(), metrics, `edgepipe_rtld_records_received_total{status="accepted"}`); n > 0 {
		t.Fatalf("the restarted receiver accepted %v records, want none", n)
	}
	if n := scrape(srv.Client(), metrics, `edgepipe_rtld_records_received_total{status="duplicate"}`); n != 3 {
		t.Fatalf("the restarted receiver counted %v duplicate records, want 3", n)
	}
}
