package platformsim

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// fakeClock is a settable simulated clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// receivedPost is one POST the test receiver got.
type receivedPost struct {
	header http.Header
	body   []byte // as sent (gzip)
	sum    [32]byte
	status int
}

// testReceiver is an HTTPS endpoint recording every delivery. answer
// decides the status of each request from how often its body was seen
// before (0 for the first time); a status of -1 resets the connection after
// reading the body.
type testReceiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	posts  []receivedPost
	seen   map[[32]byte]int
	answer func(previous int) int
}

func newTestReceiver(t *testing.T, answer func(previous int) int) *testReceiver {
	t.Helper()
	tr := &testReceiver{seen: map[[32]byte]int{}, answer: answer}
	tr.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256(body)
		tr.mu.Lock()
		prev := tr.seen[sum]
		tr.seen[sum]++
		status := 200
		if tr.answer != nil {
			status = tr.answer(prev)
		}
		tr.posts = append(tr.posts, receivedPost{header: r.Header.Clone(), body: body, sum: sum, status: status})
		tr.mu.Unlock()
		if status == -1 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				if tc, ok := conn.(*tls.Conn); ok {
					_ = tc.NetConn().(interface{ SetLinger(int) error }).SetLinger(0)
				}
				conn.Close()
			}
			return
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(tr.srv.Close)
	return tr
}

func (tr *testReceiver) tlsConfig() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(tr.srv.Certificate())
	return &tls.Config{RootCAs: pool}
}

func (tr *testReceiver) received() []receivedPost {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.posts)
}

// accepted returns the distinct bodies answered 2xx, in arrival order.
func (tr *testReceiver) accepted() []receivedPost {
	var out []receivedPost
	seen := map[[32]byte]bool{}
	for _, p := range tr.received() {
		if p.status >= 200 && p.status < 300 && !seen[p.sum] {
			seen[p.sum] = true
			out = append(out, p)
		}
	}
	return out
}

// deliverySim is a simulator whose engine delivers to rcv, with one profile
// created through the API.
func deliverySim(t *testing.T, rcv *testReceiver, cfg Config, profile func(env string) map[string]any) (*rtldSim, int64, string) {
	t.Helper()
	if cfg.Delivery.TLSConfig == nil {
		cfg.Delivery.TLSConfig = rcv.tlsConfig()
	}
	if cfg.Delivery.RetryInterval == 0 {
		cfg.Delivery.RetryInterval = 5 * time.Millisecond
	}
	sim := newRTLDSim(t, cfg)
	env := sim.srv.EnvironmentIDs()[0]
	p := profile(env)
	p["delivery_method"].(map[string]any)["destination_endpoint"] = rcv.srv.URL + "/ingest/" + env
	status, body := sim.do("POST", "/rtld/v1/accesslogs/profiles", p)
	if status != 201 {
		t.Fatalf("create profile: %d %s", status, body)
	}
	var v profileView
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	return sim, v.ID, env
}

func waitDelivered(t *testing.T, sim *rtldSim) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := sim.srv.WaitDelivered(ctx); err != nil {
		t.Fatal(err)
	}
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("body is not gzip: %v", err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("gunzip: %v", err)
	}
	return out
}

// jsonBatch is the json log format's envelope.
type jsonBatch struct {
	AccountNumber string                       `json:"account_number"`
	AgentID       string                       `json:"agent_id"`
	Datestamp     string                       `json:"datestamp"`
	Platform      string                       `json:"platform"`
	ProfileID     int64                        `json:"profile_id"`
	SeqNum        *int64                       `json:"seq_num"`
	Logs          []map[string]json.RawMessage `json:"logs"`
}

