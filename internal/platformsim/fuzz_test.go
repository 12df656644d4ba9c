package platformsim

import (
	"testing"
	"time"
)

// FuzzDataQuery feeds arbitrary bodies to the data request validation and,
// when one passes, to the query engine: neither may panic, and a rejected
// body always names at least one source.
func FuzzDataQuery(f *testing.F) {
	s, err := New(Config{Seed: 1, Environments: 3, Properties: 1})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	env := s.EnvironmentIDs()[0]
	f.Add("edge_usage_by_country", `{"dimensions":["time","environment_id","country_code"],"metrics":["requests_edge_total","ttfb_edge_ms_50_percentile"],"filters":{"environment_id":["`+env+`"]},"date_range":{"start":"2026-11-22T00:00:00Z","end":"2026-11-22T01:00:00Z"},"time_granularity":"FIVE_MINUTES"}`)
	f.Add("origin_errors", `{"metrics":["requests_origin_total"],"filters":{"environment_id":["`+env+`"],"http_status_code":["404"]},"date_range":{"start":"2026-11-20T00:00:00Z","end":"2026-11-22T00:00:00Z"}}`)
	f.Add("edge_errors", `{"metrics":[],"filters":{},"date_range":{"start":"x","end":null},"time_granularity":7}`)
	f.Add("origin_offload", `[1,2,3]`)
	f.Add("origin_usage", `{"metrics":["requests_origin_total"],"dimensions":["content_type","content_type"],"filters":{"environment_id":"`+env+`"}}`)
	at := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, dataset, body string) {
		ds, ok := s.dsByName[dataset]
		if !ok {
			return
		}
		q, details := s.parseQuery(ds, []byte(body))
		if details != nil {
			for _, d := range details {
				if d.Source == "" || d.Description == "" || d.Type != "ErrorDetail" {
					t.Fatalf("detail without source or description: %+v", d)
				}
			}
			return
		}
		if q.end.Sub(q.start) > 48*time.Hour {
			return // keep each input fast
		}
		fields, rows, _ := s.execute(q, at)
		if len(fields) != len(q.dims)+len(q.metrics) {
			t.Fatalf("%d fields for %d dimensions and %d metrics", len(fields), len(q.dims), len(q.metrics))
		}
		_ = rows
	})
}
