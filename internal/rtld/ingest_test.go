package rtld

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	kgzip "github.com/klauspost/compress/gzip"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

type memSpool struct {
	mu      sync.Mutex
	entries [][]byte
	full    bool
	block   chan struct{}
	entered chan struct{}
}

func (m *memSpool) AppendPayload(_ context.Context, p spool.Payload) error {
	if m.block != nil {
		m.entered <- struct{}{}
		<-m.block
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.full {
		return spool.ErrFull
	}
	var b bytes.Buffer
	n, err := p.WriteTo(&b)
	if err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	if n != int64(p.Size()) {
		return fmt.Errorf("payload wrote %d of %d bytes", n, p.Size())
	}
	m.entries = append(m.entries, b.Bytes())
	return nil
}

func (m *memSpool) Full() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.full }

func (m *memSpool) len() int { m.mu.Lock(); defer m.mu.Unlock(); return len(m.entries) }

type seenSet map[string]bool

func (s seenSet) Claim(_ context.Context, b *accesslog.Batch, _ time.Duration) (*BatchClaim, error) {
	if s[fmt.Sprint(b.EnvironmentID, b.AgentID, b.Datestamp, b.SeqNum)] {
		return nil, ErrDuplicate
	}
	return nil, nil
}
func (s seenSet) CountDuplicate(_, _ string) {}

func gz(t testing.TB, s string) []byte {
	var b bytes.Buffer
	w := kgzip.NewWriter(&b)
	if _, err := io.WriteString(w, s); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return b.Bytes()
}

func newTestIngest(t *testing.T, cfg IngestConfig, sp Spooler, dups DuplicateChecker) (*httptest.Server, *Metrics) {
	t.Helper()
	cfg.Username, cfg.Password = "rtld", "s3cret"
	m := NewMetrics(prometheus.NewRegistry())
	in, err := NewIngest(cfg, sp, dups, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	in.Register(r)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv, m
}

// answer is what post keeps of a response, whose body it reads and closes.
type answer struct {
	StatusCode int
	Header     http.Header
}

func post(t *testing.T, url, user, pass string, body []byte, gzipped bool) (answer, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(user, pass)
	if gzipped {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return answer{StatusCode: resp.StatusCode, Header: resp.Header}, out
}

const envelopeFmt = `{"account_number":"A","agent_id":"agent-1","datestamp":"20261123","platform":"p","profile_id":1,"seq_num":%d,"logs":[{"uuid":"u1"},{"uuid":"u2"}]}`

// truncatedGzip returns a gzip body of about 3 MiB of records cut in the
// middle of its compressed stream, at a place whose last 4 bytes, read as
// gzip's ISIZE trailer, announce more than limit decompressed bytes (what
// made ingest answer 413 "decompressed body exceeds" before).
func truncatedGzip(t *testing.T, limit int64) []byte {
	t.Helper()
	var recs []string
	for i := range 20000 {
		recs = append(recs, fmt.Sprintf(`{"uuid":"u-%d","n":%d}`, i, i*7919%100003))
	}
	whole := gz(t, "["+strings.Join(recs, ",")+"]")
	for cut := len(whole) / 2; cut < len(whole)-8; cut++ {
		if int64(binary.LittleEndian.Uint32(whole[cut-4:cut])) > limit {
			return whole[:cut]
		}
	}
	t.Fatal("no cut point whose tail exceeds the limit")
	return nil
}

func TestIngestAnswers(t *testing.T) {
	bomb := gz(t, "["+strings.Repeat(" ", 64<<20)+"]") // 64 MiB of spaces, ~64 KiB gzipped
	whole := gz(t, fmt.Sprintf(envelopeFmt, 1))
	for _, tc := range []struct {
		name    string
		user    string
		pass    string
		body    []byte
		gzip    bool
		status  int
		stored  int
		inError string
	}{
		{"accepted gzip json", "rtld", "s3cret", gz(t, fmt.Sprintf(envelopeFmt, 1)), true, 200, 1, ""},
		{"accepted identity json_lines", "rtld", "s3cret", []byte("{\"a\":1}\n{\"a\":2}\n"), false, 200, 1, ""},
		{"wrong password", "rtld", "s3cre", gz(t, fmt.Sprintf(envelopeFmt, 1)), true, 401, 0, "credentials"},
		{"wrong user", "rtl", "s3cret", gz(t, fmt.Sprintf(envelopeFmt, 1)), true, 401, 0, "credentials"},
		{"malformed json", "rtld", "s3cret", gz(t, "[{\"a\":1},\n{\"b\":}]"), true, 400, 0, "line 2"},
		{"broken gzip", "rtld", "s3cret", []byte("not gzip at all"), true, 400, 0, "gzip"},
		{"oversized body", "rtld", "s3cret", bytes.Repeat([]byte(" "), 2<<20), false, 413, 0, "exceeds 1048576 bytes"},
		{"gzip bomb", "rtld", "s3cret", bomb, true, 413, 0, "decompressed body exceeds"},
		{"truncated gzip, tail above the limit", "rtld", "s3cret", truncatedGzip(t, 4<<20), true, 400, 0, "gzip body is truncated"},
		{"truncated gzip, small tail", "rtld", "s3cret", whole[:len(whole)/2], true, 400, 0, "gzip body is truncated"},
		{"gzip trailer cut", "rtld", "s3cret", whole[:len(whole)-3], true, 400, 0, "gzip body is truncated"},
		{"gzip header cut", "rtld", "s3cret", whole[:5], true, 400, 0, "gzip body is truncated"},
		{"empty gzip body", "rtld", "s3cret", nil, true, 400, 0, "gzip body is truncated: it is empty"},
		{"corrupt gzip checksum", "rtld", "s3cret", corruptCRC(whole), true, 400, 0, "invalid gzip body"},
		{"record too large", "rtld", "s3cret", gz(t, `[{"a":"`+strings.Repeat("x", 600<<10)+`"}]`), true, 413, 0, "record 0 is"},
		{"duplicate", "rtld", "s3cret", gz(t, fmt.Sprintf(envelopeFmt, 9)), true, 200, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := &memSpool{}
			srv, _ := newTestIngest(t, IngestConfig{MaxBodyBytes: 1 << 20, MaxDecodedBytes: 4 << 20}, sp, seenSet{"envagent-1202611239": true})
			resp, body := post(t, srv.URL+"/ingest/env", tc.user, tc.pass, tc.body, tc.gzip)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%v), want %d", resp.StatusCode, body, tc.status)
			}
			if sp.len() != tc.stored {
				t.Fatalf("stored %d batches, want %d", sp.len(), tc.stored)
			}
			if tc.inError != "" && !strings.Contains(fmt.Sprint(body["error"]), tc.inError) {
				t.Fatalf("error %q does not mention %q", body["error"], tc.inError)
			}
			if tc.status == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Fatal("401 without WWW-Authenticate")
			}
		})
	}
}