// decodeRecords parses a delivered body of any format into records of raw
// JSON values (CSV values become JSON strings).
func decodeRecords(t *testing.T, format string, raw []byte) ([]map[string]json.RawMessage, *jsonBatch) {
	t.Helper()
	switch format {
	case "json":
		var b jsonBatch
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&b); err != nil {
			t.Fatalf("json batch: %v", err)
		}
		return b.Logs, &b
	case "json_array":
		var recs []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &recs); err != nil {
			t.Fatalf("json_array batch: %v", err)
		}
		return recs, nil
	case "json_lines":
		var recs []map[string]json.RawMessage
		sc := bufio.NewScanner(bytes.NewReader(raw))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var r map[string]json.RawMessage
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("json_lines line: %v", err)
			}
			recs = append(recs, r)
		}
		return recs, nil
	case "csv":
		rows, err := csv.NewReader(bytes.NewReader(raw)).ReadAll()
		if err != nil || len(rows) < 1 {
			t.Fatalf("csv batch: %v", err)
		}
		var recs []map[string]json.RawMessage
		for _, row := range rows[1:] {
			r := map[string]json.RawMessage{}
			for i, k := range rows[0] {
				enc, _ := json.Marshal(row[i])
				r[k] = enc
			}
			recs = append(recs, r)
		}
		return recs, nil
	}
	t.Fatalf("format %q", format)
	return nil, nil
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// checkValueType checks a JSON value against a field's catalogued type.
func checkValueType(t *testing.T, key string, v json.RawMessage) {
	t.Helper()
	typ, ok := accesslog.FieldTypeOf(key)
	if !ok {
		t.Errorf("record key %q is neither catalogued nor custom", key)
		return
	}
	var x any
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	if err := dec.Decode(&x); err != nil {
		t.Errorf("%s: %v", key, err)
		return
	}
	switch typ {
	case accesslog.TypeString:
		if _, ok := x.(string); !ok {
			t.Errorf("%s = %s, want a string", key, v)
		}
	case accesslog.TypeInteger:
		n, ok := x.(json.Number)
		if _, err := n.Int64(); !ok || err != nil {
			t.Errorf("%s = %s, want an integer", key, v)
		}
	case accesslog.TypeFloat, accesslog.TypeTimestamp:
		n, ok := x.(json.Number)
		if _, err := n.Float64(); !ok || err != nil {
			t.Errorf("%s = %s, want a number", key, v)
		}
	}
}

