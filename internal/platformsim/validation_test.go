package platformsim_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platformsim"
)

func TestDatasetDescriptors(t *testing.T) {
	_, base := startSim(t, platformsim.Config{Seed: 1})
	tok := token(t, base, "app.metrics")
	r := do(t, http.MethodGet, base+"/metrics/v1/datasets", "Bearer "+tok, "", "")
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var coll struct {
		ID    string               `json:"@id"`
		Type  string               `json:"@type"`
		Items []metricsapi.Dataset `json:"items"`
	}
	if err := json.Unmarshal(r.body, &coll); err != nil {
		t.Fatal(err)
	}
	if coll.Type != "Collection" || coll.ID == "" || len(coll.Items) != 6 {
		t.Fatalf("collection %s with %d items", coll.Type, len(coll.Items))
	}
	edge := []string{"requests_edge_total", "requests_per_second_edge", "requests_hit_total", "requests_cache_hit_ratio",
		"requests_miss_total", "requests_stale_total", "requests_prefetch_total", "requests_prefetch_cache_hit_ratio",
		"requests_cachable_total", "requests_2xx_total", "requests_3xx_total", "requests_4xx_total", "requests_5xx_total",
		"requests_error_ratio", "bytes_edge_total", "bytes_hit_total", "bytes_miss_total", "bytes_stale_total", "bits_per_second_edge"}
	origin := []string{"requests_origin_total", "bytes_origin_total"}
	for _, p := range []string{"5", "25", "50", "75", "95", "99"} {
		edge = append(edge, "ttfb_edge_ms_"+p+"_percentile")
		origin = append(origin, "ttfb_origin_ms_"+p+"_percentile")
	}
	for _, p := range []string{"5", "25", "50", "75", "95", "99"} {
		edge = append(edge, "response_time_edge_ms_"+p+"_percentile")
		origin = append(origin, "response_time_origin_ms_"+p+"_percentile")
	}
	want := map[string]struct {
		labels  []string
		metrics []string
	}{
		"edge_usage_by_country":   {[]string{"country_code"}, edge},
		"edge_errors":             {[]string{"country_code", "http_status_code"}, []string{"requests_edge_total"}},
		"origin_usage_by_country": {[]string{"country_code", "origin_name"}, origin},
		"origin_usage":            {[]string{"origin_name", "http_method", "content_type"}, origin},
		"origin_errors":           {[]string{"origin_name", "http_method", "content_type", "http_status_code"}, []string{"requests_origin_total"}},
		"origin_offload":          {[]string{"http_method", "content_type"}, []string{"requests_edge_total", "requests_origin_total", "bytes_edge_total", "bytes_origin_total"}},
	}
	for _, d := range coll.Items {
		w, ok := want[d.Name]
		if !ok {
			t.Fatalf("unexpected dataset %s", d.Name)
		}
		if d.Dimensions[0].Name != "time" || d.Dimensions[0].Type != "DATE" || d.Dimensions[1].Name != "environment_id" {
			t.Errorf("%s: dimensions %v", d.Name, d.Dimensions)
		}
		var labels []string
		for _, l := range d.Labels() {
			labels = append(labels, l.Name)
			if l.Name == "http_status_code" && l.Type != "NUMBER" {
				t.Errorf("%s: http_status_code type %s", d.Name, l.Type)
			}
		}
		if mustJSON(labels) != mustJSON(w.labels) {
			t.Errorf("%s: labels %v, want %v", d.Name, labels, w.labels)
		}
		if mustJSON(d.MetricNames()) != mustJSON(w.metrics) {
			t.Errorf("%s: metrics %v, want %v", d.Name, d.MetricNames(), w.metrics)
		}
		if len(d.Filters) != 1+len(w.labels) || d.Filters[0].Name != "environment_id" || !d.Filters[0].Required {
			t.Errorf("%s: filters %v", d.Name, d.Filters)
		}
		for _, f := range d.Filters[1:] {
			if f.Required || f.Type != "array" {
				t.Errorf("%s: optional filter %v", d.Name, f)
			}
		}
		if d.Retention.FiveMinutes != 2764800 || d.Retention.Hour != 8208000 || d.Retention.Day != 69120000 {
			t.Errorf("%s: retention %+v", d.Name, d.Retention)
		}
		if len(d.TimeGranularities) != 3 {
			t.Errorf("%s: granularities %v", d.Name, d.TimeGranularities)
		}
		one := do(t, http.MethodGet, base+"/metrics/v1/datasets/"+d.Name, "Bearer "+tok, "", "")
		var got metricsapi.Dataset
		if err := json.Unmarshal(one.body, &got); err != nil || one.status != 200 || mustJSON(got) != mustJSON(d) {
			t.Errorf("GET dataset %s: %d %v", d.Name, one.status, err)
		}
	}
	checkError(t, do(t, http.MethodGet, base+"/metrics/v1/datasets/nope", "Bearer "+tok, "", ""), 404, "name")
	checkError(t, do(t, http.MethodPost, base+"/metrics/v1/datasets", "Bearer "+tok, "", ""), 405, "")
	checkError(t, do(t, http.MethodGet, base+"/metrics/v1/datasets/edge_errors/data", "Bearer "+tok, "", ""), 405, "")
}

