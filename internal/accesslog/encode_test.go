package accesslog

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestEncodeToMatchesMarshal(t *testing.T) {
	for _, b := range []*Batch{
		{EnvironmentID: "env", Format: FormatJSON, AgentID: "agent", Datestamp: "20261123", ProfileID: "1", SeqNum: 300,
			ReceivedUnixNano: 1_800_000_000_000_000_000, Records: []json.RawMessage{json.RawMessage(`{"a":1}`), json.RawMessage(`{"b":"` + strings.Repeat("x", 200) + `"}`)}},
		{EnvironmentID: "e", Format: FormatJSONLines, SeqNum: NoSeqNum, ReceivedUnixNano: -5, Records: []json.RawMessage{json.RawMessage(`{}`)}},
		{Format: FormatJSONArray, SeqNum: NoSeqNum, Records: []json.RawMessage{json.RawMessage(`{"big":"` + strings.Repeat("y", 70000) + `"}`)}},
	} {
		want := Marshal(b)
		var got bytes.Buffer
		n, err := EncodeTo(&got, b)
		if err != nil || n != int64(len(want)) || !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("EncodeTo wrote %d bytes (%v), Marshal %d; equal %v", n, err, len(want), bytes.Equal(got.Bytes(), want))
		}
		if EncodedSize(b) != len(want) {
			t.Fatalf("EncodedSize %d, Marshal %d", EncodedSize(b), len(want))
		}
		back, err := Unmarshal(got.Bytes())
		if err != nil || len(back.Records) != len(b.Records) {
			t.Fatalf("round trip: %v", err)
		}
	}
}
