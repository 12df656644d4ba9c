package accesslog

import (
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

func TestDecodeBatch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		format  Format
		agent   string
		seq     int64
		profile string
		records []string
	}{
		{
			name:   "json envelope",
			body:   ` {"account_number":"ACME","agent_id":"a1","datestamp":"20261123","platform":"delivery","profile_id":123,"seq_num":7,"logs":[{"uuid":"u1","status_code":200},{"uuid":"u2"}]}`,
			format: FormatJSON, agent: "a1", seq: 7, profile: "123",
			records: []string{`{"uuid":"u1","status_code":200}`, `{"uuid":"u2"}`},
		},
		{
			name:   "json envelope with logs first",
			body:   `{"logs":[{"a":1}],"seq_num":0,"agent_id":"x","datestamp":"20260101"}` + "\n",
			format: FormatJSON, agent: "x", seq: 0,
			records: []string{`{"a":1}`},
		},
		{
			name:   "json array",
			body:   "\n[ {\"uuid\":\"u1\"} , {\"uuid\":\"u2\",\"nested\":{\"logs\":[]}} ]\n",
			format: FormatJSONArray, seq: NoSeqNum,
			records: []string{`{"uuid":"u1"}`, `{"uuid":"u2","nested":{"logs":[]}}`},
		},
		{
			name:   "json lines",
			body:   "{\"uuid\":\"u1\",\"seq_num\":\"not-an-envelope\"}\n{\"uuid\":\"u2\"}\r\n\n{\"uuid\":\"u3\"}",
			format: FormatJSONLines, seq: NoSeqNum,
			records: []string{`{"uuid":"u1","seq_num":"not-an-envelope"}`, `{"uuid":"u2"}`, `{"uuid":"u3"}`},
		},
		{
			name:   "single json line",
			body:   `{"uuid":"only"}`,
			format: FormatJSONLines, seq: NoSeqNum,
			records: []string{`{"uuid":"only"}`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One byte at a time exercises every buffer boundary.
			b, err := Decode("env", iotest.OneByteReader(strings.NewReader(tc.body)))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			var recs []string
			for _, r := range b.Records {
				recs = append(recs, string(r))
			}
			if b.Format != tc.format || b.AgentID != tc.agent || b.SeqNum != tc.seq || b.ProfileID != tc.profile || b.EnvironmentID != "env" {
				t.Fatalf("got format %s agent %q seq %d profile %q env %q", b.Format, b.AgentID, b.SeqNum, b.ProfileID, b.EnvironmentID)
			}
			if !reflect.DeepEqual(recs, tc.records) {
				t.Fatalf("records %q, want %q", recs, tc.records)
			}
			// The spool codec round-trips it.
			back, err := Unmarshal(Marshal(b))
			if err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !reflect.DeepEqual(back, b) {
				t.Fatalf("codec round trip: %+v != %+v", back, b)
			}
		})
	}
}

func TestDecodeBatchErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		line       int
		msg        string
	}{
		{"empty", "  \n ", 0, "empty body"},
		{"not json", "hello", 1, "unexpected 'h'"},
		{"truncated array", `[{"a":1},{"b":`, 1, "unexpected end of input"},
		{"record not an object", `[{"a":1}, 42]`, 1, "record 1 is not a JSON object"},
		{"bad second line", "{\"a\":1}\n{\"b\":2}\n{\"c\":,}\n", 3, "malformed JSON"},
		{"garbage after array", `[{"a":1}] x`, 1, "malformed JSON"},
		{"empty array", `[]`, 0, "no records"},
		{"logs not array", `{"logs":{"a":1},"seq_num":1}`, 1, `"logs" must be an array`},
		{"log entry not object", `{"logs":[1],"seq_num":1}`, 1, "logs[0] is not a JSON object"},
		{"negative seq", `{"logs":[{"a":1}],"seq_num":-3}`, 1, `"seq_num" must be a non-negative integer`},
		{"bad datestamp", `{"logs":[{"a":1}],"datestamp":"2026-11-23"}`, 1, `"datestamp" must be YYYYMMDD`},
		{"two envelopes", `{"logs":[{"a":1}]}{"logs":[{"a":1}]}`, 1, "unexpected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode("env", strings.NewReader(tc.body))
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v (%T) is not a *DecodeError", err, err)
			}
			if !strings.Contains(de.Error(), tc.msg) {
				t.Fatalf("error %q does not mention %q", de.Error(), tc.msg)
			}
			if tc.line > 0 && de.Line != tc.line {
				t.Fatalf("error %q names line %d, want %d", de.Error(), de.Line, tc.line)
			}
		})
	}
}

