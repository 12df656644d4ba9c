package receiver_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	kgzip "github.com/klauspost/compress/gzip"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/rtld/logmetrics"
	"github.com/edgepipe/edgepipe/internal/rtld/receiver"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/logtable"
	kafkasink "github.com/edgepipe/edgepipe/internal/sinks/kafka"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// The load: batches in the json format of benchRecords records with every
// catalogue field, gzipped once before the clock starts, posted by
// benchClients concurrent clients over loopback HTTP.
const (
	benchRecords = 500
	benchClients = 8
)

type benchLoad struct {
	bodies  [][]byte
	records int
	wire    int64 // gzip bytes
	decoded int64 // JSON bytes
}

func makeLoad(b *testing.B, n int) benchLoad {
	b.Helper()
	return generateLoad(b, rand.New(rand.NewPCG(1, 2)), "agent", n, benchRecords)
}

// generateLoad returns n gzip batches of perBatch records each, from 16
// agents named prefix-0 to prefix-15, drawn from r.
func generateLoad(b *testing.B, r *rand.Rand, prefix string, n, perBatch int) benchLoad {
	b.Helper()
	var l benchLoad
	var buf bytes.Buffer
	for i := 0; i < n; i++ {
		buf.Reset()
		fmt.Fprintf(&buf, `{"account_number":"ACME","agent_id":"%s-%d","datestamp":"20261123","platform":"delivery","profile_id":1,"seq_num":%d,"logs":[`, prefix, i%16, i/16)
		writeRecords(&buf, r, perBatch, i)
		buf.WriteString("]}")
		l.decoded += int64(buf.Len())
		var z bytes.Buffer
		w := kgzip.NewWriter(&z)
		if _, err := w.Write(buf.Bytes()); err != nil {
			b.Fatal(err)
		}
		if err := w.Close(); err != nil {
			b.Fatal(err)
		}
		l.bodies = append(l.bodies, z.Bytes())
		l.records += perBatch
		l.wire += int64(z.Len())
	}
	return l
}

// writeRecords writes n comma-separated records with every catalogue field
// (about 2 KB of JSON each) for batch i.
func writeRecords(buf *bytes.Buffer, r *rand.Rand, n, i int) {
	fields := accesslog.Fields()
	for j := 0; j < n; j++ {
		if j > 0 {
			buf.WriteByte(',')
		}
		buf.WriteByte('{')
		for k, f := range fields {
			if k > 0 {
				buf.WriteByte(',')
			}
			buf.WriteString(strconv.Quote(f.Code))
			buf.WriteByte(':')
			switch {
			case f.Code == "uuid":
				fmt.Fprintf(buf, `"%08x-%04x-4%03x-a%03x-%012x"`, r.Uint32(), r.Uint32()&0xffff, r.Uint32()&0xfff, r.Uint32()&0xfff, r.Uint64()&0xffffffffffff)
			case f.Type == accesslog.TypeTimestamp:
				fmt.Fprintf(buf, "%d.%06d", 1763856000+i, r.IntN(1e6))
			case f.Type == accesslog.TypeInteger:
				buf.WriteString(strconv.Itoa(r.IntN(100000)))
			case f.Type == accesslog.TypeFloat:
				buf.WriteString(strconv.FormatFloat(r.Float64()*10, 'f', 6, 64))
			default:
				fmt.Fprintf(buf, `"%s-%d"`, f.Code, r.IntN(50))
			}
		}
		buf.WriteByte('}')
	}
}

// drive posts every body with benchClients clients, then waits for
// drained, and reports throughput and ack latency.
func drive(b *testing.B, url string, l benchLoad, drained func() bool) {
	b.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchClients}}
	driveWith(b, client, benchClients, url, l, drained, 5*time.Millisecond)
}

// processPoll is how often a benchmark of the receiver process asks it
// whether everything is delivered: asking means scraping its /metrics,
// which costs the receiver about a millisecond of CPU with the log
// metrics' series. Every 5 ms, as this benchmark did before, that was a
// fifth of the receiver's CPU while it delivered.
const processPoll = 100 * time.Millisecond

