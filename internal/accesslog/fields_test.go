package accesslog

import (
	"regexp"
	"testing"
)

func TestCatalogue(t *testing.T) {
	all := Fields()
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
		case TypeString, TypeInteger, TypeFloat, TypeTimestamp:
		default:
			t.Errorf("field %q has type %q", f.Code, f.Type)
		}
		if IsCustomField(f.Code) {
			t.Errorf("catalogued code %q collides with a custom-field prefix", f.Code)
		}
	}
	// Every code the platform notes name, with the type the notes give.
	notes := map[string]FieldType{
		"timestamp": TypeTimestamp, "status_code": TypeInteger, "client_ip": TypeString, "host": TypeString,
		"path": TypeString, "query": TypeString, "method": TypeString, "user_agent": TypeString,
		"referer": TypeString, "bytes_in": TypeInteger, "bytes_out": TypeInteger, "cache_status": TypeString,
		"pop": TypeString, "client_country_code": TypeString, "client_asn": TypeInteger,
		"origin_name": TypeString, "total_time": TypeFloat, "uuid": TypeString,
	}
	for code, want := range notes {
		got, ok := FieldTypeOf(code)
		if !ok || got != want {
			t.Errorf("FieldTypeOf(%q) = %q, %v; want %q", code, got, ok, want)
		}
	}
	all[0].Code = "mutated"
	if Fields()[0].Code == "mutated" {
		t.Error("Fields returned the shared catalogue")
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
		if typ, ok := FieldTypeOf(tt.got); !ok || typ != TypeString {
			t.Errorf("FieldTypeOf(%q) = %q, %v", tt.got, typ, ok)
		}
	}
	if _, ok := FieldTypeOf("no_such_field"); ok {
		t.Error("unknown code reported as typed")
	}
}
