package metricsapi

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseValue(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want float64 // NaN compares by IsNaN
		bad  bool
	}{
		{`12`, 12, false},
		{`12.5`, 12.5, false},
		{`-3e2`, -300, false},
		{`"42"`, 42, false},
		{`" 0.25 "`, 0.25, false},
		{`"1e3"`, 1000, false},
		{`null`, math.NaN(), false},
		{`""`, math.NaN(), false},
		{`"NaN"`, math.NaN(), false},
		{`"abc"`, 0, true},
		{`true`, 0, true},
		{`[1]`, 0, true},
		{`{"v":1}`, 0, true},
	} {
		got, err := parseValue(json.RawMessage(tt.in))
		if (err != nil) != tt.bad {
			t.Errorf("parseValue(%s): err = %v, want bad=%v", tt.in, err, tt.bad)
			continue
		}
		if tt.bad {
			continue
		}
		if math.IsNaN(tt.want) != math.IsNaN(got) || (!math.IsNaN(got) && got != tt.want) {
			t.Errorf("parseValue(%s) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestParseTime(t *testing.T) {
	want := time.Date(2026, 11, 23, 4, 5, 0, 0, time.UTC)
	for _, tt := range []struct {
		in   string
		want time.Time
		bad  bool
	}{
		{`"2026-11-23T04:05:00Z"`, want, false},
		{`"2026-11-23T04:05:00.000Z"`, want, false},
		{`"2026-11-23T05:05:00+01:00"`, want, false},
		{`"2026-11-23T04:05:00"`, want, false},
		{`"2026-11-23 04:05:00"`, want, false},
		{`"2026-11-23 04:05:00Z"`, want, false},
		{`"2026-11-23T04:05Z"`, want, false},
		{`"2026-11-23"`, want.Truncate(24 * time.Hour), false},
		{`1795406700`, want, false},
		{`"1795406700"`, want, false},
		{`1795406700000`, want, false},
		{`"yesterday"`, time.Time{}, true},
		{`null`, time.Time{}, true},
		{`-5`, time.Time{}, true},
	} {
		got, err := parseTime(json.RawMessage(tt.in))
		if (err != nil) != tt.bad {
			t.Errorf("parseTime(%s): err = %v, want bad=%v", tt.in, err, tt.bad)
			continue
		}
		if !tt.bad && (!got.Equal(tt.want) || got.Location() != time.UTC) {
			t.Errorf("parseTime(%s) = %v, want %v UTC", tt.in, got, tt.want)
		}
	}
}

func TestParseLabel(t *testing.T) {
	for _, tt := range []struct {
		in      string
		numeric bool
		want    string
		bad     bool
	}{
		{`"us"`, false, "us", false},
		{`"-"`, false, "-", false},
		{`503`, true, "503", false},
		{`503.0`, true, "503", false},
		{`"503.0"`, true, "503", false},
		{`"503"`, true, "503", false},
		{`503`, false, "503", false}, // a number is a number whatever the field says
		{`"007"`, false, "007", false},
		{`2.5`, true, "2.5", false},
		{`null`, false, "", false},
		{`{"a":1}`, false, "", true},
	} {
		got, err := parseLabel(json.RawMessage(tt.in), tt.numeric)
		if (err != nil) != tt.bad || got != tt.want {
			t.Errorf("parseLabel(%s, %v) = %q, %v; want %q bad=%v", tt.in, tt.numeric, got, err, tt.want, tt.bad)
		}
	}
}

func decodeJSON(t *testing.T, body string) *dataResponse {
	t.Helper()
	var resp dataResponse
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	return &resp
}

func TestDecodeRows(t *testing.T) {
	r := &Request{
		Dataset:      "edge_errors",
		Environments: []string{"e1", "e2"},
		Labels:       []string{"country_code", "http_status_code"},
		Metrics:      []string{"requests_edge_total", "requests_5xx_total"},
	}
	// Fields in an order unlike the request's, an extra field, one metric
	// missing, rows out of time order, numbers as strings.
	body := `{
	  "data_fields": [
	    {"name":"requests_edge_total","data_type":"NUMBER"},
	    {"name":"http_status_code","data_type":"NUMBER"},
	    {"name":"extra","data_type":"STRING"},
	    {"name":"environment_id","data_type":"STRING"},
	    {"name":"time","data_type":"DATE"},
	    {"name":"country_code","data_type":"STRING"}
	  ],
	  "data_rows": [
	    ["17", 503.0, "x", "e2", "2026-11-23T04:10:00Z", "de"],
	    [5, "502", null, "e1", "2026-11-23T04:05:00Z", "-"],
	    [null, 500, "x", "e1", "2026-11-23T04:00:00Z", "us"]
	  ]}`
	rows, err := decodeRows(r, decodeJSON(t, body))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 {
		t.Fatalf("%d rows", len(rows))
	}
	got := rows[0]
	if got.Environment != "e2" || !got.Time.Equal(time.Date(2026, 11, 23, 4, 10, 0, 0, time.UTC)) ||
		strings.Join(got.Labels, ",") != "de,503" || got.Values[0] != 17 || !math.IsNaN(got.Values[1]) {
		t.Errorf("row 0 = %+v", got)
	}
	if rows[1].Labels[1] != "502" || rows[1].Labels[0] != "-" || rows[1].Values[0] != 5 {
		t.Errorf("row 1 = %+v", rows[1])
	}
	if !math.IsNaN(rows[2].Values[0]) {
		t.Errorf("row 2 null value = %v, want NaN", rows[2].Values[0])
	}
	// Rows do not share label or value storage.
	rows[0].Labels[0] = "zz"
	if rows[1].Labels[0] == "zz" || rows[2].Labels[0] == "zz" {
		t.Error("rows share label storage")
	}
	if rows[0].SeriesKey() == rows[1].SeriesKey() {
		t.Error("different series share a key")
	}
}

func TestDecodeRowsSingleEnvWithoutField(t *testing.T) {
	r := &Request{Dataset: "d", Environments: []string{"only"}, Metrics: []string{"m"}}
	rows, err := decodeRows(r, decodeJSON(t, `{"data_fields":[{"name":"time"},{"name":"m"}],"data_rows":[["2026-11-23T00:00:00Z",1]]}`))
	if err != nil || len(rows) != 1 || rows[0].Environment != "only" {
		t.Fatalf("rows = %+v, err = %v", rows, err)
	}
}

func TestDecodeRowsGarbage(t *testing.T) {
	r := &Request{Dataset: "edge_errors", Environments: []string{"e1", "e2"}, Labels: []string{"country_code"}, Metrics: []string{"m"}}
	fields := `"data_fields":[{"name":"time"},{"name":"environment_id"},{"name":"country_code"},{"name":"m"}]`
	tests := []struct {
		name string
		body string
		want []string
	}{
		{"short row", `{` + fields + `,"data_rows":[["2026-11-23T00:00:00Z","e1","us",1],["2026-11-23T00:00:00Z","e1"]]}`,
			[]string{"edge_errors", "row 1", "2 values for 4"}},
		{"bad value", `{` + fields + `,"data_rows":[["2026-11-23T00:00:00Z","e1","us","lots"]]}`,
			[]string{"edge_errors", "row 0", "m", "lots"}},
		{"bad time", `{` + fields + `,"data_rows":[["noon","e1","us",1]]}`,
			[]string{"edge_errors", "row 0", "time"}},
		{"bad env", `{` + fields + `,"data_rows":[["2026-11-23T00:00:00Z",7,"us",1]]}`,
			[]string{"row 0", "environment_id"}},
		{"no time field", `{"data_fields":[{"name":"environment_id"},{"name":"country_code"},{"name":"m"}],"data_rows":[]}`,
			[]string{"no time field"}},
		{"no label field", `{"data_fields":[{"name":"time"},{"name":"environment_id"},{"name":"m"}],"data_rows":[]}`,
			[]string{"country_code"}},
		{"duplicate field", `{"data_fields":[{"name":"time"},{"name":"time"}],"data_rows":[]}`,
			[]string{"twice"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeRows(r, decodeJSON(t, tt.body))
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %q lacks %q", err, w)
				}
			}
		})
	}
}

