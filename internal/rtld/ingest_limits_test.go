package rtld

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// bigBatch is a json_lines body of about n bytes.
func bigBatch(n int) string {
	line := `{"uuid":"` + strings.Repeat("u", 100) + `"}` + "\n"
	return strings.Repeat(line, n/len(line))
}

// TestIngestMemoryBudget: while one batch holds the memory budget, another
// waits QueueWait and gets 503 with Retry-After; the memory comes back.
func TestIngestMemoryBudget(t *testing.T) {
	block := make(chan struct{})
	sp := &memSpool{block: block, entered: make(chan struct{}, 1)}
	cfg := IngestConfig{MaxBodyBytes: 1 << 20, MaxDecodedBytes: 4 << 20, QueueWait: 200 * time.Millisecond, RetryAfter: 2 * time.Second}
	cfg.MaxMemoryBytes = MinMemoryBytes(cfg.MaxBodyBytes, cfg.MaxDecodedBytes) // one big batch at a time
	srv, m := newTestIngest(t, cfg, sp, nil)
	body := gz(t, bigBatch(3<<20))
	first := make(chan int)
	go func() {
		resp, _ := post(t, srv.URL+"/ingest/env", "rtld", "s3cret", body, true)
		first <- resp.StatusCode
	}()
	<-sp.entered // the first batch is decoded and waits in the spool
	if got := testutil.ToFloat64(m.memory); got < 3<<20 {
		t.Fatalf("memory gauge %v while a 3 MiB batch is in flight", got)
	}
	start := time.Now()
	resp, out := post(t, srv.URL+"/ingest/env", "rtld", "s3cret", body, true)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "2" || !strings.Contains(fmt.Sprint(out["error"]), "memory") {
		t.Fatalf("second batch beyond the budget: %d %v Retry-After %q", resp.StatusCode, out, resp.Header.Get("Retry-After"))
	}
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Fatalf("answered after %s, before QueueWait", waited)
	}
	close(block)
	if s := <-first; s != 200 {
		t.Fatalf("first batch: %d", s)
	}
	if got := testutil.ToFloat64(m.memory); got != 0 {
		t.Fatalf("memory gauge %v after every request finished", got)
	}
	resp, _ = post(t, srv.URL+"/ingest/env", "rtld", "s3cret", body, true)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("batch after the memory came back: %d", resp.StatusCode)
	}
}

// TestIngestSlowSendersHoldNoSlot: senders that trickle their bodies do
// not take ingest slots (one slot here), so an honest poster gets through;
// the slow ones are cut off after BodyTimeout with 408.
func TestIngestSlowSendersHoldNoSlot(t *testing.T) {
	sp := &memSpool{}
	srv, _ := newTestIngest(t, IngestConfig{MaxInFlight: 1, BodyTimeout: 1500 * time.Millisecond, QueueWait: 100 * time.Millisecond}, sp, nil)
	addr := strings.TrimPrefix(srv.URL, "http://")
	const slow = 5
	var wg sync.WaitGroup
	statuses := make(chan string, slow)
	for i := 0; i < slow; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				statuses <- err.Error()
				return
			}
			defer c.Close()
			answer := make(chan string, 1)
			go func() {
				if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
					answer <- err.Error()
					return
				}
				line, _ := bufio.NewReader(c).ReadString('\n')
				answer <- strings.TrimSpace(line)
			}()
			fmt.Fprintf(c, "POST /ingest/env HTTP/1.1\r\nHost: x\r\nAuthorization: Basic cnRsZDpzM2NyZXQ=\r\nContent-Length: 100\r\n\r\n")
			for j := 0; j < 30; j++ { // 1 byte every 100ms: never finishes in time
				select {
				case a := <-answer:
					statuses <- a
					return
				case <-time.After(100 * time.Millisecond):
				}
				if _, err := c.Write([]byte{' '}); err != nil {
					break
				}
			}
			statuses <- <-answer
		}()
	}
	time.Sleep(200 * time.Millisecond) // the slow senders are mid-body
	for i := 0; i < 10; i++ {
		resp, out := post(t, srv.URL+"/ingest/env", "rtld", "s3cret", gz(t, fmt.Sprintf(envelopeFmt, i)), true)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("honest batch %d: %d %v", i, resp.StatusCode, out)
		}
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if !strings.Contains(s, "408") {
			t.Errorf("slow sender answered %q, want 408", s)
		}
	}
}