// driveWith is drive with a client, a number of posters and how often to
// call drained; it returns the rates it reported (records/s acknowledged,
// and until drained).
func driveWith(b *testing.B, client *http.Client, clients int, url string, l benchLoad, drained func() bool, poll time.Duration) (acked, delivered float64) {
	b.Helper()
	work := make(chan []byte)
	lat := make([]time.Duration, 0, len(l.bodies))
	var mu sync.Mutex
	var wg sync.WaitGroup
	b.ResetTimer()
	cpu0 := processCPU(b)
	start := time.Now()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for body := range work {
				for {
					req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
					req.Header.Set("Content-Encoding", "gzip")
					req.SetBasicAuth("bench", "bench")
					t0 := time.Now()
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil {
						b.Error(err)
						return
					}
					if resp.StatusCode == http.StatusServiceUnavailable {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					if resp.StatusCode != http.StatusOK {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
					mu.Lock()
					lat = append(lat, time.Since(t0))
					mu.Unlock()
					break
				}
			}
		}()
	}
	for _, body := range l.bodies {
		work <- body
	}
	close(work)
	wg.Wait()
	ackedIn := time.Since(start)
	for !drained() {
		time.Sleep(poll)
	}
	elapsed := time.Since(start)
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	if len(lat) == 0 {
		return 0, 0
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p99 := lat[len(lat)*99/100]
	records := float64(l.records)
	b.ReportMetric(records/elapsed.Seconds(), "records/s")
	b.ReportMetric(float64(l.decoded)/elapsed.Seconds()/1e6, "MB/s")
	b.ReportMetric(float64(l.wire)/elapsed.Seconds()/1e6, "gzipMB/s")
	b.ReportMetric(records/ackedIn.Seconds(), "acked-records/s")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ack-ms")
	// CPU of this process (clients, in-process servers; not the ClickHouse
	// server) per record: unlike the rates, it hardly moves when other
	// work shares the machine.
	b.ReportMetric(float64(cpu.Microseconds())/records, "cpu-us/record")
	b.ReportMetric(0, "ns/op")
	return records / ackedIn.Seconds(), records / elapsed.Seconds()
}

// BenchmarkIngest compares, on the same load in the same run:
//   - bare-stdlib, bare-accesslog: a net/http server that only gunzips and
//     decodes each batch (see BenchmarkIngestHTTPS);
//   - spool: the receiver with durability (fsync, group commit) and no sink;
//   - spool-no-log-metrics: the same with --no-log-metrics.enabled (the
//     other receiver runs have the log metrics on, as the program does by
//     default), for the CPU per record the log metrics cost;
//   - kafka, clickhouse: the receiver with one sink (kfake in-process, or
//     ClickHouse 18.16), timed until the sink acknowledged every record;
//   - kafka+clickhouse: the receiver delivering to both, timed until both
//     sinks have acknowledged every record.
//
// Run: go test -run '^$' -bench Ingest -benchtime 200x ./internal/rtld/receiver/
func BenchmarkIngest(b *testing.B) {
	for _, bare := range []struct {
		name string
		h    http.HandlerFunc
	}{{"bare-stdlib", bareStdlibHandler}, {"bare-accesslog", bareHandler}} {
		b.Run(bare.name, func(b *testing.B) {
			l := makeLoad(b, b.N)
			srv := httptest.NewServer(bare.h)
			defer srv.Close()
			drive(b, srv.URL+"/ingest/env", l, func() bool { return true })
		})
	}
	run := func(b *testing.B, withKafka, withClickHouse, withLogMetrics bool) {
		l := makeLoad(b, b.N)
		cfg := receiver.Config{
			SpoolDir: b.TempDir(), SpoolMaxBytes: 8 << 30,
			Ingest: rtld.IngestConfig{Username: "bench", Password: "bench", MaxInFlight: 64},
			Logger: slog.New(slog.DiscardHandler),
		}
		if withLogMetrics {
			cfg.LogMetrics = &logmetrics.Config{MaxSeries: logmetrics.DefaultMaxSeries}
		}
		if withClickHouse {
			ch := testenv.ClickHouse(b)
			cfg.ClickHouse = &logtable.Config{DSN: ch.DSN(ch.NewDatabase(b))}
		}
		if withKafka {
			kafka := testenv.Kafka(b)
			kafka.CreateTopic(b, "bench", 6)
			cfg.Kafka = &kafkasink.Config{Brokers: kafka.Brokers(), Topic: "bench"}
		}
		rcv, err := receiver.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- rcv.Run(ctx) }()
		srv := httptest.NewServer(rcv.Handler())
		defer func() {
			srv.Close()
			cancel()
			if err := <-done; err != nil {
				b.Error(err)
			}
		}()
		drive(b, srv.URL+"/ingest/env", l, func() bool {
			st := rcv.Spool().Stats()
			for name, lag := range st.Readers {
				if name != rtld.GapReader && lag.Entries > 0 {
					return false
				}
			}
			return true
		})
	}
	b.Run("spool", func(b *testing.B) { run(b, false, false, true) })
	b.Run("spool-no-log-metrics", func(b *testing.B) { run(b, false, false, false) })
	b.Run("kafka", func(b *testing.B) { run(b, true, false, true) })
	b.Run("clickhouse", func(b *testing.B) { run(b, false, true, true) })
	b.Run("kafka+clickhouse", func(b *testing.B) { run(b, true, true, true) })
}