func BenchmarkDecodeRows(b *testing.B) {
	// One FIVE_MINUTES day of 20 environments × 10 countries, 3 metrics.
	r := &Request{Dataset: "d", Environments: envIDs(20), Labels: []string{"country_code"}, Metrics: []string{"a", "b", "c"}}
	var sb strings.Builder
	sb.WriteString(`{"data_fields":[{"name":"time"},{"name":"environment_id"},{"name":"country_code"},{"name":"a"},{"name":"b"},{"name":"c"}],"data_rows":[`)
	n := 0
	for s := t0; s.Before(t0.Add(24 * time.Hour)); s = s.Add(5 * time.Minute) {
		for _, e := range r.Environments {
			for _, c := range []string{"us", "de", "fr", "gb", "jp", "br", "in", "cn", "au", "-"} {
				if n > 0 {
					sb.WriteByte(',')
				}
				n++
				sb.WriteString(`["` + s.Format(time.RFC3339) + `","` + e + `","` + c + `",12345,"0.93",17.5]`)
			}
		}
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var resp dataResponse
		if err := json.Unmarshal(body, &resp); err != nil {
			b.Fatal(err)
		}
		rows, err := decodeRows(r, &resp)
		if err != nil || len(rows) != n {
			b.Fatal(err, len(rows))
		}
	}
}
