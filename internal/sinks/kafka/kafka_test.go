package kafka

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestDeliverOneMessagePerRecordWithHeadersAndKeys(t *testing.T) {
	broker := testenv.Kafka(t)
	topic := "access-logs-test"
	sink, err := New(Config{Brokers: broker.Brokers(), Topic: topic, Compression: "zstd", CreateTopic: true, Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var batches []*accesslog.Batch
	for a := 0; a < 3; a++ {
		b := &accesslog.Batch{EnvironmentID: "env", Format: accesslog.FormatJSON, AgentID: fmt.Sprintf("agent-%d", a),
			Datestamp: "20261123", SeqNum: int64(a), ProfileID: "9", ReceivedUnixNano: time.Now().UnixNano()}
		for i := 0; i < 10; i++ {
			b.Records = append(b.Records, json.RawMessage(fmt.Sprintf(`{"uuid":"%d-%d"}`, a, i)))
		}
		batches = append(batches, b)
	}
	batches = append(batches, &accesslog.Batch{EnvironmentID: "env", Format: accesslog.FormatJSONArray, SeqNum: accesslog.NoSeqNum,
		Records: []json.RawMessage{json.RawMessage(`{"uuid":"x"}`)}})
	if err := sink.Deliver(ctx, batches); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	recs := broker.WaitForRecords(t, topic, 31, 30*time.Second)
	if len(recs) != 31 {
		t.Fatalf("%d messages, want 31", len(recs))
	}
	partitionOfKey := map[string]int32{}
	seen := map[string]bool{}
	ids := map[string]bool{}
	for _, r := range recs {
		h := map[string]string{}
		for _, hd := range r.Headers {
			h[hd.Key] = string(hd.Value)
		}
		var v struct {
			UUID string `json:"uuid"`
		}
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("value %q is not the record JSON: %v", r.Value, err)
		}
		seen[v.UUID] = true
		if p, ok := partitionOfKey[string(r.Key)]; ok && p != r.Partition {
			t.Fatalf("key %s in partitions %d and %d", r.Key, p, r.Partition)
		}
		partitionOfKey[string(r.Key)] = r.Partition
		if h["environment_id"] != "env" {
			t.Fatalf("headers %v", h)
		}
		if h["format"] == "json" && (h["agent_id"] == "" || h["seq_num"] == "" || h["datestamp"] != "20261123" || h["profile_id"] != "9" || string(r.Key) != "env/"+h["agent_id"]) {
			t.Fatalf("json batch message: key %s headers %v", r.Key, h)
		}
		if h["format"] == "json_array" {
			if _, ok := h["seq_num"]; ok {
				t.Fatalf("json_array message carries a seq_num: %v", h)
			}
		}
		if ids[h["record_id"]] {
			t.Fatalf("record_id %q on two messages", h["record_id"])
		}
		ids[h["record_id"]] = true
		want := "env/9/" + h["agent_id"] + "/20261123/" + h["seq_num"] + "/" + h["record_index"]
		if h["format"] == "json_array" {
			want = "env/uuid:x"
		}
		if h["record_id"] != want {
			t.Fatalf("record_id %q, want %q", h["record_id"], want)
		}
	}
	if len(seen) != 31 || len(partitionOfKey) != 4 {
		t.Fatalf("%d distinct records, %d keys", len(seen), len(partitionOfKey))
	}
}

func TestDeliverFailsWhileBrokerIsDown(t *testing.T) {
	broker := testenv.Kafka(t)
	sink, err := New(Config{Brokers: broker.Brokers(), Topic: "down", CreateTopic: true, WriteTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	broker.Pause()
	b := &accesslog.Batch{EnvironmentID: "env", Format: accesslog.FormatJSONLines, SeqNum: accesslog.NoSeqNum, Records: []json.RawMessage{json.RawMessage(`{"a":1}`)}}
	if err := sink.Deliver(context.Background(), []*accesslog.Batch{b}); err == nil {
		t.Fatal("Deliver succeeded with the broker down")
	}
	broker.Resume()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := sink.Deliver(context.Background(), []*accesslog.Batch{b})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Deliver after Resume: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestRecordIDIsStableAndUnique(t *testing.T) {
	withID := &accesslog.Batch{EnvironmentID: "e", ProfileID: "7", Format: accesslog.FormatJSON, AgentID: "a", Datestamp: "20261123", SeqNum: 42,
		Records: []json.RawMessage{json.RawMessage(`{"uuid":"u1"}`), json.RawMessage(`{"uuid":"u1"}`)}}
	noID := &accesslog.Batch{EnvironmentID: "e", Format: accesslog.FormatJSONLines, SeqNum: accesslog.NoSeqNum,
		Records: []json.RawMessage{json.RawMessage(`{"uuid":"u\u0031"}`), json.RawMessage(`{"a":1}`), json.RawMessage(`{"a":1}`), json.RawMessage(`{"uuid":""}`)}}
	hash := noID.ContentHash()
	for _, tc := range []struct {
		b    *accesslog.Batch
		i    int
		want string
	}{
		{withID, 0, "e/7/a/20261123/42/0"},
		{withID, 1, "e/7/a/20261123/42/1"}, // same uuid, another record of the batch
		{withID.Select(1), 0, "e/7/a/20261123/42/1"},
		{noID, 0, "e/uuid:u1"},
		{noID, 1, "e/batch:" + hash + "/1"},
		{noID, 2, "e/batch:" + hash + "/2"},
		{noID, 3, "e/batch:" + hash + "/3"},
		{noID.Select(2), 0, "e/batch:" + hash + "/2"}, // a dead letter keeps its id
	} {
		if got := RecordID(tc.b, tc.i); got != tc.want {
			t.Errorf("RecordID(%s record %d) = %q, want %q", tc.b.Format, tc.i, got, tc.want)
		}
	}
	// The header is RecordID, for every record of a batch.
	msgs, _ := messages([]*accesslog.Batch{withID, noID}, nil)
	for i, m := range msgs {
		b, j := withID, i
		if i >= len(withID.Records) {
			b, j = noID, i-len(withID.Records)
		}
		var id string
		for _, h := range m.Headers {
			if h.Key == HeaderRecordID {
				id = string(h.Value)
			}
		}
		if id != RecordID(b, j) {
			t.Fatalf("message %d: record_id header %q, want %q", i, id, RecordID(b, j))
		}
	}
}

// TestLZ4BatchesReadByKcat: the sink's own LZ4 frames (64 KiB blocks, no
// content checksum, as the Java producer writes them) are read by
// librdkafka and franz-go.
func TestLZ4BatchesReadByKcat(t *testing.T) {
	broker := testenv.Kafka(t)
	topic := broker.NewTopic(t, 1)
	sink, err := New(Config{Brokers: broker.Brokers(), Topic: topic, Compression: "lz4"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	b := testBatch("env", 2000) // several 64 KiB blocks in one request
	for i := range b.Records {
		b.Records[i] = json.RawMessage(fmt.Sprintf(`{"uuid":"env-%d","pad":"%0200d"}`, i, i))
	}
	if err := sink.Deliver(context.Background(), []*accesslog.Batch{b}); err != nil {
		t.Fatal(err)
	}
	if n := len(broker.WaitForRecords(t, topic, 2000, 30*time.Second)); n != 2000 {
		t.Fatalf("franz-go read %d records", n)
	}
	msgs := broker.KcatConsume(t, topic)
	if len(msgs) != 2000 {
		t.Fatalf("kcat read %d messages, want 2000", len(msgs))
	}
	for i, m := range msgs {
		if m.Payload == nil || *m.Payload != string(b.Records[i]) {
			t.Fatalf("message %d: %v, want %s", i, m.Payload, b.Records[i])
		}
	}
}
