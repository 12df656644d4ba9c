package metricsapi

import (
	"strings"
	"testing"
)

func TestRowScanner(t *testing.T) {
	tests := []struct {
		in   string
		want []string // rows, values joined by |
		bad  bool
	}{
		{`[]`, nil, false},
		{` null `, nil, false},
		{``, nil, false},
		{`[[]]`, []string{""}, false},
		{`[[1,"a"],[2,"b"]]`, []string{`1|"a"`, `2|"b"`}, false},
		{"[ [ 1 , \"x\" ] ,\n [ null , true ] ]", []string{`1|"x"`, `null|true`}, false},
		{`[["a,b]\"c\\", -1.5e3]]`, []string{`"a,b]\"c\\"|-1.5e3`}, false},
		{`[[[1,[2]],{"k":"]"}]]`, []string{`[1,[2]]|{"k":"]"}`}, false},
		{`{"a":1}`, nil, true},
		{`[1,{"a":[2]},"x"]`, []string{`!1`, `!{"a":[2]}`, `!"x"`}, false}, // rows that are not arrays: skipped by the caller
		{`[[1,2]`, nil, true},
		{`[[1 2]]`, nil, true},
		{`[["abc]]`, nil, true},
		{`[[1,]]`, nil, true},
	}
	for _, tt := range tests {
		sc := newRowScanner([]byte(tt.in))
		var got []string
		var err error
		for {
			var row scannedRow
			var ok bool
			row, ok, err = sc.next()
			if err != nil || !ok {
				break
			}
			if !row.array {
				got = append(got, "!"+string(row.raw))
				continue
			}
			parts := make([]string, len(row.vals))
			for i, v := range row.vals {
				parts[i] = string(v)
			}
			got = append(got, strings.Join(parts, "|"))
		}
		if (err != nil) != tt.bad {
			t.Errorf("%s: err = %v, want bad=%v", tt.in, err, tt.bad)
			continue
		}
		if !tt.bad && strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
			t.Errorf("%s: rows %q, want %q", tt.in, got, tt.want)
		}
	}
}
