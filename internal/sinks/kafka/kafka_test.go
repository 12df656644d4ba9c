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