// processCPU returns the user+system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// bareRates holds the rate of the last BenchmarkIngestHTTPS run of each
// bare server, for the receiver's ratios.
var bareRates = map[string]float64{}

// BenchmarkIngestHTTPS is the receiver's throughput check: benchClients
// posters of benchRecords-record batches over https, against
//   - bare-stdlib: an https server in this process that only gunzips and
//     decodes each batch, as a third party would write it with the standard
//     library (bareStdlibHandler: compress/gzip, and encoding/json
//     decoding the envelope with its records as []json.RawMessage);
//   - bare-accesslog: the same with the receiver's own decoder
//     (klauspost/compress's gzip and accesslog.Decode, which validates and
//     splits in one pass, 2 times cheaper than encoding/json);
//   - receiver-spool: the rtld-receiver binary as a process with its
//     default settings, durability on (fsync before every answer) and no
//     sink: what ingest alone costs;
//   - receiver: the same with both sinks (kfake in this process,
//     ClickHouse 18.16), timed until both sinks acknowledged every record.
//
// The receivers report, besides driveWith's rates, their acknowledged and
// delivered rates over each bare server's of the same invocation
// (ack-ratio and ratio against bare-stdlib, ack-ratio-accesslog and
// ratio-accesslog), peak-rss-MiB: the process's peak resident memory
// (VmHWM), rcv-cpu-us/record: the receiver process's CPU per record,
// ch-cpu-us/record: clickhouse-server's, rcv-read-B/record: the bytes the
// receiver read per record (sockets and spool), and sink-deferred-s: how
// long both sinks' workers held batches back while ingest was saturated. Run the bare servers first, and
// alternate runs with -count 1 in a loop (-count 2 runs every bare server
// twice, then every receiver twice).
//
// Run: go test -run '^$' -bench 'IngestHTTPS' -benchtime 300x ./internal/rtld/receiver/
func BenchmarkIngestHTTPS(b *testing.B) {
	cert := newTestCert(b)
	client := func() *http.Client {
		return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchClients, TLSClientConfig: &tls.Config{RootCAs: cert.pool}}}
	}
	bare := func(name string, h http.HandlerFunc) {
		b.Run(name, func(b *testing.B) {
			l := makeLoad(b, b.N)
			srv := httptest.NewUnstartedServer(h)
			srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert.tls}}
			srv.StartTLS()
			defer srv.Close()
			bareRates[name], _ = driveWith(b, client(), benchClients, srv.URL+"/ingest/env", l, func() bool { return true }, 0)
		})
	}
	bare("bare-stdlib", bareStdlibHandler)
	bare("bare-accesslog", bareHandler)
	receiver := func(name string, sinks bool) {
		b.Run(name, func(b *testing.B) {
			l := makeLoad(b, b.N)
			rcv := startBenchReceiver(b, cert, sinks)
			acked, delivered := driveWith(b, client(), benchClients, rcv.base+"/ingest/env", l, rcv.drained(client()), processPoll)
			rcv.report(b, l.records)
			for _, r := range []struct{ bare, suffix string }{{"bare-stdlib", ""}, {"bare-accesslog", "-accesslog"}} {
				if rate := bareRates[r.bare]; rate > 0 {
					b.ReportMetric(acked/rate, "ack-ratio"+r.suffix)
					b.ReportMetric(delivered/rate, "ratio"+r.suffix)
				}
			}
		})
	}
	receiver("receiver-spool", false)
	receiver("receiver", true)
}

