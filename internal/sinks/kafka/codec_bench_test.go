package kafka

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	kgzip "github.com/segmentio/kafka-go/compress/gzip"
	ksnappy "github.com/segmentio/kafka-go/compress/snappy"
	kzstd "github.com/segmentio/kafka-go/compress/zstd"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/platformsim"
)

// BenchmarkCodec compresses produce requests as the sink sends them (the
// messages of 500-record batches of the simulator's records with every
// field, about 1 MiB of records per request, written into the codec piece
// by piece as kafka-go's record batch encoder does) with each codec the
// sink offers, and reports the CPU per record and the compressed size.
//
// Run: go test -run '^$' -bench Codec -benchtime 2s ./internal/sinks/kafka/
func BenchmarkCodec(b *testing.B) {
	recs, err := platformsim.SampleRecords(11, 2000, time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	if err != nil {
		b.Fatal(err)
	}
	var msgs []kafkago.Message
	for i := 0; i < len(recs); i += 500 {
		batch := &accesslog.Batch{EnvironmentID: "env-1", Format: accesslog.FormatJSON, ProfileID: "1", AgentID: "agent-1",
			Datestamp: "20261127", SeqNum: int64(i / 500), Records: recs[i : i+500], ReceivedUnixNano: time.Now().UnixNano()}
		msgs = appendMessages(msgs, batch)
	}
	var reqs [][]kafkago.Message
	for start := 0; start < len(msgs); {
		end, size := start, int64(0)
		for end < len(msgs) && (end == start || size+messageBytes(&msgs[end]) <= DefaultMaxMessageBytes) {
			size += messageBytes(&msgs[end])
			end++
		}
		reqs = append(reqs, msgs[start:end])
		start = end
	}
	codecs := []struct {
		name  string
		codec kafkago.CompressionCodec
	}{
		{"none", nil},
		{"lz4", lz4Codec{}},
		{"lz4-kafka-go", kafkago.Lz4.Codec()},
		{"snappy", kafkago.Snappy.Codec()},
		{"snappy-faster", &ksnappy.Codec{Compression: ksnappy.FasterCompression}},
		{"zstd", kafkago.Zstd.Codec()},
		{"zstd-fastest", &kzstd.Codec{Level: 1}},
		{"gzip", kafkago.Gzip.Codec()},
		{"gzip-fastest", &kgzip.Codec{Level: 1}},
	}
	for _, c := range codecs {
		b.Run(c.name, func(b *testing.B) {
			var out bytes.Buffer
			var in, wire int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req := reqs[i%len(reqs)]
				out.Reset()
				in += writeRecords(&out, c.codec, req)
				wire += int64(out.Len())
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1000/float64(recordsIn(reqs, b.N)), "us/record")
			b.ReportMetric(float64(in)/float64(wire), "ratio")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// recordsIn counts the records of n requests taken in turn from reqs.
func recordsIn(reqs [][]kafkago.Message, n int) int {
	total := 0
	for i := 0; i < n; i++ {
		total += len(reqs[i%len(reqs)])
	}
	return total
}

// writeRecords writes msgs in Kafka's record format (v2) through codec
// into out, one field at a time as kafka-go's encoder does, and returns the
// uncompressed size.
func writeRecords(out *bytes.Buffer, codec kafkago.CompressionCodec, msgs []kafkago.Message) int64 {
	w := &countingWriter{w: out}
	var zc interface{ Close() error }
	if codec != nil {
		z := codec.NewWriter(out)
		w.w, zc = z, z
	}
	var vb [binary.MaxVarintLen64]byte
	varint := func(v int64) { _, _ = w.Write(vb[:binary.PutVarint(vb[:], v)]) }
	bytesField := func(p []byte) {
		varint(int64(len(p)))
		_, _ = w.Write(p)
	}
	for i, m := range msgs {
		varint(messageBytes(&m) - recordBatchOverhead)
		_, _ = w.Write([]byte{0})
		varint(0)
		varint(int64(i))
		bytesField(m.Key)
		bytesField(m.Value)
		varint(int64(len(m.Headers)))
		for _, h := range m.Headers {
			bytesField([]byte(h.Key))
			bytesField(h.Value)
		}
	}
	if zc != nil {
		_ = zc.Close()
	}
	return w.n
}

type countingWriter struct {
	w interface{ Write([]byte) (int, error) }
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.w.Write(p)
}
