package logmetrics

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// benchBatch returns a json batch of n records with every catalogue field
// (about 2 KB each, the receiver benchmark's shape) holding realistic
// values for the fields the metrics read: 40 POPs, 6 cache statuses, 8
// hosts, 60 countries; wide has 50 cache statuses, as the receiver
// benchmark's records (2,000 label sets instead of 240 at the default
// labels).
func benchBatch(tb testing.TB, n, seq int, wide bool) *accesslog.Batch {
	tb.Helper()
	r := rand.New(rand.NewPCG(uint64(seq), 2))
	var buf bytes.Buffer
	fmt.Fprintf(&buf, `{"account_number":"ACME","agent_id":"agent-1","datestamp":"20261123","platform":"delivery","profile_id":1,"seq_num":%d,"logs":[`, seq)
	statuses := []int{200, 200, 200, 200, 206, 301, 304, 404, 403, 500, 503}
	caches := []string{"TCP_HIT", "TCP_MISS", "TCP_EXPIRED_HIT", "CONFIG_NOCACHE", "UNCACHEABLE", "TCP_PARTIAL_HIT"}
	if wide {
		caches = caches[:0]
		for i := range 50 {
			caches = append(caches, fmt.Sprintf("cache_status-%d", i))
		}
	}
	for j := range n {
		if j > 0 {
			buf.WriteByte(',')
		}
		buf.WriteByte('{')
		for k, f := range accesslog.Fields() {
			if k > 0 {
				buf.WriteByte(',')
			}
			buf.WriteString(strconv.Quote(f.Code))
			buf.WriteByte(':')
			switch f.Code {
			case "status_code":
				buf.WriteString(strconv.Itoa(statuses[r.IntN(len(statuses))]))
			case "cache_status":
				buf.WriteString(strconv.Quote(caches[r.IntN(len(caches))]))
			case "pop":
				fmt.Fprintf(&buf, `"pop%02d"`, r.IntN(40))
			case "host":
				fmt.Fprintf(&buf, `"www%d.example.com"`, r.IntN(8))
			case "client_country_code":
				fmt.Fprintf(&buf, `"C%02d"`, r.IntN(60))
			case "total_time":
				buf.WriteString(strconv.FormatFloat(r.ExpFloat64()*0.05, 'f', 6, 64))
			default:
				switch f.Type {
				case accesslog.TypeInteger:
					buf.WriteString(strconv.Itoa(r.IntN(100000)))
				case accesslog.TypeFloat, accesslog.TypeTimestamp:
					buf.WriteString(strconv.FormatFloat(r.Float64()*10, 'f', 6, 64))
				default:
					fmt.Fprintf(&buf, `"%s-%d"`, f.Code, r.IntN(50))
				}
			}
		}
		buf.WriteByte('}')
	}
	buf.WriteString("]}")
	b, err := accesslog.DecodeBytes("env", buf.Bytes())
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// BenchmarkObserveSpooled is the CPU the live metrics add per record
// (ns/op is per record; thread-cpu-ns/record is the CPU time of the
// benchmark's thread, which other work on the machine hardly moves):
// parsing the fields and counting them, for batches of 500 records of the
// receiver benchmark's shape.
func BenchmarkObserveSpooled(b *testing.B) {
	for _, tc := range []struct {
		labels []string
		wide   bool
	}{{[]string{LabelPOP}, false}, {[]string{LabelPOP}, true}, {[]string{}, false}, {[]string{LabelPOP, LabelHost, LabelCountry}, false}} {
		b.Run(fmt.Sprintf("labels=%v/wide=%v", tc.labels, tc.wide), func(b *testing.B) {
			m, err := New(Config{Labels: tc.labels, MaxSeries: DefaultMaxSeries})
			if err != nil {
				b.Fatal(err)
			}
			const n = 500
			batches := make([]*accesslog.Batch, 64)
			for i := range batches {
				batches[i] = benchBatch(b, n, i, tc.wide)
			}
			var seq int64
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ResetTimer()
			cpu := threadCPU()
			for i := 0; i < b.N; i += n {
				bt := *batches[seq%int64(len(batches))]
				bt.SeqNum = seq
				seq++
				m.ObserveSpooled(&bt)
			}
			b.ReportMetric(float64(threadCPU()-cpu)/float64(seq*n), "thread-cpu-ns/record")
		})
	}
}

// BenchmarkScanRecord compares the fast field scan with the generic one.
func BenchmarkScanRecord(b *testing.B) {
	rec := benchBatch(b, 1, 0, false).Records[0]
	want := fieldSet(1<<numFields - 1)
	run := func(b *testing.B, scan func(*rawFields)) {
		b.SetBytes(int64(len(rec)))
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var raw rawFields
		cpu, n := threadCPU(), 0
		for b.Loop() {
			scan(&raw)
			n++
		}
		b.ReportMetric(float64(threadCPU()-cpu)/float64(n), "thread-cpu-ns/record")
	}
	b.Run("fast", func(b *testing.B) {
		var lay layout
		run(b, func(raw *rawFields) {
			if !scanRecord(rec, want, raw, &lay) {
				b.Fatal("not scanned")
			}
		})
	})
	b.Run("generic", func(b *testing.B) {
		run(b, func(raw *rawFields) { scanRecordSlow(rec, want, raw) })
	})
}
