package platformsim

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// SampleRecords returns n access-log records as the simulator delivers
// them for a profile with every catalogued field (JSON objects, one
// environment, seeded: the same arguments give the same records, uuids
// aside), timestamped around now. Tests and measurements that need
// realistic records without a delivery use it (e.g. the bytes on disk per
// record of access_logs).
func SampleRecords(seed int64, n int, now time.Time) []json.RawMessage {
	p := rtldProfile{ID: 1, Fields: accesslog.FieldCodes(), Delivery: rtldDelivery{LogFormat: formatJSON}}
	shape := shapeOf(p)
	rc := recordContext{accountNumber: "1234", environmentID: "env-sample", hosts: []string{"www.example.com", "img.example.com", "api.example.com"}, origins: []string{"origin-a", "origin-b"}}
	g := newRecordGenerator(seed, 1)
	out := make([]json.RawMessage, n)
	for i := range out {
		rec := g.record(shape, rc, now.Add(time.Duration(i-n)*10*time.Millisecond))
		var b bytes.Buffer
		b.WriteByte('{')
		for k, key := range shape.keys {
			if k > 0 {
				b.WriteByte(',')
			}
			kb, _ := json.Marshal(key)
			vb, _ := json.Marshal(rec.values[k])
			b.Write(kb)
			b.WriteByte(':')
			b.Write(vb)
		}
		b.WriteByte('}')
		out[i] = b.Bytes()
	}
	return out
}
