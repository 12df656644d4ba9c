package platformsim

import (
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// BenchmarkGenerateAndEncode measures drawing records from the log model
// plus json encoding and gzip of 500-record batches with every catalogued
// field: the simulator's cost per record, which bounds the load it can offer
// a receiver.
func BenchmarkGenerateAndEncode(b *testing.B) {
	s, err := New(Config{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	env := s.Environments()[0]
	p := rtldProfile{ID: 1, EnvironmentID: env.ID, Fields: accesslog.FieldCodes(), Delivery: rtldDelivery{LogFormat: formatJSON}}
	shape := shapeOf(p)
	rc := recordContext{accountNumber: "1234", environmentID: env.ID, hosts: environmentHosts(env), origins: env.Origins}
	plan, ok := s.logPlan(env.ID, time.Date(2026, 11, 23, 14, 0, 0, 0, time.UTC), 100)
	if !ok || plan.records < 500 {
		b.Fatalf("plan %v with %d records", ok, plan.records)
	}
	recs := make([]logRecord, 500)
	var raw int64
	j := int64(0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k := range recs {
			r := plan.request(j%plan.records, &rc)
			r.uuid = newUUID()
			recs[k] = r.record(shape)
			j++
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