func TestDeliveryFormats(t *testing.T) {
	fields := []any{"timestamp", "uuid", "status_code", "client_ip", "host", "path", "query", "method",
		"user_agent", "referer", "bytes_in", "bytes_out", "cache_status", "pop", "client_country_code",
		"client_asn", "origin_name", "total_time", "client_geo_latitude"}
	wantKeys := []string{}
	for _, f := range fields {
		wantKeys = append(wantKeys, f.(string))
	}
	wantKeys = append(wantKeys, "req_hdr_x_request_id", "resp_hdr_content_language", "cookie_session_id")
	sort.Strings(wantKeys)
	tests := []struct {
		format, ctype string
		auth          map[string]any
	}{
		{"json", "application/json", map[string]any{"type": "http_basic", "username": "edgepipe", "password": "pw-1"}},
		{"json_array", "application/json", map[string]any{"type": "http_basic", "username": "edgepipe", "password": "pw-1"}},
		{"json_lines", "application/x-ndjson", map[string]any{"type": "custom_authentication", "token": "Token abc123"}},
		{"csv", "text/csv", map[string]any{"type": "http_basic", "username": "edgepipe", "password": "pw-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			rcv := newTestReceiver(t, nil)
			sim, id, env := deliverySim(t, rcv, Config{Seed: 11, Delivery: DeliveryConfig{BatchSize: 10}}, func(env string) map[string]any {
				p := validProfile(env)
				p["fields"] = fields
				p["custom_request_headers"] = []any{"X-Request-Id"}
				p["custom_response_headers"] = []any{"Content-Language"}
				p["custom_cookies"] = []any{"session-id"}
				dm := p["delivery_method"].(map[string]any)
				dm["log_format"] = tt.format
				dm["authentication"] = tt.auth
				return p
			})
			if err := sim.srv.DeliverRecords(context.Background(), id, 25); err != nil {
				t.Fatal(err)
			}
			waitDelivered(t, sim)
			posts := rcv.accepted()
			if len(posts) != 3 {
				t.Fatalf("%d batches accepted, want 3 (25 records in batches of 10)", len(posts))
			}
			got := map[string]bool{}
			for _, p := range posts {
				if p.header.Get("Content-Encoding") != "gzip" || p.header.Get("Content-Type") != tt.ctype {
					t.Errorf("headers %v", p.header)
				}
				if tt.auth["type"] == "http_basic" {
					req := &http.Request{Header: p.header}
					u, pw, ok := req.BasicAuth()
					if !ok || u != "edgepipe" || pw != "pw-1" {
						t.Errorf("basic auth %q %q %v", u, pw, ok)
					}
				} else if p.header.Get("Authorization") != "Token abc123" {
					t.Errorf("Authorization %q", p.header.Get("Authorization"))
				}
				recs, batch := decodeRecords(t, tt.format, gunzip(t, p.body))
				if batch != nil {
					e, _ := sim.srv.environment(env)
					if batch.AccountNumber != e.LegacyAccountNumber || batch.ProfileID != id || batch.SeqNum == nil ||
						batch.Platform == "" || batch.AgentID == "" || batch.Datestamp != time.Now().UTC().Format("20060102") {
						t.Errorf("batch header %+v", batch)
					}
				}
				for _, r := range recs {
					keys := make([]string, 0, len(r))
					for k, v := range r {
						keys = append(keys, k)
						if tt.format != "csv" {
							checkValueType(t, k, v)
						}
					}
					sort.Strings(keys)
					if !slices.Equal(keys, wantKeys) {
						t.Fatalf("record keys %v, want %v", keys, wantKeys)
					}
					var u string
					_ = json.Unmarshal(r["uuid"], &u)
					if !uuidRE.MatchString(u) || got[u] {
						t.Errorf("uuid %q invalid or repeated", u)
					}
					got[u] = true
				}
			}
			gen := sim.srv.GeneratedUUIDs()
			if len(gen) != 25 || len(got) != 25 {
				t.Fatalf("generated %d, received %d distinct uuids; want 25", len(gen), len(got))
			}
			for _, u := range gen {
				if !got[u] {
					t.Errorf("generated uuid %s never delivered", u)
				}
			}
			st := sim.srv.Delivered()
			if st.RecordsGenerated != 25 || st.RecordsAcknowledged != 25 || st.Batches != 3 || st.BatchesAcknowledged != 3 || st.Retries != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestDeliveryRetriesSameBytes: a failed POST (500, connection reset after
// the body, an acknowledgement dropped by the fault knob) is resent with
// identical bytes until it is accepted.
func TestDeliveryRetriesSameBytes(t *testing.T) {
	tests := []struct {
		name       string
		answer     func(prev int) int
		faults     DeliveryFaults
		minPerBody int // attempts each distinct body gets at least
		exact      bool
	}{
		{"500 twice", func(prev int) int {
			if prev < 2 {
				return 500
			}
			return 200
		}, DeliveryFaults{}, 3, true},
		{"503 then 204", func(prev int) int {
			if prev < 1 {
				return 503
			}
			return 204
		}, DeliveryFaults{}, 2, true},
		{"connection reset after body", func(prev int) int {
			if prev < 1 {
				return -1
			}
			return 200
		}, DeliveryFaults{}, 2, true},
		{"dropped acknowledgements", nil, DeliveryFaults{DropAckPercent: 50}, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rcv := newTestReceiver(t, tt.answer)
			sim, id, _ := deliverySim(t, rcv, Config{Seed: 5, Delivery: DeliveryConfig{BatchSize: 20, Faults: tt.faults}}, validProfile)
			if err := sim.srv.DeliverRecords(context.Background(), id, 200); err != nil {
				t.Fatal(err)
			}
			waitDelivered(t, sim)
			st := sim.srv.Delivered()
			posts := rcv.received()
			perBody := map[[32]byte]int{}
			for _, p := range posts {
				perBody[p.sum]++
			}
			if len(perBody) != 10 || len(rcv.accepted()) != 10 {
				t.Fatalf("%d distinct bodies (%d accepted), want 10: every retry must resend the same bytes", len(perBody), len(rcv.accepted()))
			}
			for sum, n := range perBody {
				if n < tt.minPerBody || (tt.exact && n != tt.minPerBody) {
					t.Errorf("body %x sent %d times, want %d", sum[:4], n, tt.minPerBody)
				}
			}
			if st.Attempts != int64(len(posts)) || st.Retries != int64(len(posts)-10) || st.BatchesAcknowledged != 10 ||
				st.RecordsAcknowledged != 200 {
				t.Errorf("stats %+v for %d posts", st, len(posts))
			}
			if tt.faults.DropAckPercent > 0 {
				if st.AcksDropped == 0 || int64(len(posts)) != 10+st.AcksDropped {
					t.Errorf("acks dropped %d, posts %d", st.AcksDropped, len(posts))
				}
				dups := 0
				for _, n := range perBody {
					dups += n - 1
				}
				if dups == 0 {
					t.Error("dropping acknowledgements produced no duplicate at the receiver")
				}
			} else if st.Failures != int64(len(posts)-10) {
				t.Errorf("failures %d, want %d", st.Failures, len(posts)-10)
			}
		})
	}
}

func TestDeliverySeqNumPerAgentResetsAtMidnight(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 3, 9, 23, 59, 0, 0, time.UTC)}
	rcv := newTestReceiver(t, nil)
	sim, id, _ := deliverySim(t, rcv, Config{Seed: 9, Now: clock.Now,
		Delivery: DeliveryConfig{BatchSize: 5, AgentsPerEnvironment: 3}}, validProfile)
	deliver := func(n int) {
		if err := sim.srv.DeliverRecords(context.Background(), id, n); err != nil {
			t.Fatal(err)
		}
		waitDelivered(t, sim)
	}
	deliver(45) // 9 batches: 3 per agent
	clock.Set(time.Date(2026, 3, 10, 0, 0, 30, 0, time.UTC))
	deliver(30) // 6 batches: 2 per agent, seq_num from 0 again

	seqs := map[string][]int64{} // agent/datestamp → seq_nums
	agents := map[string]bool{}
	for _, p := range rcv.accepted() {
		_, b := decodeRecords(t, "json", gunzip(t, p.body))
		key := b.AgentID + "/" + b.Datestamp
		seqs[key] = append(seqs[key], *b.SeqNum)
		agents[b.AgentID] = true
		for _, r := range b.Logs {
			ts, _ := strconv.ParseFloat(string(r["timestamp"]), 64)
			day := time.Unix(int64(ts), 0).UTC()
			if d := day.Format("20060102"); d != b.Datestamp && day.Add(5*time.Second).Format("20060102") != b.Datestamp {
				t.Errorf("record timestamp %v in batch of %s", day, b.Datestamp)
			}
		}
	}
	if len(agents) != 3 {
		t.Fatalf("%d agents, want 3", len(agents))
	}
	for a := range agents {
		for day, want := range map[string][]int64{"20260309": {0, 1, 2}, "20260310": {0, 1}} {
			got := seqs[a+"/"+day]
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("agent %s on %s: seq_nums %v, want %v", a, day, got, want)
			}
		}
	}
}

func TestDeliveryDropsAfterRetention(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC)}
	rcv := newTestReceiver(t, func(int) int { return 503 })
	sim, id, _ := deliverySim(t, rcv, Config{Seed: 4, Now: clock.Now, Delivery: DeliveryConfig{BatchSize: 10}}, validProfile)
	if err := sim.srv.DeliverRecords(context.Background(), id, 10); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(rcv.received()) < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if st := sim.srv.Delivered(); st.Settled() || st.RecordsDropped != 0 {
		t.Fatalf("settled before the retention: %+v", st)
	}
	clock.Set(clock.Now().Add(72*time.Hour + time.Minute))
	waitDelivered(t, sim)
	st := sim.srv.Delivered()
	if st.RecordsDropped != 10 || st.BatchesDropped != 1 || st.RecordsAcknowledged != 0 || st.Failures < 3 {
		t.Errorf("stats %+v", st)
	}
}

