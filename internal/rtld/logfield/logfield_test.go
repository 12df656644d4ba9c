package logfield

import (
	"regexp"
	"testing"
)

func TestCatalogue(t *testing.T) {
	all := All()
	if len(all) < 60 {
		t.Fatalf("catalogue has %d fields, want about 70", len(all))
	}
	codeRE := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	seen := map[string]bool{}
	for _, f := range all {
		if seen[f.Code] {
			t.Errorf("duplicate code %q", f.Code)
		}
		seen[f.Code] = true
		if !codeRE.MatchString(f.Code) || f.Name == "" {
			t.Errorf("bad field %+v", f)
		}
		switch f.Type {
		case String, Integer, Float, Timestamp:
		default:
			t.Errorf("field %q has type %q", f.Code, f.Type)
		}
		if IsCustom(f.Code) {
			t.Errorf("catalogued code %q collides with a custom-field prefix", f.Code)
		}
	}
	// Every code the platform notes name, with the type the notes give.
	notes := map[string]Type{
		"timestamp": Timestamp, "status_code": Integer, "client_ip": String, "host": String,
		"path": String, "query": String, "method": String, "user_agent": String,
		"referer": String, "bytes_in": Integer, "bytes_out": Integer, "cache_status": String,
		"pop": String, "client_country_code": String, "client_asn": Integer,
		"origin_name": String, "total_time": Float, "uuid": String,
	}
	for code, want := range notes {
		got, ok := TypeOf(code)
		if !ok || got != want {
			t.Errorf("TypeOf(%q) = %q, %v; want %q", code, got, ok, want)
		}
	}
	all[0].Code = "mutated"
	if All()[0].Code == "mutated" {
		t.Error("All returned the shared catalogue")
	}
}

func TestCustomFields(t *testing.T) {
	tests := []struct {
		got, want string
	}{
		{RequestHeaderField("X-Request-Id"), "req_hdr_x_request_id"},
		{ResponseHeaderField("Content-Language"), "resp_hdr_content_language"},
		{CookieField("session-ID"), "cookie_session_id"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
		if typ, ok := TypeOf(tt.got); !ok || typ != String {
			t.Errorf("TypeOf(%q) = %q, %v", tt.got, typ, ok)
		}
	}
	if _, ok := TypeOf("no_such_field"); ok {
		t.Error("unknown code reported as typed")
	}
}
