package metricsapi

import (
	"encoding/json"
	"maps"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseValue(t *testing.T) {
	for _, tt := range []struct {
		in     string
		count  bool
		want   float64 // when reason is ""
		reason string
	}{
		{`12`, true, 12, ""},
		{`12.5`, false, 12.5, ""},
		{`-3e2`, false, -300, ""}, // a negative ratio or rate is a value
		{`"42"`, true, 42, ""},
		{`" 0.25 "`, false, 0.25, ""},
		{`"1e3"`, true, 1000, ""},
		{`0`, true, 0, ""},
		{`-0`, true, 0, ""},
		{`1e-400`, true, 0, ""}, // underflow: a tiny number is still a number
		{``, true, 0, InvalidNull},
		{`null`, true, 0, InvalidNull},
		{`""`, false, 0, InvalidNull},
		{`"  "`, false, 0, InvalidNull},
		{`"NaN"`, true, 0, InvalidNaN},
		{`"nan"`, false, 0, InvalidNaN},
		{`"Infinity"`, true, 0, InvalidInf},
		{`"-Infinity"`, false, 0, InvalidInf},
		{`"+Inf"`, true, 0, InvalidInf},
		{`1e999`, true, 0, InvalidInf},
		{`-12345`, true, 0, InvalidNegative},
		{`"-1"`, true, 0, InvalidNegative},
		{`-12345`, false, -12345, ""},
		{`"abc"`, true, 0, InvalidText},
		{`"12 requests"`, true, 0, InvalidText},
		{`true`, true, 0, InvalidText},
		{`[1]`, true, 0, InvalidText},
		{`{"v":1}`, false, 0, InvalidText},
	} {
		got, reason := parseValue(json.RawMessage(tt.in), tt.count)
		if reason != tt.reason {
			t.Errorf("parseValue(%s, count=%v): reason %q, want %q", tt.in, tt.count, reason, tt.reason)
			continue
		}
		if reason != "" {
			if !math.IsNaN(got) {
				t.Errorf("parseValue(%s) = %v, want NaN for a non-value", tt.in, got)
			}
			continue
		}
		if got != tt.want || math.IsNaN(got) || math.IsInf(got, 0) {
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
		Granularity:  FiveMinutes,
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
	rows, probs, err := decodeRows(r, decodeJSON(t, body))
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
	// requests_5xx_total has no field (3 rows) and one value is null.
	if probs.Values[InvalidNull] != 4 || probs.InvalidValues() != 4 || probs.InvalidRows() != 0 {
		t.Errorf("problems = %+v, want 4 null values", probs)
	}
	if !strings.Contains(probs.ValueExample, "requests_") {
		t.Errorf("value example %q names no metric", probs.ValueExample)
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
	rows, _, err := decodeRows(r, decodeJSON(t, `{"data_fields":[{"name":"time"},{"name":"m"}],"data_rows":[["2026-11-23T00:00:00Z",1]]}`))
	if err != nil || len(rows) != 1 || rows[0].Environment != "only" {
		t.Fatalf("rows = %+v, err = %v", rows, err)
	}
}

// TestDecodeRowsValuesThatAreNot checks that every kind of non-value leaves
// its bucket without a value for that metric, is counted by reason, and
// does not affect the other values of the row or the other rows.
func TestDecodeRowsValuesThatAreNot(t *testing.T) {
	r := &Request{Dataset: "edge_usage_by_country", Environments: []string{"e1"}, Granularity: FiveMinutes,
		Labels: []string{"country_code"}, Metrics: []string{"requests_edge_total", "requests_cache_hit_ratio"}}
	body := `{"data_fields":[{"name":"time"},{"name":"environment_id"},{"name":"country_code"},{"name":"requests_edge_total"},{"name":"requests_cache_hit_ratio"}],
	  "data_rows":[
	    ["2026-11-23T00:00:00Z","e1","a",null,0.5],
	    ["2026-11-23T00:00:00Z","e1","b","NaN",0.5],
	    ["2026-11-23T00:00:00Z","e1","c",-12345,-0.5],
	    ["2026-11-23T00:00:00Z","e1","d","Infinity","-Infinity"],
	    ["2026-11-23T00:00:00Z","e1","e","lots",true],
	    ["2026-11-23T00:00:00Z","e1","f",1e999,"0.25"],
	    ["2026-11-23T00:00:00Z","e1","g",7,0.75]
	  ]}`
	rows, probs, err := decodeRows(r, decodeJSON(t, body))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]float64{ // country → values, NaN = no value
		"a": {math.NaN(), 0.5}, "b": {math.NaN(), 0.5}, "c": {math.NaN(), -0.5},
		"d": {math.NaN(), math.NaN()}, "e": {math.NaN(), math.NaN()}, "f": {math.NaN(), 0.25}, "g": {7, 0.75},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(rows), len(want))
	}
	for _, row := range rows {
		w := want[row.Labels[0]]
		for i, v := range row.Values {
			if math.IsNaN(w[i]) != math.IsNaN(v) || (!math.IsNaN(v) && v != w[i]) {
				t.Errorf("%s: value %d = %v, want %v", row.Labels[0], i, v, w[i])
			}
			if math.IsInf(v, 0) {
				t.Errorf("%s: value %d is infinite", row.Labels[0], i)
			}
		}
	}
	wantProbs := map[string]int{InvalidNull: 1, InvalidNaN: 1, InvalidNegative: 1, InvalidInf: 3, InvalidText: 2}
	if !maps.Equal(probs.Values, wantProbs) {
		t.Errorf("invalid values %v, want %v", probs.Values, wantProbs)
	}
	if probs.ValueExample != "e1 2026-11-23T00:00:00Z requests_edge_total=null" {
		t.Errorf("example %q", probs.ValueExample)
	}
}

// TestDecodeRowsMalformedRowsAreSkipped checks that one bad row costs only
// itself: the other rows of the answer are decoded, the bad one is counted
// by reason.
func TestDecodeRowsMalformedRowsAreSkipped(t *testing.T) {
	r := &Request{Dataset: "edge_errors", Environments: []string{"e1", "e2"}, Granularity: FiveMinutes,
		Labels: []string{"country_code"}, Metrics: []string{"requests_edge_total"}}
	fields := `"data_fields":[{"name":"time"},{"name":"environment_id"},{"name":"country_code"},{"name":"requests_edge_total"}]`
	good := `["2026-11-23T00:00:00Z","e1","us",1],["2026-11-23T00:05:00Z","e2","de",2]`
	for _, tt := range []struct {
		name, row, reason string
	}{
		{"short row", `["2026-11-23T00:00:00Z","e1"]`, RowArity},
		{"long row", `["2026-11-23T00:00:00Z","e1","us",1,2]`, RowArity},
		{"empty row", `[]`, RowArity},
		{"object row", `{"time":"2026-11-23T00:00:00Z"}`, RowNotArray},
		{"number row", `42`, RowNotArray},
		{"null row", `null`, RowNotArray},
		{"bad time", `["noon","e1","us",1]`, RowTime},
		{"null time", `[null,"e1","us",1]`, RowTime},
		{"unaligned time", `["2026-11-23T00:02:00Z","e1","us",1]`, RowTime},
		{"env not a string", `["2026-11-23T00:00:00Z",7,"us",1]`, RowEnvironment},
		{"env not asked for", `["2026-11-23T00:00:00Z","e9","us",1]`, RowEnvironment},
		{"empty env", `["2026-11-23T00:00:00Z","","us",1]`, RowEnvironment},
		{"object label", `["2026-11-23T00:00:00Z","e1",{"c":"us"},1]`, RowDimension},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, body := range []string{
				`{` + fields + `,"data_rows":[` + tt.row + `,` + good + `]}`,
				`{` + fields + `,"data_rows":[` + good + `,` + tt.row + `]}`,
			} {
				rows, probs, err := decodeRows(r, decodeJSON(t, body))
				if err != nil {
					t.Fatalf("the whole answer failed: %v", err)
				}
				if len(rows) != 2 || rows[0].Values[0]+rows[1].Values[0] != 3 {
					t.Errorf("rows %+v, want the two good ones", rows)
				}
				if !maps.Equal(probs.Rows, map[string]int{tt.reason: 1}) || probs.InvalidValues() != 0 {
					t.Errorf("problems %+v, want one %s row", probs, tt.reason)
				}
				if probs.RowExample == "" {
					t.Error("no example row")
				}
			}
		})
	}
}

