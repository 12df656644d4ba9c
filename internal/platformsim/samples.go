package platformsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// SampleRecords returns n access-log records of the traffic model as the
// simulator delivers them for a profile with every catalogued field (JSON
// objects of the world's first environment, from the FIVE_MINUTES buckets
// before now, newest first; the same arguments give the same records, uuids
// aside). Tests and measurements that need realistic records without a
// delivery use it (e.g. the bytes on disk per record of access_logs).
func SampleRecords(seed int64, n int, now time.Time) ([]json.RawMessage, error) {
	s, err := New(Config{Seed: seed, Now: func() time.Time { return now }})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	env := s.Environments()[0]
	shape := shapeOf(rtldProfile{ID: 1, EnvironmentID: env.ID, Fields: accesslog.FieldCodes(), Delivery: rtldDelivery{LogFormat: formatJSON}})
	rc := recordContext{accountNumber: env.LegacyAccountNumber, environmentID: env.ID, hosts: environmentHosts(env), origins: env.Origins}
	out := make([]json.RawMessage, 0, n)
	// A day of buckets is far more than any caller asks for; the bound
	// keeps a world without traffic from looping forever.
	start := now.Truncate(logBucketWidth)
	for range 24 * 12 {
		start = start.Add(-logBucketWidth)
		plan, ok := s.logPlan(env.ID, start, 100)
		if !ok {
			break
		}
		for j := int64(0); j < plan.records && len(out) < n; j++ {
			r := plan.request(j, &rc)
			r.uuid = newUUID()
			out = append(out, encodeObject(shape.keys, r.record(shape).values))
		}
		if len(out) == n {
			return out, nil
		}
	}
	return nil, fmt.Errorf("the model has %d records in the day before %s, %d asked for", len(out), now, n)
}

// encodeObject renders one record as a JSON object of keys and values.
func encodeObject(keys []string, values []any) json.RawMessage {
	var b bytes.Buffer
	b.WriteByte('{')
	for k, key := range keys {
		if k > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(key)
		vb, _ := json.Marshal(values[k])
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes()
}
