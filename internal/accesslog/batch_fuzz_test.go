package accesslog

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeBatch checks that no input makes the decoder panic, that every
// failure is a *DecodeError, and that every accepted batch holds only JSON
// objects that are valid JSON and valid UTF-8 (sinks pass them on byte for
// byte) and survives the spool codec.
func FuzzDecodeBatch(f *testing.F) {
	for _, seed := range []string{
		`{"account_number":"A","agent_id":"a1","datestamp":"20261123","platform":"p","profile_id":1,"seq_num":0,"logs":[{"uuid":"u","timestamp":1523916295.768957,"status_code":200}]}`,
		`[{"uuid":"u1"},{"uuid":"u2"}]`,
		"{\"uuid\":\"u1\"}\n{\"uuid\":\"u2\"}\n",
		`{"logs":[]}`, `{"logs":{}}`, `[]`, `[1]`, `{"seq_num":-1,"logs":[{}]}`,
		`{"datestamp":"x","logs":[{}]}`, "", " ", "\x00", `[{"a":"\ud800"}]`, `{"a":1}{"b":2}`,
		`[{"a":1}`, `{"logs":[{"a":1}]} trailing`,
		"[{\"path\":\"/\xff\xfe\"}]", "{\"a\":\"caf\xc3\"}", "{\"k\xfe\":1}\n{\"b\":2}", `[{"a":"é"}]`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		b, err := Decode("env", strings.NewReader(body))
		// The fast path and the streaming decoder agree.
		sb, serr := decodeStream("env", strings.NewReader(body))
		if (err == nil) != (serr == nil) {
			t.Fatalf("fast path error %v, streaming decoder error %v", err, serr)
		}
		if err == nil && (sb.Format != b.Format || len(sb.Records) != len(b.Records) || sb.SeqNum != b.SeqNum || sb.AgentID != b.AgentID) {
			t.Fatalf("fast path %s/%d records, streaming %s/%d", b.Format, len(b.Records), sb.Format, len(sb.Records))
		}
		if err == nil {
			for i := range b.Records {
				if !bytes.Equal(b.Records[i], sb.Records[i]) {
					t.Fatalf("record %d: fast %q, streaming %q", i, b.Records[i], sb.Records[i])
				}
			}
		}
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v (%T) is not a *DecodeError", err, err)
			}
			return
		}
		if len(b.Records) == 0 {
			t.Fatal("accepted a batch without records")
		}
		for i, r := range b.Records {
			if len(r) == 0 || r[0] != '{' {
				t.Fatalf("record %d is not an object: %q", i, r)
			}
			if !json.Valid(r) || !utf8.Valid(r) {
				t.Fatalf("record %d is not valid JSON in UTF-8: %q", i, r)
			}
			// The allocation-free member scanner agrees with encoding/json.
			var want map[string]json.RawMessage
			if err := json.Unmarshal(r, &want); err != nil {
				t.Fatalf("record %d is not valid JSON: %v", i, err)
			}
			got := map[string]string{}
			if err := EachMember(r, func(k []byte, esc bool, v []byte) { got[UnescapeKey(k, esc)] = string(v) }); err != nil {
				t.Fatalf("EachMember on record %d %q: %v", i, r, err)
			}
			if len(got) != len(want) {
				t.Fatalf("EachMember found %d members, encoding/json %d in %q", len(got), len(want), r)
			}
			for k, v := range want {
				if got[k] != string(v) {
					t.Fatalf("member %q: %q vs %q", k, got[k], v)
				}
			}
		}
		back, err := Unmarshal(Marshal(b))
		if err != nil || len(back.Records) != len(b.Records) || back.SeqNum != b.SeqNum {
			t.Fatalf("codec round trip failed: %v", err)
		}
	})
}