// TestDecodeRejectsInvalidUTF8 checks both decode paths (DecodeBytes tries
// the fast path first; decodeStream is the streaming decoder alone) on the
// three shapes of bad UTF-8, in every format: the error names the offset of
// the first bad byte, and valid multi-byte text still passes.
func TestDecodeRejectsInvalidUTF8(t *testing.T) {
	shapes := []struct {
		name, record string
		bad          int // offset of the bad byte within record
	}{
		{"bad byte", "{\"path\":\"/\xff\xfe\"}", 10},
		{"cut sequence", "{\"path\":\"/caf\xc3\"}", 13},
		{"bad byte in a key", "{\"pa\xfeth\":\"/\"}", 4},
		{"surrogate encoded as UTF-8", "{\"p\":\"\xed\xa0\x80\"}", 6},
	}
	formats := []struct {
		format Format
		wrap   func(rec string) (body string, prefix int)
	}{
		{FormatJSONArray, func(r string) (string, int) { return `[{"ok":"é"},` + r + `]`, len(`[{"ok":"é"},`) }},
		{FormatJSONLines, func(r string) (string, int) { return "{\"ok\":\"é\"}\n" + r + "\n", len("{\"ok\":\"é\"}\n") }},
		{FormatJSONLines, func(r string) (string, int) { return r, 0 }},
		{FormatJSON, func(r string) (string, int) {
			p := `{"agent_id":"a","seq_num":1,"datestamp":"20261123","logs":[{"ok":"é"},`
			return p + r + `]}`, len(p)
		}},
	}
	for _, sh := range shapes {
		for _, f := range formats {
			body, prefix := f.wrap(sh.record)
			for path, decode := range map[string]func() (*Batch, error){
				"DecodeBytes":  func() (*Batch, error) { return DecodeBytes("env", []byte(body)) },
				"decodeStream": func() (*Batch, error) { return decodeStream("env", strings.NewReader(body)) },
			} {
				t.Run(sh.name+"/"+string(f.format)+"/"+path, func(t *testing.T) {
					_, err := decode()
					var de *DecodeError
					if !errors.As(err, &de) || !errors.Is(err, ErrInvalidUTF8) {
						t.Fatalf("error %v, want a *DecodeError wrapping ErrInvalidUTF8", err)
					}
					if want := int64(prefix + sh.bad); de.Offset != want {
						t.Errorf("offset %d, want %d (%q)", de.Offset, want, body[:want])
					}
					if de.Format != f.format {
						t.Errorf("format %s, want %s", de.Format, f.format)
					}
				})
			}
		}
	}
	// Escapes are ASCII and stay allowed, even for lone surrogates.
	if _, err := DecodeBytes("env", []byte(`[{"p":"\ud800 \u00e9 é"}]`)); err != nil {
		t.Fatalf("valid UTF-8 with escapes: %v", err)
	}
}

func TestSelectKeepsRecordIdentity(t *testing.T) {
	b := &Batch{EnvironmentID: "e", Format: FormatJSONArray, SeqNum: NoSeqNum,
		Records: []json.RawMessage{[]byte(`{"a":0}`), []byte(`{"a":1}`), []byte(`{"a":2}`), []byte(`{"a":3}`)}}
	hash := b.ContentHash()
	part := b.Select(3, 1)
	if len(part.Records) != 2 || string(part.Records[0]) != `{"a":3}` || part.RecordIndex(0) != 3 || part.RecordIndex(1) != 1 {
		t.Fatalf("Select(3, 1) = %q with indexes %v", part.Records, part.RecordIndexes)
	}
	one := part.Select(1)
	if string(one.Records[0]) != `{"a":1}` || one.RecordIndex(0) != 1 {
		t.Fatalf("Select of a Select: %q index %d", one.Records[0], one.RecordIndex(0))
	}
	if part.ContentHash() != hash || one.ContentHash() != hash {
		t.Fatalf("narrowed batches hash %s, %s; want the whole batch's %s", part.ContentHash(), one.ContentHash(), hash)
	}
	if b.RecordIndex(2) != 2 || b.RecordIndexes != nil || b.BatchHash != "" {
		t.Fatal("Select changed the original batch")
	}
}

func TestDecodeBatchPassesReaderErrors(t *testing.T) {
	boom := errors.New("limit reached")
	r := io.MultiReader(strings.NewReader(`[{"a":1},{"b"`), iotest.ErrReader(boom))
	_, err := Decode("env", r)
	if !errors.Is(err, boom) {
		t.Fatalf("error %v does not wrap the reader's error", err)
	}
	var de *DecodeError
	if errors.As(err, &de) {
		t.Fatalf("a reader error was reported as the client's JSON: %v", err)
	}
}

func TestUnmarshalBatchRejectsCorruptData(t *testing.T) {
	good := Marshal(&Batch{EnvironmentID: "e", Format: FormatJSONArray, SeqNum: NoSeqNum, Records: []json.RawMessage{[]byte(`{"a":1}`)}})
	for i := 0; i < len(good); i++ {
		if _, err := Unmarshal(good[:i]); err == nil {
			t.Fatalf("truncated to %d bytes: no error", i)
		}
	}
}
