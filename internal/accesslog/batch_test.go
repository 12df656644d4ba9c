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
