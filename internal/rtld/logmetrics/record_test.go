package logmetrics

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestStatusClass(t *testing.T) {
	for _, tc := range []struct {
		raw   string
		class string
		ok    bool
	}{
		{"200", "2xx", true},
		{"101", "1xx", true},
		{"304", "3xx", true},
		{"404", "4xx", true},
		{"599", "5xx", true},
		{`"503"`, "5xx", true},
		{"600", "unknown", false},
		{"099", "unknown", false},
		{"0", "unknown", false},
		{"2000", "unknown", false},
		{"20", "unknown", false},
		{"-200", "unknown", false},
		{"200.0", "unknown", false},
		{"2e2", "unknown", false},
		{`"ok"`, "unknown", false},
		{`"2xx"`, "unknown", false},
		{"true", "unknown", false},
		{"", "unknown", false},
	} {
		c, ok := statusClass([]byte(tc.raw))
		if statusClasses[c] != tc.class || ok != tc.ok {
			t.Errorf("statusClass(%s) = %s, %v; want %s, %v", tc.raw, statusClasses[c], ok, tc.class, tc.ok)
		}
	}
}

func TestNumber(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want float64
		ok   bool
	}{
		{"0", 0, true},
		{"1234", 1234, true},
		{"0.104683", 0.104683, true},
		{"12.5", 12.5, true},
		{`"1024"`, 1024, true},
		{"123456789012345", 123456789012345, true},
		{"1234567890123456789", 1234567890123456789, true}, // beyond the fast path
		{"1.5e3", 1500, true},
		{"2E-3", 0.002, true},
		{"-1", 0, false},
		{"-0.5", 0, false},
		{"1e400", 0, false},
		{`"NaN"`, 0, false},
		{`"Infinity"`, 0, false},
		{`"n/a"`, 0, false},
		{`""`, 0, false},
		{"true", 0, false},
	} {
		v, ok := number([]byte(tc.raw))
		if ok != tc.ok || (ok && v != tc.want) {
			t.Errorf("number(%s) = %v, %v; want %v, %v", tc.raw, v, ok, tc.want, tc.ok)
		}
	}
}

// TestDecimalMatchesParseFloat: the fast conversion gives strconv's value
// bit for bit.
func TestDecimalMatchesParseFloat(t *testing.T) {
	for _, s := range []string{"0.1", "0.000001", "0.123456", "3.14159265358979", "999999999999999", "0.30000000000000", "12345.678901"} {
		got, ok := decimal([]byte(s))
		var want float64
		if err := json.Unmarshal([]byte(s), &want); err != nil || !ok || got != want {
			t.Errorf("decimal(%s) = %v (%v), json %v", s, got, ok, want)
		}
	}
}

func TestLabelValue(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	for _, tc := range []struct {
		raw, want string
	}{
		{`"TCP_HIT"`, "TCP_HIT"},
		{`""`, ""},
		{`null`, ""},
		{``, ""},
		{`"caf\u00e9"`, "café"},
		{`"a\"b"`, `a"b`},
		{`42`, "42"},
		{`true`, "true"},
		{`"` + long + `"`, strings.Repeat("é", 128)}, // cut at 256 bytes, on a rune boundary
		{`"x` + long + `"`, "x" + strings.Repeat("é", 127)},
	} {
		if got := string(labelValue([]byte(tc.raw))); got != tc.want {
			t.Errorf("labelValue(%.40s) = %.40q, want %.40q", tc.raw, got, tc.want)
		}
	}
}