func TestDeliveryLiveAndProfileChanges(t *testing.T) {
	rcv := newTestReceiver(t, nil)
	sim, id, env := deliverySim(t, rcv, Config{Seed: 8, TrafficScale: 20, Delivery: DeliveryConfig{
		Live: true, BatchSize: 100, FlushInterval: 50 * time.Millisecond}}, validProfile)
	waitFor := func(what string, cond func(DeliveryStats) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond(sim.srv.Delivered()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: stats %+v", what, sim.srv.Delivered())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("steady records acknowledged", func(st DeliveryStats) bool { return st.RecordsAcknowledged >= 300 })

	// Disabling the profile stops delivery.
	p := validProfile(env)
	p["delivery_method"].(map[string]any)["destination_endpoint"] = rcv.srv.URL + "/ingest"
	p["enabled"] = false
	if status, body := sim.do("PUT", fmt.Sprintf("/rtld/v1/accesslogs/profiles/%d", id), p); status != 200 {
		t.Fatalf("disable: %d %s", status, body)
	}
	waitFor("settled after disable", func(st DeliveryStats) bool { return st.Settled() })
	time.Sleep(300 * time.Millisecond)
	before := sim.srv.Delivered()
	time.Sleep(300 * time.Millisecond)
	if after := sim.srv.Delivered(); after.RecordsGenerated != before.RecordsGenerated {
		t.Errorf("disabled profile still gets records: %d → %d", before.RecordsGenerated, after.RecordsGenerated)
	}
	if err := sim.srv.DeliverRecords(context.Background(), id, 5); err == nil {
		t.Error("DeliverRecords to a disabled profile succeeded")
	}
	// Every record the engine generated reached the receiver.
	got := map[string]bool{}
	for _, post := range rcv.accepted() {
		_, b := decodeRecords(t, "json", gunzip(t, post.body))
		for _, r := range b.Logs {
			var u string
			_ = json.Unmarshal(r["uuid"], &u)
			got[u] = true
		}
	}
	st := sim.srv.Delivered()
	for _, u := range sim.srv.GeneratedUUIDs() {
		if !got[u] && st.RecordsDropped == 0 {
			t.Fatalf("uuid %s generated but not received (stats %+v)", u, st)
		}
	}
}

func TestDeliveryEngineStopsWithServer(t *testing.T) {
	rcv := newTestReceiver(t, func(int) int { return 503 }) // every batch stays pending
	before := runtime.NumGoroutine()
	sim, id, _ := deliverySim(t, rcv, Config{Seed: 3, Delivery: DeliveryConfig{
		BatchSize: 5, MaxTrackedUUIDs: 7, Live: true, FlushInterval: 20 * time.Millisecond}}, validProfile)
	if err := sim.srv.DeliverRecords(context.Background(), id, 20); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for sim.srv.Delivered().Failures < 6 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	e := sim.srv.rtld.engine
	e.mu.Lock()
	var lanes []*lane
	for _, l := range e.lanes {
		lanes = append(lanes, l)
	}
	e.mu.Unlock()
	if len(lanes) != 3 {
		t.Fatalf("%d lanes, want one per agent (3)", len(lanes))
	}
	if err := sim.srv.Close(); err != nil {
		t.Fatal(err)
	}
	for _, l := range lanes {
		select {
		case <-l.done:
		default:
			t.Fatal("a sender is still running after Close")
		}
	}
	st := sim.srv.Delivered()
	if n := len(sim.srv.GeneratedUUIDs()); n != 7 || st.UntrackedRecords != st.RecordsGenerated-7 {
		t.Errorf("tracked %d uuids, untracked %d of %d", n, st.UntrackedRecords, st.RecordsGenerated)
	}
	if st.RecordsDropped != st.RecordsGenerated || st.PendingBatches != 0 {
		t.Errorf("unacknowledged batches not accounted as dropped at Close: %+v", st)
	}
	if err := sim.srv.DeliverRecords(context.Background(), id, 1); err == nil {
		t.Error("DeliverRecords after Close succeeded")
	}
	// The test's HTTP servers are still up; the engine's goroutines and
	// connections must be gone.
	deadline = time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+4 {
		t.Errorf("%d goroutines after Close, %d before New", n, before)
	}
}

func TestDeliveryTLSVerification(t *testing.T) {
	tests := []struct {
		name      string
		delivery  DeliveryConfig
		delivered bool
	}{
		{"trusted root", DeliveryConfig{}, true}, // deliverySim fills in the receiver's pool
		{"system roots reject a self-signed certificate", DeliveryConfig{TLSConfig: &tls.Config{}}, false},
		{"dev insecure skip verify", DeliveryConfig{TLSConfig: &tls.Config{}, DevInsecureSkipVerify: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rcv := newTestReceiver(t, nil)
			sim, id, _ := deliverySim(t, rcv, Config{Seed: 1, Delivery: tt.delivery}, validProfile)
			if err := sim.srv.DeliverRecords(context.Background(), id, 3); err != nil {
				t.Fatal(err)
			}
			if tt.delivered {
				waitDelivered(t, sim)
				if len(rcv.accepted()) != 1 {
					t.Errorf("%d batches received", len(rcv.accepted()))
				}
				return
			}
			deadline := time.Now().Add(10 * time.Second)
			for sim.srv.Delivered().Failures < 2 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if st := sim.srv.Delivered(); st.Failures < 2 || st.RecordsAcknowledged != 0 || len(rcv.received()) != 0 {
				t.Errorf("untrusted certificate accepted: %+v, %d posts", st, len(rcv.received()))
			}
		})
	}
}

func TestDeliveryHonoursFilters(t *testing.T) {
	rcv := newTestReceiver(t, nil)
	sim, id, env := deliverySim(t, rcv, Config{Seed: 6, Delivery: DeliveryConfig{BatchSize: 100}}, validProfile)
	// The filters name hosts of the environment, so its profile is updated
	// once the environment is known.
	hosts := sim.srv.EnvironmentHosts(env)
	p := validProfile(env)
	p["fields"] = []any{"uuid", "status_code", "host"}
	p["delivery_method"].(map[string]any)["destination_endpoint"] = rcv.srv.URL + "/ingest/" + env
	p["filters"] = map[string]any{
		"status_codes": []any{"5xx", "404"},
		"host_names":   map[string]any{"names": []any{hosts[1], hosts[2]}, "condition": "in"},
	}
	if status, body := sim.do("PUT", fmt.Sprintf("/rtld/v1/accesslogs/profiles/%d", id), p); status != 200 {
		t.Fatalf("set filters: %d %s", status, body)
	}
	if err := sim.srv.DeliverRecords(context.Background(), id, 300); err != nil {
		t.Fatal(err)
	}
	waitDelivered(t, sim)
	statuses := map[int64]int{}
	seenHosts := map[string]bool{}
	for _, post := range rcv.accepted() {
		_, b := decodeRecords(t, "json", gunzip(t, post.body))
		for _, r := range b.Logs {
			s, _ := strconv.ParseInt(string(r["status_code"]), 10, 64)
			var host string
			_ = json.Unmarshal(r["host"], &host)
			statuses[s]++
			seenHosts[host] = true
			if (s != 404 && (s < 500 || s > 599)) || (host != hosts[1] && host != hosts[2]) {
				t.Fatalf("record outside the filters: status %d host %q", s, host)
			}
		}
	}
	if len(statuses) < 2 || len(seenHosts) != 2 {
		t.Errorf("statuses %v, hosts %v: want a realistic mix within the filter", statuses, seenHosts)
	}
	// The records the filters dropped are counted, not delivered.
	var filtered, queued int64
	for _, b := range sim.srv.LogBuckets(id) {
		filtered += b.Filtered
		queued += b.Queued
	}
	if queued != 300 || filtered < 300 {
		t.Errorf("%d records queued, %d filtered: want 300 queued of many more drawn", queued, filtered)
	}
}

// TestDeliverRecordsGivesUp: a stream whose filters pass nothing fails
// DeliverRecords within its bounds instead of searching forever.
func TestDeliverRecordsGivesUp(t *testing.T) {
	rcv := newTestReceiver(t, nil)
	sim, id, _ := deliverySim(t, rcv, Config{Seed: 6, TrafficScale: 0.01}, func(env string) map[string]any {
		p := validProfile(env)
		p["filters"] = map[string]any{"host_names": map[string]any{"names": []any{"elsewhere.example.com"}, "condition": "in"}}
		return p
	})
	err := sim.srv.DeliverRecords(context.Background(), id, 10)
	if !errors.Is(err, errNoRecords) {
		t.Fatalf("DeliverRecords: %v, want errNoRecords", err)
	}
}
