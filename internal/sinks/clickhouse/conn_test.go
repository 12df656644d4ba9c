package clickhouse

import "testing"

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		in                         string
		want                       Version
		lowCard, ttl, codecs, dt64 bool
		wantErr                    bool
	}{
		{in: "18.16.1", want: Version{Major: 18, Minor: 16, Patch: 1, Build: 0}},
		{in: "19.1.7", want: Version{Major: 19, Minor: 1, Patch: 7, Build: 0}},
		{in: "19.6.2.11", want: Version{Major: 19, Minor: 6, Patch: 2, Build: 11}, lowCard: true, ttl: true},
		{in: "24.8.4.13", want: Version{Major: 24, Minor: 8, Patch: 4, Build: 13}, lowCard: true, ttl: true, codecs: true, dt64: true},
		{in: "23.3.1.2823-lts", want: Version{Major: 23, Minor: 3, Patch: 1, Build: 2823}, lowCard: true, ttl: true, codecs: true, dt64: true},
		{in: " 20.1 ", want: Version{Major: 20, Minor: 1, Patch: 0, Build: 0}, lowCard: true, ttl: true, codecs: true, dt64: true},
		{in: "", wantErr: true},
		{in: "18", wantErr: true},
		{in: "x.1.2", wantErr: true},
		{in: "1.2.3.4.5", wantErr: true},
	} {
		v, err := ParseVersion(tc.in)
		if tc.wantErr {
			if err == nil {
				t.Errorf("ParseVersion(%q) = %v, want error", tc.in, v)
			}
			continue
		}
		if err != nil || v != tc.want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", tc.in, v, err, tc.want)
			continue
		}
		if v.HasLowCardinality() != tc.lowCard || v.HasTTL() != tc.ttl || v.HasCodecs() != tc.codecs || v.HasDateTime64() != tc.dt64 {
			t.Errorf("%v: lowcard/ttl/codecs/dt64 = %v/%v/%v/%v, want %v/%v/%v/%v", v,
				v.HasLowCardinality(), v.HasTTL(), v.HasCodecs(), v.HasDateTime64(), tc.lowCard, tc.ttl, tc.codecs, tc.dt64)
		}
	}
	if mustParseVersion(t, "18.16.1").Compare(mustParseVersion(t, "18.16.1.1")) != -1 {
		t.Error("18.16.1 should sort before 18.16.1.1")
	}
}

// mustParseVersion is ParseVersion for the tests' constants.
func mustParseVersion(t *testing.T, s string) Version {
	t.Helper()
	v, err := ParseVersion(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
