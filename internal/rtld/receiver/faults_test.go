package receiver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// The fault tests run the receiver binary the way an operator would break
// it: corrupted spool bytes after a crash, a full disk, big batches from
// many clients at once, senders that trickle their bodies, and agents
// whose seq_num jumps.

const (
	faultUser = "platform"
	faultPass = "ingest-secret"
	faultEnv  = "0f6c2a9e-3333-4b1d-8f6e-00000000fa17"
)

// faultReceiver starts the receiver binary with extra flags on a free
// loopback port and waits until it answers; it returns the process and the
// base URL.
func faultReceiver(t *testing.T, extra ...string) (*receiverProcess, string) {
	t.Helper()
	addr := testenv.FreeAddr(t)
	args := append([]string{"--no-register", "--web.listen-address=" + addr, "--log.level=info"}, extra...)
	p := startReceiver(t, args, []string{"EDGEPIPE_RTLD_USERNAME=" + faultUser, "EDGEPIPE_RTLD_PASSWORD=" + faultPass})
	base := "http://" + addr
	waitHealthy(t, p, base)
	return p, base
}

func waitHealthy(t *testing.T, p *receiverProcess, base string) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	waitFor(t, "the receiver to listen", 60*time.Second, func() bool {
		select {
		case <-p.exited:
			t.Fatalf("receiver exited: %v\n%s", p.err, p.logs())
		default:
		}
		resp, err := client.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// alive fails the test if the receiver process has ended.
func alive(t *testing.T, p *receiverProcess) {
	t.Helper()
	select {
	case <-p.exited:
		t.Fatalf("the receiver exited (%v); log:\n%s", p.err, p.logs())
	default:
	}
}

// envelope is a json batch of an agent's seq_num holding records.
func envelope(agent string, seq int, records []string) []byte {
	return []byte(fmt.Sprintf(`{"account_number":"ACME","agent_id":%q,"datestamp":"20261123","platform":"delivery","profile_id":1,"seq_num":%d,"logs":[%s]}`,
		agent, seq, strings.Join(records, ",")))
}

// uuidRecords returns n records with uuids "<prefix>-<i>" padded to about
// size bytes each.
func uuidRecords(prefix string, n, size int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"uuid":"%s-%d","pad":"%s"}`, prefix, i, strings.Repeat("p", max(size-40, 0)))
	}
	return out
}

type answer struct {
	status     int
	retryAfter string
	body       string
}

func post(client *http.Client, url string, body []byte) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.SetBasicAuth(faultUser, faultPass)
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header.Get("Retry-After"), string(b)}, nil
}

// procStatusKB returns a field of /proc/<pid>/status in KiB (VmHWM, VmRSS).
func procStatusKB(t testing.TB, p *receiverProcess, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("reading the receiver's memory: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/<pid>/status", field)
	return 0
}

// kafkaUUIDs counts the records of topic by uuid.
func kafkaUUIDs(t *testing.T, kafka *testenv.KafkaBroker, topic string) (map[string]int, int) {
	t.Helper()
	recs := kafka.Records(t, topic)
	seen := map[string]int{}
	for _, r := range recs {
		var v struct {
			UUID string `json:"uuid"`
		}
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("Kafka message %q: %v", r.Value, err)
		}
		seen[v.UUID]++
	}
	return seen, len(recs)
}

// TestCorruptSegmentAfterCrashDeliversEverythingElse: 100 acknowledged
// batches wait in several segments while Kafka is down; the receiver is
// killed, one byte in the middle of the first segment is flipped, and after
// a restart every batch but the damaged one reaches Kafka, the damaged
// bytes are kept in a .corrupt file, and the corruption counters say so.
func TestCorruptSegmentAfterCrashDeliversEverythingElse(t *testing.T) {
	const batches, perBatch = 100, 20
	kafka := testenv.Kafka(t)
	topic := kafka.NewTopic(t, 1)
	kafka.Pause()
	dir := filepath.Join(t.TempDir(), "spool")
	p, base := faultReceiver(t, "--spool.dir="+dir, "--spool.segment-bytes=256KiB",
		"--kafka.brokers="+kafka.Addr(), "--kafka.topic="+topic)
	client := &http.Client{Timeout: 30 * time.Second}
	url := base + "/ingest/" + faultEnv
	for b := 0; b < batches; b++ {
		a, err := post(client, url, gzipBytes(t, envelope("agent-1", b, uuidRecords(fmt.Sprintf("b%03d", b), perBatch, 1000))))
		if err != nil || a.status != http.StatusOK {
			t.Fatalf("batch %d: %+v %v", b, a, err)
		}
	}
	p.kill9()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	sort.Strings(segs)
	if len(segs) < 4 {
		t.Fatalf("%d segments, want several", len(segs))
	}
	st, _ := os.Stat(segs[0])
	f, err := os.OpenFile(segs[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	mid := st.Size() / 2
	b := []byte{0}
	if _, err := f.ReadAt(b, mid); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{b[0] ^ 0x20}, mid); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("flipped the byte at %d of %s (%d bytes; %d segments)", mid, filepath.Base(segs[0]), st.Size(), len(segs))

	kafka.Resume()
	p.start()
	waitHealthy(t, p, base)
	kafka.WaitForRecords(t, topic, (batches-1)*perBatch, 90*time.Second)
	// Let anything else in flight arrive, then count per batch.
	time.Sleep(2 * time.Second)
	seen, _ := kafkaUUIDs(t, kafka, topic)
	var missing []int
	for b := 0; b < batches; b++ {
		n := 0
		for i := 0; i < perBatch; i++ {
			if seen[fmt.Sprintf("b%03d-%d", b, i)] > 0 {
				n++
			}
		}
		switch n {
		case perBatch:
		case 0:
			missing = append(missing, b)
		default:
			t.Errorf("batch %d: %d of %d records delivered", b, n, perBatch)
		}
	}
	if len(missing) != 1 {
		t.Fatalf("batches missing from Kafka: %v, want exactly the damaged one", missing)
	}
	q, _ := filepath.Glob(filepath.Join(dir, "*.corrupt"))
	if len(q) != 1 {
		t.Fatalf("quarantine files: %v", q)
	}
	metrics := base + "/metrics"
	entries := scrape(client, metrics, "edgepipe_rtld_spool_corrupt_entries_total")
	bytesLost := scrape(client, metrics, "edgepipe_rtld_spool_corrupt_bytes_total")
	if entries != 1 || bytesLost <= 0 {
		t.Fatalf("corrupt entries %v, bytes %v", entries, bytesLost)
	}
	if !regexp.MustCompile(`level=ERROR .*msg="spool: corrupt bytes in a segment`).MatchString(p.logs()) {
		t.Fatal("no error-level log of the corruption")
	}
	t.Logf("delivered %d of %d batches; batch %d lost to the flipped byte; quarantine %s; counters: %v entries, %v bytes",
		batches-1, batches, missing[0], filepath.Base(q[0]), entries, bytesLost)
}

