package receiver_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
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
	wire    int64 // gzip bytes
	decoded int64 // JSON bytes
}

func makeLoad(b *testing.B, n int) benchLoad {
	b.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	var l benchLoad
	var buf bytes.Buffer
	for i := 0; i < n; i++ {
		buf.Reset()
		fmt.Fprintf(&buf, `{"account_number":"ACME","agent_id":"agent-%d","datestamp":"20261123","platform":"delivery","profile_id":1,"seq_num":%d,"logs":[`, i%16, i/16)
		writeRecords(&buf, r, benchRecords, i)
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
	work := make(chan []byte)
	lat := make([]time.Duration, 0, len(l.bodies))
	var mu sync.Mutex
	var wg sync.WaitGroup
	b.ResetTimer()
	cpu0 := processCPU(b)
	start := time.Now()
	for c := 0; c < benchClients; c++ {
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
	acked := time.Since(start)
	for !drained() {
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p99 := lat[len(lat)*99/100]
	records := float64(len(l.bodies) * benchRecords)
	b.ReportMetric(records/elapsed.Seconds(), "records/s")
	b.ReportMetric(float64(l.decoded)/elapsed.Seconds()/1e6, "MB/s")
	b.ReportMetric(float64(l.wire)/elapsed.Seconds()/1e6, "gzipMB/s")
	b.ReportMetric(records/acked.Seconds(), "acked-records/s")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ack-ms")
	// CPU of this process (clients, receiver, in-process kfake; not the
	// ClickHouse server) per record: unlike the rates, it hardly moves when
	// other work shares the machine.
	b.ReportMetric(float64(cpu.Microseconds())/records, "cpu-us/record")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkIngest compares, on the same load in the same run:
//   - bare: a net/http server that only gunzips and decodes each batch;
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
	b.Run("bare", func(b *testing.B) {
		l := makeLoad(b, b.N)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			zr, err := kgzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if _, err := accesslog.Decode("env", zr); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.Write([]byte(`{"status":"accepted"}`))
		}))
		defer srv.Close()
		drive(b, srv.URL+"/ingest/env", l, func() bool { return true })
	})
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
