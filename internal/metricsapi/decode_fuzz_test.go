package metricsapi

import (
	"encoding/json"
	"math"
	"testing"
)

// FuzzDecodeRows feeds arbitrary data_rows to the decoder: it must never
// panic, and every value it returns must be a value (finite; a count not
// negative) or NaN, whatever the platform sent.
func FuzzDecodeRows(f *testing.F) {
	for _, rows := range []string{
		`[["2026-11-23T00:00:00Z","e1","us",1,0.5]]`,
		`[["2026-11-23T00:00:00Z","e1","us","NaN","Infinity"],["2026-11-23T00:05:00Z","e2","de",-12345,null]]`,
		`[["2026-11-23T00:00:00Z","e1"],{"a":1},7,["noon","e1","us",1,1],["2026-11-23T00:00:00Z","e1","us",1e999,"-1e999"]]`,
		`[["2026-11-23T00:00:00Z","e1",["x"],"12","n/a"]]`,
	} {
		f.Add([]byte(rows))
	}
	r := &Request{Dataset: "d", Environments: []string{"e1", "e2"}, Granularity: FiveMinutes,
		Labels: []string{"country_code"}, Metrics: []string{"requests_edge_total", "requests_cache_hit_ratio"}}
	fields := []DataField{{Name: "time"}, {Name: "environment_id"}, {Name: "country_code"},
		{Name: "requests_edge_total", DataType: TypeNumber}, {Name: "requests_cache_hit_ratio", DataType: TypeNumber}}
	f.Fuzz(func(t *testing.T, rows []byte) {
		if !json.Valid(rows) {
			return // the platform client rejects the whole body first
		}
		got, probs, err := decodeRows(r, &dataResponse{DataFields: fields, DataRows: rows})
		if err != nil {
			return
		}
		for _, row := range got {
			if len(row.Values) != 2 || len(row.Labels) != 1 {
				t.Fatalf("row %+v", row)
			}
			for i, v := range row.Values {
				if math.IsInf(v, 0) || (i == 0 && v < 0) {
					t.Fatalf("value %v of %s passed as a value", v, r.Metrics[i])
				}
			}
		}
		if probs.InvalidValues() < 0 || probs.InvalidRows() < 0 {
			t.Fatal("negative problem count")
		}
	})
}
