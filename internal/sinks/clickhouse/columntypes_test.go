package clickhouse

import (
	"strings"
	"testing"
)

func TestColumnTypesProblem(t *testing.T) {
	spec := &Table{Name: "edge_errors", Columns: []Column{
		{Name: "time", Type: "DateTime CODEC(Delta, ZSTD(1))"},
		{Name: "environment_id", Type: "LowCardinality(String)"},
		{Name: "http_status_code", Type: "Int64"},
		{Name: "requests_edge_total", Type: "UInt64 CODEC(T64, ZSTD(1))"},
		{Name: "requests_error_ratio", Type: "Float64"},
	}}
	for _, tc := range []struct {
		name    string
		columns map[string]string
		bad     []string // columns named in the problem
	}{
		{name: "same types", columns: map[string]string{"time": "DateTime", "environment_id": "LowCardinality(String)", "http_status_code": "Int64",
			"requests_edge_total": "UInt64", "requests_error_ratio": "Float64"}},
		{name: "wrappers, time zones and precision", columns: map[string]string{"time": "DateTime64(6, 'UTC')", "environment_id": "String",
			"http_status_code": "Nullable(Int64)", "requests_edge_total": "UInt64"}},
		{name: "fixed string", columns: map[string]string{"environment_id": "FixedString(36)"}},
		{name: "missing columns are Ensure's", columns: map[string]string{"time": "DateTime"}},
		{name: "no table", columns: nil},
		{name: "a date for a counter", columns: map[string]string{"requests_edge_total": "Date"}, bad: []string{"requests_edge_total"}},
		{name: "other widths and kinds", columns: map[string]string{"time": "Date", "environment_id": "UInt32", "http_status_code": "Int32",
			"requests_edge_total": "Float64", "requests_error_ratio": "UInt64"},
			bad: []string{"time", "environment_id", "http_status_code", "requests_edge_total", "requests_error_ratio"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ColumnTypesProblem(spec, tc.columns)
			if len(tc.bad) == 0 {
				if err != nil {
					t.Fatalf("problem %v, want none", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no problem, want one naming %v", tc.bad)
			}
			for _, c := range tc.bad {
				if !strings.Contains(err.Error(), "column "+c+" of table edge_errors has type "+tc.columns[c]) {
					t.Errorf("problem %q does not name column %s", err, c)
				}
			}
			if strings.Count(err.Error(), "ALTER TABLE") != len(tc.bad) {
				t.Errorf("problem %q: want one statement per column", err)
			}
		})
	}
}