// BenchmarkIngestBigBatches posts b.N batches of about 29 MB (decoded; the
// default --ingest.max-decoded-bytes is 32 MiB) with 16 clients at once to
// the receiver binary with both sinks and its default settings, and
// reports the process's peak resident memory: --ingest.max-memory-bytes
// bounds the request bodies, the rest is the sinks' and the runtime's.
//
// Run: go test -run '^$' -bench 'IngestBigBatches' -benchtime 16x ./internal/rtld/receiver/
func BenchmarkIngestBigBatches(b *testing.B) {
	const records = 14_000 // of about 2 KB
	cert := newTestCert(b)
	l := generateLoad(b, rand.New(rand.NewPCG(3, 4)), "big", b.N, records)
	b.Logf("%d batches of %.1f MB (%.1f MB gzipped)", b.N, float64(l.decoded)/float64(b.N)/1e6, float64(l.wire)/float64(b.N)/1e6)
	rcv := startBenchReceiver(b, cert, true)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, TLSClientConfig: &tls.Config{RootCAs: cert.pool}}}
	driveWith(b, client, 16, rcv.base+"/ingest/env", l, rcv.drained(client), processPoll)
	rcv.report(b, l.records)
}

// bareStdlibHandler is the bare server as a third party would write it
// with the standard library alone: it gunzips the body (compress/gzip) and
// decodes the json envelope with encoding/json, keeping each record as
// raw JSON (which encoding/json checks is valid, as any server accepting
// JSON must), and answers 400 to a body it cannot read. It stores nothing.
func bareStdlibHandler(w http.ResponseWriter, r *http.Request) {
	zr, err := gzip.NewReader(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var batch struct {
		AccountNumber string            `json:"account_number"`
		AgentID       string            `json:"agent_id"`
		Datestamp     string            `json:"datestamp"`
		Platform      string            `json:"platform"`
		ProfileID     int64             `json:"profile_id"`
		SeqNum        int64             `json:"seq_num"`
		Logs          []json.RawMessage `json:"logs"`
	}
	if err := json.NewDecoder(zr).Decode(&batch); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"status":"accepted","records":%d}`, len(batch.Logs))
}

// bareHandler is the bare server with the receiver's own decoder.
func bareHandler(w http.ResponseWriter, r *http.Request) {
	zr, err := kgzip.NewReader(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if _, err := accesslog.Decode("env", zr); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	_, _ = w.Write([]byte(`{"status":"accepted"}`))
}

// benchReceiver is the receiver binary under a benchmark.
type benchReceiver struct {
	p         *receiverProcess
	ch        *testenv.ClickHouseServer // nil without sinks
	base      string
	pool      *x509.CertPool
	cpu0, ch0 time.Duration
	rchar0    int64
	withSinks bool
}

// benchReceiverArgsEnv names the environment variable whose
// space-separated flags the benchmarks add to the receiver's.
const benchReceiverArgsEnv = "EDGEPIPE_BENCH_RECEIVER_ARGS"

// startBenchReceiver starts the receiver binary over https with its
// default settings, and with sinks both of them: kfake in this process (a
// topic of 6 partitions) and ClickHouse.
func startBenchReceiver(b *testing.B, cert testCert, sinks bool) *benchReceiver {
	b.Helper()
	addr := testenv.FreeAddr(b)
	args := []string{
		"--no-register", "--web.listen-address=" + addr, "--web.config.file=" + cert.webConfig(b), "--log.level=warn",
		"--spool.dir=" + filepath.Join(b.TempDir(), "spool"),
	}
	rcv := &benchReceiver{base: "https://" + addr, pool: cert.pool, withSinks: sinks}
	if sinks {
		kafka := testenv.Kafka(b)
		kafka.CreateTopic(b, "bench", 6)
		rcv.ch = testenv.ClickHouse(b)
		args = append(args, "--kafka.brokers="+kafka.Addr(), "--kafka.topic=bench", "--clickhouse.dsn="+rcv.ch.DSN(rcv.ch.NewDatabase(b)))
	}
	// More flags to compare settings, e.g. --no-delivery.ingest-first.
	args = append(args, strings.Fields(os.Getenv(benchReceiverArgsEnv))...)
	rcv.p = startReceiver(b, args, []string{"EDGEPIPE_RTLD_USERNAME=bench", "EDGEPIPE_RTLD_PASSWORD=bench"})
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cert.pool}}, Timeout: 5 * time.Second}
	waitReady(b, client, rcv.base)
	rcv.cpu0 = pidCPU(b, rcv.p.cmd.Process.Pid)
	rcv.rchar0 = procIO(b, rcv.p, "rchar")
	if rcv.ch != nil {
		rcv.ch0 = pidCPU(b, rcv.ch.Pid())
	}
	return rcv
}

// drained reports whether both sinks acknowledged everything spooled
// (always, without sinks).
func (r *benchReceiver) drained(client *http.Client) func() bool {
	return func() bool {
		if !r.withSinks {
			return true
		}
		for _, sink := range []string{"kafka", "clickhouse"} {
			if scrape(client, r.base+"/metrics", `edgepipe_rtld_sink_lag_entries{sink="`+sink+`"}`) != 0 {
				return false
			}
		}
		return true
	}
}

// report reports the receiver process's peak RSS and CPU per record, and
// clickhouse-server's CPU per record.
func (r *benchReceiver) report(b *testing.B, records int) {
	b.ReportMetric(float64(procStatusKB(b, r.p, "VmHWM"))/1024, "peak-rss-MiB")
	if r.withSinks {
		// How long the workers held batches back for ingest, both sinks
		// together.
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.pool}}}
		deferred := 0.0
		for _, sink := range []string{"kafka", "clickhouse"} {
			// -1: never deferred (no series yet).
			deferred += max(0, scrape(c, r.base+"/metrics", `edgepipe_rtld_sink_deferred_seconds_total{sink="`+sink+`"}`))
		}
		b.ReportMetric(deferred, "sink-deferred-s")
	}
	b.ReportMetric(float64((pidCPU(b, r.p.cmd.Process.Pid)-r.cpu0).Microseconds())/float64(records), "rcv-cpu-us/record")
	// Bytes the process read per record (sockets, and the spool: once per
	// sink, more when a Kafka partition fell behind and read it again).
	b.ReportMetric(float64(procIO(b, r.p, "rchar")-r.rchar0)/float64(records), "rcv-read-B/record")
	if r.ch != nil {
		b.ReportMetric(float64((pidCPU(b, r.ch.Pid())-r.ch0).Microseconds())/float64(records), "ch-cpu-us/record")
	}
}

// procIO returns a counter of /proc/<pid>/io of the receiver process.
func procIO(b testing.TB, p *receiverProcess, field string) int64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", p.cmd.Process.Pid))
	if err != nil {
		b.Fatalf("reading the receiver's I/O counters: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+": "); ok {
			n, err := strconv.ParseInt(rest, 10, 64)
			if err != nil {
				b.Fatalf("%s: %v", line, err)
			}
			return n
		}
	}
	b.Fatalf("no %s in /proc/<pid>/io", field)
	return 0
}

// pidCPU returns the user+system CPU time process pid has used.
func pidCPU(b testing.TB, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("reading the CPU time of process %d: %v", pid, err)
	}
	// Fields after the command name (which may hold spaces): state is 3,
	// utime 14, stime 15, in clock ticks of 1/100 s.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