// TestScanRecord: the fast scan finds what the generic one does, or hands
// the record to it.
func TestScanRecord(t *testing.T) {
	all := fieldSet(1<<numFields - 1)
	for _, tc := range []struct {
		name string
		rec  string
		fast bool // the fast scan handles it
		want map[field]string
	}{
		{"compact", `{"status_code":404,"pop":"FRA","cache_status":"TCP_MISS","bytes_out":512,"total_time":0.25,"host":"a.example","client_country_code":"DE"}`, true,
			map[field]string{fieldStatus: "404", fieldPOP: `"FRA"`, fieldCache: `"TCP_MISS"`, fieldBytes: "512", fieldTime: "0.25", fieldHost: `"a.example"`, fieldCountry: `"DE"`}},
		{"missing fields", `{"uuid":"u","status_code":200}`, true, map[field]string{fieldStatus: "200"}},
		{"empty", `{}`, true, map[field]string{}},
		{"escaped quotes in values", `{"path":"/a\"b\\","status_code":500,"user_agent":"x\\\"y","pop":"P\"1"}`, true,
			map[field]string{fieldStatus: "500", fieldPOP: `"P\"1"`}},
		{"backslash before the closing quote", `{"query":"a\\\\","pop":"AMS"}`, true, map[field]string{fieldPOP: `"AMS"`}},
		{"null and other scalars", `{"pop":null,"bytes_out":true,"total_time":1e-3}`, true,
			map[field]string{fieldPOP: "null", fieldBytes: "true", fieldTime: "1e-3"}},
		{"nested value", `{"extra":{"pop":"no"},"pop":"yes","list":[1,{"a":2}]}`, false, map[field]string{fieldPOP: `"yes"`}},
		{"whitespace", `{ "pop" : "LHR" , "status_code" : 200 }`, false, map[field]string{fieldPOP: `"LHR"`, fieldStatus: "200"}},
		{"escaped key", `{"po\u0070":"SIN"}`, false, map[field]string{fieldPOP: `"SIN"`}},
		{"key given twice: the first counts", `{"pop":"A","pop":"B"}`, true, map[field]string{fieldPOP: `"A"`}},
		{"number before the end", `{"pop":"A","bytes_out":77}`, true, map[field]string{fieldPOP: `"A"`, fieldBytes: "77"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !json.Valid([]byte(tc.rec)) {
				t.Fatalf("test record is not JSON: %s", tc.rec)
			}
			var fast, slow rawFields
			var lay layout
			ok := scanRecord([]byte(tc.rec), all, &fast, &lay)
			if ok != tc.fast {
				t.Errorf("fast scan handled it: %v, want %v", ok, tc.fast)
			}
			scanRecordSlow([]byte(tc.rec), all, &slow)
			for f := range numFields {
				if got := string(slow[f]); got != tc.want[f] {
					t.Errorf("%s: generic scan %q, want %q", fieldCodes[f], got, tc.want[f])
				}
				if ok && string(fast[f]) != string(slow[f]) {
					t.Errorf("%s: fast scan %q, generic %q", fieldCodes[f], fast[f], slow[f])
				}
			}
		})
	}
}

// TestScanRecordLayout: a batch whose records change their key order is
// read right; the layout follows the records.
func TestScanRecordLayout(t *testing.T) {
	want := fieldSet(1<<fieldStatus | 1<<fieldPOP)
	var lay layout
	for _, tc := range []struct{ rec, status, pop string }{
		{`{"status_code":200,"pop":"A","host":"h"}`, "200", `"A"`},
		{`{"status_code":201,"pop":"B","host":"h"}`, "201", `"B"`},
		{`{"pop":"C","status_code":202}`, "202", `"C"`},
		{`{"status_cod":1,"status_code":203,"pop":"D"}`, "203", `"D"`},
		{`{"status_codes":1,"status_code":204,"pop":"E"}`, "204", `"E"`},
		{`{"status_code":205}`, "205", ""},
	} {
		var raw rawFields
		if !scanRecord([]byte(tc.rec), want, &raw, &lay) {
			t.Fatalf("%s: not scanned", tc.rec)
		}
		if string(raw[fieldStatus]) != tc.status || string(raw[fieldPOP]) != tc.pop {
			t.Errorf("%s: status %s pop %s", tc.rec, raw[fieldStatus], raw[fieldPOP])
		}
	}
}

// FuzzScanRecord: on any JSON object the fast scan either hands over or
// agrees with the generic one.
func FuzzScanRecord(f *testing.F) {
	for _, s := range []string{
		`{"status_code":404,"pop":"FRA","cache_status":"TCP_MISS","bytes_out":512,"total_time":0.25}`,
		`{"a":"\\","pop":"x\"y"}`, `{"pop":[1,"a"],"host":{"b":1}}`, `{}`, `{"pop":null}`,
	} {
		f.Add(s, s)
	}
	all := fieldSet(1<<numFields - 1)
	f.Fuzz(func(t *testing.T, first, rec string) {
		if !json.Valid([]byte(rec)) || !strings.HasPrefix(rec, "{") {
			return
		}
		var lay layout
		if json.Valid([]byte(first)) {
			var raw rawFields
			scanRecord([]byte(first), all, &raw, &lay) // a layout learnt from another record
		}
		var fast, slow rawFields
		ok := scanRecord([]byte(rec), all, &fast, &lay)
		scanRecordSlow([]byte(rec), all, &slow)
		if !ok {
			return
		}
		for f := range numFields {
			if string(fast[f]) != string(slow[f]) {
				t.Fatalf("%s of %s: fast %q, generic %q", fieldCodes[f], rec, fast[f], slow[f])
			}
		}
	})
}