func TestDataValidation(t *testing.T) {
	clk := newClock(testNow)
	srv, base := startSim(t, platformsim.Config{Seed: 1, Now: clk.Now})
	tok := token(t, base, "app.metrics")
	envs := srv.EnvironmentIDs()
	many := make([]string, 21)
	for i := range many {
		many[i] = envs[i]
	}
	countries := []string{"us", "de", "gb", "fr", "jp", "br", "in", "ca", "au", "nl", "es", "it", "sg", "za", "-", "pl", "se", "no", "fi", "dk", "at"}
	day := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	rng := func(d time.Duration) map[string]any {
		return map[string]any{"start": day.Format(time.RFC3339), "end": day.Add(d).Format(time.RFC3339)}
	}
	// valid returns a valid query, modified by f.
	valid := func(f func(q map[string]any)) map[string]any {
		q := map[string]any{
			"dimensions":       []string{"time", "environment_id", "country_code"},
			"metrics":          []string{"requests_edge_total", "requests_cache_hit_ratio"},
			"filters":          map[string]any{"environment_id": []string{envs[0], envs[1]}},
			"date_range":       rng(time.Hour),
			"time_granularity": "FIVE_MINUTES",
		}
		if f != nil {
			f(q)
		}
		return q
	}
	tests := []struct {
		name    string
		dataset string
		raw     string // when set, the body as is
		query   map[string]any
		status  int
		source  string
	}{
		{name: "valid", query: valid(nil), status: 200},
		{name: "valid 20 environments", query: valid(func(q map[string]any) { q["filters"] = map[string]any{"environment_id": many[:20]} }), status: 200},
		{name: "valid FIVE_MINUTES 24h", query: valid(func(q map[string]any) { q["date_range"] = rng(24 * time.Hour) }), status: 200},
		{name: "valid HOUR 7d", query: valid(func(q map[string]any) { q["date_range"] = rng(7 * 24 * time.Hour); q["time_granularity"] = "HOUR" }), status: 200},
		{name: "valid DAY 60d", query: valid(func(q map[string]any) { q["date_range"] = rng(60 * 24 * time.Hour); q["time_granularity"] = "DAY" }), status: 200},
		{name: "valid without dimensions", query: valid(func(q map[string]any) { delete(q, "dimensions"); delete(q, "time_granularity") }), status: 200},
		{name: "valid optional filter", query: valid(func(q map[string]any) {
			q["filters"] = map[string]any{"environment_id": []string{envs[0]}, "country_code": []string{"us", "-"}}
		}), status: 200},
		{name: "valid status filter", dataset: "edge_errors", query: valid(func(q map[string]any) {
			q["metrics"] = []string{"requests_edge_total"}
			q["dimensions"] = []string{"time", "http_status_code"}
			q["filters"] = map[string]any{"environment_id": []string{envs[0]}, "http_status_code": []string{"502", "503"}}
		}), status: 200},

		{name: "malformed JSON", raw: `{"metrics": [`, status: 400, source: "body"},
		{name: "not an object", raw: `["requests_edge_total"]`, status: 400, source: "body"},
		{name: "trailing data", raw: `{} {}`, status: 400, source: "body"},
		{name: "empty body", raw: ``, status: 400, source: "body"},
		{name: "wrong case property", query: valid(func(q map[string]any) { q["Metrics"] = q["metrics"] }), status: 400, source: "Metrics"},
		{name: "missing metrics", query: valid(func(q map[string]any) { delete(q, "metrics") }), status: 400, source: "metrics"},
		{name: "null metrics", query: valid(func(q map[string]any) { q["metrics"] = nil }), status: 400, source: "metrics"},
		{name: "empty metrics", query: valid(func(q map[string]any) { q["metrics"] = []string{} }), status: 400, source: "metrics"},
		{name: "metrics not an array", query: valid(func(q map[string]any) { q["metrics"] = "requests_edge_total" }), status: 400, source: "metrics"},
		{name: "metric not a string", query: valid(func(q map[string]any) { q["metrics"] = []any{"requests_edge_total", 7} }), status: 400, source: "metrics[1]"},
		{name: "unknown metric", query: valid(func(q map[string]any) {
			q["metrics"] = []string{"requests_edge_total", "requests_hit_total", "requests_miss_total", "requests_teapot_total"}
		}), status: 400, source: "metrics[3]"},
		{name: "metric of another dataset", query: valid(func(q map[string]any) { q["metrics"] = []string{"requests_origin_total"} }), status: 400, source: "metrics[0]"},
		{name: "percentile that does not exist", query: valid(func(q map[string]any) { q["metrics"] = []string{"ttfb_edge_ms_90_percentile"} }), status: 400, source: "metrics[0]"},
		{name: "duplicate metric", query: valid(func(q map[string]any) { q["metrics"] = []string{"requests_edge_total", "requests_edge_total"} }), status: 400, source: "metrics[1]"},
		{name: "unknown dimension", query: valid(func(q map[string]any) { q["dimensions"] = []string{"time", "city"} }), status: 400, source: "dimensions[1]"},
		{name: "dimension of another dataset", query: valid(func(q map[string]any) { q["dimensions"] = []string{"origin_name"} }), status: 400, source: "dimensions[0]"},
		{name: "duplicate dimension", query: valid(func(q map[string]any) { q["dimensions"] = []string{"time", "time"} }), status: 400, source: "dimensions[1]"},
		{name: "dimensions not an array", query: valid(func(q map[string]any) { q["dimensions"] = "time" }), status: 400, source: "dimensions"},
		{name: "missing filters", query: valid(func(q map[string]any) { delete(q, "filters") }), status: 400, source: "filters"},
		{name: "filters not an object", query: valid(func(q map[string]any) { q["filters"] = []string{envs[0]} }), status: 400, source: "filters"},
		{name: "missing environment filter", query: valid(func(q map[string]any) { q["filters"] = map[string]any{"country_code": []string{"us"}} }), status: 400, source: "filters.environment_id"},
		{name: "empty environment filter", query: valid(func(q map[string]any) { q["filters"] = map[string]any{"environment_id": []string{}} }), status: 400, source: "filters.environment_id"},
		{name: "environment filter not an array", query: valid(func(q map[string]any) { q["filters"] = map[string]any{"environment_id": envs[0]} }), status: 400, source: "filters.environment_id"},
		{name: "21 environments", query: valid(func(q map[string]any) { q["filters"] = map[string]any{"environment_id": many} }), status: 400, source: "filters.environment_id"},
		{name: "unknown environment", query: valid(func(q map[string]any) {
			q["filters"] = map[string]any{"environment_id": []string{envs[0], "5b0c7d0e-0000-4000-8000-000000000000"}}
		}), status: 400, source: "filters.environment_id[1]"},
		{name: "environment not a string", query: valid(func(q map[string]any) { q["filters"] = map[string]any{"environment_id": []any{envs[0], 12}} }), status: 400, source: "filters.environment_id[1]"},
		{name: "unknown filter", query: valid(func(q map[string]any) {
			q["filters"] = map[string]any{"environment_id": []string{envs[0]}, "http_method": []string{"GET"}}
		}), status: 400, source: "filters.http_method"},
		{name: "optional filter with 21 values", query: valid(func(q map[string]any) {
			q["filters"] = map[string]any{"environment_id": []string{envs[0]}, "country_code": countries}
		}), status: 400, source: "filters.country_code"},
		{name: "optional filter not an array", query: valid(func(q map[string]any) {
			q["filters"] = map[string]any{"environment_id": []string{envs[0]}, "country_code": "us"}
		}), status: 400, source: "filters.country_code"},
		{name: "status filter not a status", dataset: "edge_errors", query: valid(func(q map[string]any) {
			q["metrics"] = []string{"requests_edge_total"}
			q["dimensions"] = []string{"time"}
			q["filters"] = map[string]any{"environment_id": []string{envs[0]}, "http_status_code": []string{"5xx"}}
		}), status: 400, source: "filters.http_status_code[0]"},
		{name: "missing date_range", query: valid(func(q map[string]any) { delete(q, "date_range") }), status: 400, source: "date_range"},
		{name: "date_range not an object", query: valid(func(q map[string]any) { q["date_range"] = "today" }), status: 400, source: "date_range"},
		{name: "missing start", query: valid(func(q map[string]any) { q["date_range"] = map[string]any{"end": day.Format(time.RFC3339)} }), status: 400, source: "date_range.start"},
		{name: "missing end", query: valid(func(q map[string]any) { q["date_range"] = map[string]any{"start": day.Format(time.RFC3339)} }), status: 400, source: "date_range.end"},
		{name: "start not a date", query: valid(func(q map[string]any) {
			q["date_range"] = map[string]any{"start": "yesterday", "end": day.Format(time.RFC3339)}
		}), status: 400, source: "date_range.start"},
		{name: "start not a string", query: valid(func(q map[string]any) {
			q["date_range"] = map[string]any{"start": 1763856000, "end": day.Format(time.RFC3339)}
		}), status: 400, source: "date_range.start"},
		{name: "end without zone", query: valid(func(q map[string]any) {
			q["date_range"] = map[string]any{"start": day.Format(time.RFC3339), "end": "2026-11-22T01:00:00"}
		}), status: 400, source: "date_range.end"},
		{name: "start equals end", query: valid(func(q map[string]any) { q["date_range"] = rng(0) }), status: 400, source: "date_range"},
		{name: "start after end", query: valid(func(q map[string]any) { q["date_range"] = rng(-time.Hour) }), status: 400, source: "date_range"},
		{name: "unknown granularity", query: valid(func(q map[string]any) { q["time_granularity"] = "MINUTE" }), status: 400, source: "time_granularity"},
		{name: "lowercase granularity", query: valid(func(q map[string]any) { q["time_granularity"] = "hour" }), status: 400, source: "time_granularity"},
		{name: "granularity not a string", query: valid(func(q map[string]any) { q["time_granularity"] = 300 }), status: 400, source: "time_granularity"},
		{name: "FIVE_MINUTES longer than 24h", query: valid(func(q map[string]any) { q["date_range"] = rng(24*time.Hour + 5*time.Minute) }), status: 400, source: "date_range"},
		{name: "HOUR longer than 7d", query: valid(func(q map[string]any) {
			q["date_range"] = rng(7*24*time.Hour + time.Hour)
			q["time_granularity"] = "HOUR"
		}), status: 400, source: "date_range"},
		{name: "DAY longer than 60d", query: valid(func(q map[string]any) {
			q["date_range"] = rng(61 * 24 * time.Hour)
			q["time_granularity"] = "DAY"
		}), status: 400, source: "date_range"},
		{name: "default granularity longer than 60d", query: valid(func(q map[string]any) {
			q["date_range"] = rng(61 * 24 * time.Hour)
			delete(q, "time_granularity")
		}), status: 400, source: "date_range"},
		{name: "unknown dataset", dataset: "edge_usage", query: valid(nil), status: 404, source: "name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ds := tc.dataset
			if ds == "" {
				ds = "edge_usage_by_country"
			}
			body := tc.raw
			if tc.query != nil {
				body = mustJSON(tc.query)
			}
			r := do(t, http.MethodPost, base+"/metrics/v1/datasets/"+ds+"/data", "Bearer "+tok, "application/json", body)
			if tc.status == 200 {
				dataRows(t, r)
				return
			}
			checkError(t, r, tc.status, tc.source)
		})
	}
	t.Run("several problems reported together", func(t *testing.T) {
		r := dataQuery(t, base, tok, "edge_usage_by_country", valid(func(q map[string]any) {
			q["metrics"] = []string{"nope"}
			q["filters"] = map[string]any{"environment_id": []string{"bad"}}
		}))
		checkError(t, r, 400, "metrics[0]")
		checkError(t, r, 400, "filters.environment_id[0]")
	})
	t.Run("not JSON", func(t *testing.T) {
		r := do(t, http.MethodPost, base+"/metrics/v1/datasets/edge_errors/data", "Bearer "+tok, "text/plain", mustJSON(valid(nil)))
		checkError(t, r, 415, "Content-Type")
	})
	t.Run("JSON with charset", func(t *testing.T) {
		r := do(t, http.MethodPost, base+"/metrics/v1/datasets/edge_usage_by_country/data", "Bearer "+tok, "application/json; charset=utf-8", mustJSON(valid(nil)))
		dataRows(t, r)
	})
	t.Run("older than retention", func(t *testing.T) {
		q := valid(nil)
		old := testNow.Add(-40 * 24 * time.Hour).Truncate(time.Hour)
		q["date_range"] = map[string]any{"start": old.Format(time.RFC3339), "end": old.Add(2 * time.Hour).Format(time.RFC3339)}
		if _, rows := dataRows(t, dataQuery(t, base, tok, "edge_usage_by_country", q)); len(rows) != 0 {
			t.Fatalf("%d five-minute rows from 40 days ago (retention 32 days)", len(rows))
		}
		q["time_granularity"] = "HOUR"
		if _, rows := dataRows(t, dataQuery(t, base, tok, "edge_usage_by_country", q)); len(rows) == 0 {
			t.Fatal("no hourly rows from 40 days ago (retention 95 days)")
		}
	})
	t.Run("future", func(t *testing.T) {
		q := valid(nil)
		q["date_range"] = map[string]any{"start": testNow.Add(time.Hour).Format(time.RFC3339), "end": testNow.Add(2 * time.Hour).Format(time.RFC3339)}
		if _, rows := dataRows(t, dataQuery(t, base, tok, "edge_usage_by_country", q)); len(rows) != 0 {
			t.Fatalf("%d rows from the future", len(rows))
		}
	})
	t.Run("no token", func(t *testing.T) {
		r := do(t, http.MethodPost, base+"/metrics/v1/datasets/edge_errors/data", "", "application/json", mustJSON(valid(nil)))
		checkError(t, r, 401, "Authorization")
	})
	t.Run("rejections are recorded", func(t *testing.T) {
		st := srv.Stats()
		bad := 0
		for _, d := range st.Data {
			if d.Status == 400 {
				bad++
			}
		}
		if bad == 0 || st.Count("POST /metrics/v1/datasets/{name}/data", 400) != bad {
			t.Fatalf("stats: %d recorded 400s, route count %d", bad, st.Count("POST /metrics/v1/datasets/{name}/data", 400))
		}
	})
}