// TestDiskFullWithKafkaDownThenBack fills a real (tmpfs) disk while Kafka
// is down: ingest answers 503 with Retry-After, /readyz fails, the process
// keeps running; when Kafka is back every acknowledged record arrives once
// or, rarely, twice, the spool shrinks and ingest accepts again.
func TestDiskFullWithKafkaDownThenBack(t *testing.T) {
	const batches, perBatch = 300, 100
	disk := testenv.TmpFS(t, 16<<20)
	kafka := testenv.Kafka(t)
	topic := kafka.NewTopic(t, 3)
	kafka.Pause()
	p, base := faultReceiver(t, "--spool.dir="+filepath.Join(disk, "spool"), "--spool.max-bytes=1GiB",
		"--ingest.max-decoded-bytes=1MiB", "--ingest.retry-after=1s",
		"--kafka.brokers="+kafka.Addr(), "--kafka.topic="+topic)
	client := &http.Client{Timeout: 30 * time.Second}
	url := base + "/ingest/" + faultEnv
	metrics := base + "/metrics"

	// The platform: posts every batch until it is acknowledged, waiting
	// Retry-After between attempts.
	var acked, refused, badAnswers atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for b := 0; b < batches; b++ {
			body := gzipBytes(t, envelope("agent-1", b, uuidRecords(fmt.Sprintf("d%03d", b), perBatch, 1000)))
			for {
				a, err := post(client, url, body)
				switch {
				case err != nil:
					t.Errorf("batch %d: %v", b, err)
					return
				case a.status == http.StatusOK:
					acked.Add(1)
				case a.status == http.StatusServiceUnavailable && a.retryAfter != "":
					refused.Add(1)
					time.Sleep(200 * time.Millisecond)
					continue
				default:
					badAnswers.Add(1)
					t.Errorf("batch %d: %+v", b, a)
					return
				}
				break
			}
		}
	}()
	waitFor(t, "the disk to fill up", 2*time.Minute, func() bool {
		alive(t, p)
		return scrape(client, metrics, "edgepipe_rtld_spool_disk_full") == 1 && refused.Load() > 0
	})
	resp, err := client.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz on a full disk: %d", resp.StatusCode)
	}
	ackedWhileFull := acked.Load()
	time.Sleep(3 * time.Second) // full for a while: nothing may break
	alive(t, p)
	t.Logf("disk full after %d acknowledged batches; %d answers 503 so far", ackedWhileFull, refused.Load())

	kafka.Resume()
	select {
	case <-done:
	case <-time.After(4 * time.Minute):
		t.Fatalf("the platform still has batches after 4 minutes: %d acknowledged", acked.Load())
	}
	alive(t, p)
	if acked.Load() != batches || badAnswers.Load() != 0 {
		t.Fatalf("%d of %d batches acknowledged, %d bad answers", acked.Load(), batches, badAnswers.Load())
	}
	kafka.WaitForRecords(t, topic, batches*perBatch, 2*time.Minute)
	time.Sleep(2 * time.Second)
	seen, messages := kafkaUUIDs(t, kafka, topic)
	for b := 0; b < batches; b++ {
		for i := 0; i < perBatch; i++ {
			if seen[fmt.Sprintf("d%03d-%d", b, i)] == 0 {
				t.Fatalf("acknowledged record d%03d-%d never reached Kafka", b, i)
			}
		}
	}
	if limit := batches * perBatch * 12 / 10; messages > limit {
		t.Fatalf("%d Kafka messages for %d records (> 1.2x): redelivery loop", messages, batches*perBatch)
	}
	// Ingest accepts again and the receiver is ready.
	waitFor(t, "/readyz to recover", 30*time.Second, func() bool {
		resp, err := client.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	a, err := post(client, url, gzipBytes(t, envelope("agent-1", batches, uuidRecords("after", 10, 100))))
	if err != nil || a.status != http.StatusOK {
		t.Fatalf("batch after recovery: %+v %v", a, err)
	}
	alive(t, p)
	t.Logf("%d batches (%d records) acknowledged, %d answers 503 while full, %d Kafka messages (%.3fx)",
		batches, batches*perBatch, refused.Load(), messages, float64(messages)/float64(batches*perBatch))
}

// TestBigConcurrentBatchesStayWithinMemory: 16 clients post batches that
// decode to 29 MB each for 10 seconds against the receiver with default
// flags (Kafka as the sink): peak RSS stays below 768 MiB and every answer
// is 2xx, or 503/429 with Retry-After.
func TestBigConcurrentBatchesStayWithinMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("memory test")
	}
	kafka := testenv.Kafka(t)
	topic := kafka.NewTopic(t, 6)
	p, base := faultReceiver(t, "--spool.dir="+filepath.Join(t.TempDir(), "spool"),
		"--kafka.brokers="+kafka.Addr(), "--kafka.topic="+topic)

	// One json_array batch (no batch identity: posting it again is no
	// duplicate) of about 29 MB decoded.
	var buf bytes.Buffer
	buf.WriteByte('[')
	writeRecords(&buf, rand.New(rand.NewPCG(3, 4)), 14_200, 1)
	buf.WriteByte(']')
	decoded := buf.Len()
	body := gzipBytes(t, buf.Bytes())
	buf = bytes.Buffer{}
	t.Logf("batch: %.1f MB decoded, %.1f MB gzipped", float64(decoded)/1e6, float64(len(body))/1e6)
	if decoded < 28_000_000 || decoded > 31_000_000 {
		t.Fatalf("batch decodes to %d bytes, want about 29 MB", decoded)
	}

	url := base + "/ingest/" + faultEnv
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	var ok, busy atomic.Int64
	var mu sync.Mutex
	var bad []string
	deadline := time.Now().Add(10 * time.Second)
	var wg sync.WaitGroup
	for c := 0; c < 16; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				a, err := post(client, url, body)
				switch {
				case err == nil && a.status/100 == 2:
					ok.Add(1)
				case err == nil && (a.status == http.StatusServiceUnavailable || a.status == http.StatusTooManyRequests) && a.retryAfter != "":
					busy.Add(1)
					time.Sleep(100 * time.Millisecond)
				default:
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%+v %v", a, err))
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	alive(t, p)
	hwm := procStatusKB(t, p, "VmHWM")
	t.Logf("%d batches accepted, %d answers 503/429 with Retry-After; peak RSS (VmHWM) %d MiB", ok.Load(), busy.Load(), hwm>>10)
	if len(bad) > 0 {
		t.Fatalf("%d answers neither 2xx nor 503/429 with Retry-After, e.g. %s", len(bad), bad[0])
	}
	if ok.Load() == 0 {
		t.Fatal("no batch accepted in 10 seconds")
	}
	if hwm>>10 >= 768 {
		t.Fatalf("peak RSS %d MiB, want below 768 MiB", hwm>>10)
	}
}