// TestDecodeRowsBadAnswers lists what still fails the whole answer: data
// fields that do not match the request, and data_rows that are not an array
// of rows.
func TestDecodeRowsBadAnswers(t *testing.T) {
	r := &Request{Dataset: "edge_errors", Environments: []string{"e1", "e2"}, Labels: []string{"country_code"}, Metrics: []string{"m"}}
	fields := `"data_fields":[{"name":"time"},{"name":"environment_id"},{"name":"country_code"},{"name":"m"}]`
	tests := []struct {
		name string
		body string
		want []string
	}{
		{"rows not an array", `{` + fields + `,"data_rows":{"a":1}}`, []string{"edge_errors", "array of rows"}},
		{"no time field", `{"data_fields":[{"name":"environment_id"},{"name":"country_code"},{"name":"m"}],"data_rows":[]}`,
			[]string{"no time field"}},
		{"no environment field", `{"data_fields":[{"name":"time"},{"name":"country_code"},{"name":"m"}],"data_rows":[]}`,
			[]string{"environment_id"}},
		{"no label field", `{"data_fields":[{"name":"time"},{"name":"environment_id"},{"name":"m"}],"data_rows":[]}`,
			[]string{"country_code"}},
		{"duplicate field", `{"data_fields":[{"name":"time"},{"name":"time"}],"data_rows":[]}`,
			[]string{"twice"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := decodeRows(r, decodeJSON(t, tt.body))
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
		rows, _, err := decodeRows(r, &resp)
		if err != nil || len(rows) != n {
			b.Fatal(err, len(rows))
		}
	}
}
