package platformsim

import (
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// BenchmarkGenerateAndEncode measures record generation plus json encoding
// and gzip of 500-record batches with every catalogued field: the
// simulator's cost per record, which bounds the load it can offer a
// receiver.
func BenchmarkGenerateAndEncode(b *testing.B) {
	p := rtldProfile{ID: 1, Fields: accesslog.FieldCodes(), Delivery: rtldDelivery{LogFormat: formatJSON}}
	shape := shapeOf(p)
	rc := recordContext{accountNumber: "1234", environmentID: "e", hosts: []string{"a.example.com"}, origins: []string{"o"}}
	g := newRecordGenerator(1, 1)
	now := time.Now()
	recs := make([]logRecord, 500)
	var raw int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range recs {
			recs[j] = g.record(shape, rc, now)
		}
		body, _, err := encodeBatch(formatJSON, batchHeader{AgentID: "a", Datestamp: "20260101"}, shape.keys, recs)
		if err != nil {
			b.Fatal(err)
		}
		raw += int64(len(body))
	}
	b.ReportMetric(float64(b.N*len(recs))/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(raw)/float64(b.N*len(recs)), "gzip-bytes/record")
}