// corruptCRC returns a copy of a gzip body with its CRC-32 trailer changed.
func corruptCRC(body []byte) []byte {
	out := bytes.Clone(body)
	out[len(out)-8] ^= 0xff
	return out
}

func TestIngestGzipBombKeepsHeapSmall(t *testing.T) {
	sp := &memSpool{}
	srv, _ := newTestIngest(t, IngestConfig{MaxBodyBytes: 1 << 20, MaxDecodedBytes: 1 << 20}, sp, nil)
	// 256 MiB of spaces inside an array: about 256 KiB gzipped.
	var b bytes.Buffer
	w, err := kgzip.NewWriterLevel(&b, kgzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("[")); err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte(" "), 1<<20)
	for range 256 {
		if _, err := w.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	peak := make(chan uint64)
	stop := make(chan struct{})
	go func() {
		var highest uint64
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			highest = max(highest, ms.HeapAlloc)
			select {
			case <-stop:
				peak <- highest
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	resp, body := post(t, srv.URL+"/ingest/env", "rtld", "s3cret", b.Bytes(), true)
	close(stop)
	highest := <-peak
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d (%v), want 413", resp.StatusCode, body)
	}
	// The compressed body itself is held by the test (~1 MiB); the server
	// may hold its limit plus buffers. 256 MiB decoded must never show up.
	if grown := int64(highest) - int64(before.HeapAlloc); grown > 64<<20 {
		t.Fatalf("heap grew by %d MiB decoding a gzip bomb", grown>>20)
	}
}

func TestIngestSpoolFullAndInFlight(t *testing.T) {
	sp := &memSpool{full: true}
	srv, m := newTestIngest(t, IngestConfig{MaxInFlight: 1, RetryAfter: 3 * time.Second}, sp, nil)
	resp, _ := post(t, srv.URL+"/ingest/env", "rtld", "s3cret", gz(t, fmt.Sprintf(envelopeFmt, 1)), true)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("full spool: status %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if got := testutil.ToFloat64(m.batches.WithLabelValues(StatusUnavailable)); got != 1 {
		t.Fatalf("unavailable counter = %v", got)
	}

	// One request blocks in the spool; the second is turned away.
	block := make(chan struct{})
	sp2 := &memSpool{block: block, entered: make(chan struct{}, 1)}
	srv2, _ := newTestIngest(t, IngestConfig{MaxInFlight: 1, QueueWait: 100 * time.Millisecond}, sp2, nil)
	done := make(chan int)
	go func() {
		resp, _ := post(t, srv2.URL+"/ingest/env", "rtld", "s3cret", gz(t, fmt.Sprintf(envelopeFmt, 1)), true)
		done <- resp.StatusCode
	}()
	<-sp2.entered
	resp, _ = post(t, srv2.URL+"/ingest/env", "rtld", "s3cret", gz(t, fmt.Sprintf(envelopeFmt, 2)), true)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("request beyond max in flight: status %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	close(block)
	if s := <-done; s != 200 {
		t.Fatalf("blocked request finished with %d", s)
	}
}

// TestIngestBodyCutShort: a sender whose connection ends before the
// Content-Length it announced gets 400 naming the cut, not a gzip error.
func TestIngestBodyCutShort(t *testing.T) {
	for _, gzipped := range []bool{true, false} {
		t.Run(fmt.Sprintf("gzip=%v", gzipped), func(t *testing.T) {
			sp := &memSpool{}
			srv, _ := newTestIngest(t, IngestConfig{}, sp, nil)
			body := []byte(fmt.Sprintf(envelopeFmt, 1))
			if gzipped {
				body = gz(t, string(body))
			}
			conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			req := fmt.Sprintf("POST /ingest/env HTTP/1.1\r\nHost: x\r\nAuthorization: Basic %s\r\nContent-Length: %d\r\n",
				base64.StdEncoding.EncodeToString([]byte("rtld:s3cret")), len(body)+100)
			if gzipped {
				req += "Content-Encoding: gzip\r\n"
			}
			if _, err := conn.Write(append([]byte(req+"\r\n"), body...)); err != nil {
				t.Fatal(err)
			}
			if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var out map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&out)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(fmt.Sprint(out["error"]), fmt.Sprintf("connection ended after %d bytes", len(body))) {
				t.Fatalf("status %d %v, want 400 naming the cut", resp.StatusCode, out)
			}
			if sp.len() != 0 {
				t.Fatal("a cut body was stored")
			}
		})
	}
}