// TestSlowSendersDoNotStarveAnHonestPoster: 20 authenticated senders
// trickle their bodies at 1 byte/s (reconnecting when cut off) while an
// honest poster sends 60 batches, one every half second: at least 90% of
// them are accepted, because a slot is taken only once a body is in.
func TestSlowSendersDoNotStarveAnHonestPoster(t *testing.T) {
	if testing.Short() {
		t.Skip("takes half a minute")
	}
	_, base := faultReceiver(t, "--spool.dir="+filepath.Join(t.TempDir(), "spool"))
	addr := strings.TrimPrefix(base, "http://")
	auth := base64.StdEncoding.EncodeToString([]byte(faultUser + ":" + faultPass))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var cutOff atomic.Int64
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				stop := context.AfterFunc(ctx, func() { c.Close() })
				fmt.Fprintf(c, "POST /ingest/%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Basic %s\r\nContent-Encoding: gzip\r\nContent-Length: 1000000\r\n\r\n", faultEnv, addr, auth)
				answered := make(chan struct{})
				go func() {
					defer close(answered)
					if line, _ := bufio.NewReader(c).ReadString('\n'); strings.Contains(line, " 408 ") {
						cutOff.Add(1)
					}
				}()
			trickle:
				for {
					select {
					case <-answered:
						break trickle
					case <-ctx.Done():
						break trickle
					case <-time.After(time.Second):
						if _, err := c.Write([]byte{0x1f}); err != nil {
							break trickle
						}
					}
				}
				stop()
				c.Close()
				<-answered
			}
		}()
	}
	time.Sleep(2 * time.Second) // every slow sender is mid-body

	client := &http.Client{Timeout: 30 * time.Second}
	url := base + "/ingest/" + faultEnv
	accepted := 0
	for b := 0; b < 60; b++ {
		a, err := post(client, url, gzipBytes(t, envelope("honest", b, uuidRecords(fmt.Sprintf("h%02d", b), 50, 500))))
		if err == nil && a.status == http.StatusOK {
			accepted++
		} else {
			t.Logf("honest batch %d: %+v %v", b, a, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	t.Logf("honest poster: %d of 60 batches accepted beside 20 slow senders (%d slow requests cut off with 408)", accepted, cutOff.Load())
	if accepted < 54 {
		t.Fatalf("honest poster: %d of 60 batches accepted, want at least 90%%", accepted)
	}
}

// TestSeqJumpsKeepGapStateSmall: 30 agents each send seq_num 0 and then
// 99,999 (60 small requests): the receiver's RSS grows by less than 64 MiB
// and the gap state file stays small, while the missing seq_nums are all
// accounted for.
func TestSeqJumpsKeepGapStateSmall(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	p, base := faultReceiver(t, "--spool.dir="+dir)
	client := &http.Client{Timeout: 30 * time.Second}
	url := base + "/ingest/" + faultEnv
	// Warm up (buffers, connections), then measure.
	for i := 0; i < 5; i++ {
		if a, err := post(client, url, gzipBytes(t, envelope("warm-up", i, uuidRecords("w", 10, 200)))); err != nil || a.status != 200 {
			t.Fatalf("warm-up: %+v %v", a, err)
		}
	}
	time.Sleep(time.Second)
	before := procStatusKB(t, p, "VmRSS")
	for _, seq := range []int{0, 99_999} {
		for a := 0; a < 30; a++ {
			if ans, err := post(client, url, gzipBytes(t, envelope(fmt.Sprintf("agent-%02d", a), seq, uuidRecords("r", 3, 200)))); err != nil || ans.status != 200 {
				t.Fatalf("agent %d seq %d: %+v %v", a, seq, ans, err)
			}
		}
	}
	metrics := base + "/metrics"
	waitFor(t, "the gap tracker to see every batch", 30*time.Second, func() bool {
		return scrape(client, metrics, "edgepipe_rtld_seq_missing") == 30*99_998
	})
	time.Sleep(6 * time.Second) // a save of the gap state
	after := procStatusKB(t, p, "VmRSS")
	st, err := os.Stat(filepath.Join(dir, "gaps.state"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("RSS %d MiB -> %d MiB; gap state file %d bytes; %v seq_nums missing", before>>10, after>>10, st.Size(), 30*99_998)
	if grown := (after - before) >> 10; grown >= 64 {
		t.Fatalf("RSS grew by %d MiB", grown)
	}
	if st.Size() > 128<<10 {
		t.Fatalf("gap state file is %d bytes", st.Size())
	}
}
