package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// bigRecord is a record of about size bytes that does not compress.
func bigRecord(seed uint64, size int) json.RawMessage {
	r := rand.New(rand.NewPCG(seed, 7))
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	pad := make([]byte, size-len(`{"uuid":"big","pad":""}`))
	for i := range pad {
		pad[i] = alphabet[r.IntN(len(alphabet))]
	}
	return json.RawMessage(fmt.Sprintf(`{"uuid":"big","pad":"%s"}`, pad))
}

func uuids(t *testing.T, broker *testenv.KafkaBroker, topic string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, r := range broker.Records(t, topic) {
		var v struct {
			UUID string `json:"uuid"`
		}
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("value is not a record: %v", err)
		}
		out[v.UUID]++
	}
	return out
}

func TestRecordOverMaxMessageBytesIsRejectedBeforeSending(t *testing.T) {
	// The broker would take it: the sink's own limit refuses it, so the
	// flag, not the broker, decides (and nothing is sent in vain).
	broker := testenv.Kafka(t)
	topic := broker.NewTopic(t, 1)
	sink, err := New(Config{Brokers: broker.Brokers(), Topic: topic, MaxMessageBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	b := testBatch("env", 20)
	b.Records[7] = bigRecord(1, 100_000)
	err = sink.Deliver(context.Background(), []*accesslog.Batch{b})
	var rej *delivery.RejectedError
	if !errors.As(err, &rej) || !rej.Each || rej.Reason != "message_too_large" || len(rej.Records) != 1 || rej.Records[0] != (delivery.RecordRef{Batch: 0, Record: 7}) {
		t.Fatalf("Deliver: %v (%+v), want record 7 rejected on its own as message_too_large", err, rej)
	}
	if got := uuids(t, broker, topic); len(got) != 19 || got["big"] != 0 {
		t.Fatalf("topic holds %d records (big: %d), want the 19 others", len(got), got["big"])
	}
}

func TestMessageBytesIsNeverBelowWhatTheBrokerCounts(t *testing.T) {
	// A message exactly at the limit by messageBytes is accepted by a
	// broker with that limit (no compression: worst case); one byte more
	// is refused before sending.
	const limit = 100_000
	broker := testenv.Kafka(t, testenv.KafkaBrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(limit)}))
	topic := broker.NewTopic(t, 1)
	sink, err := New(Config{Brokers: broker.Brokers(), Topic: topic, MaxMessageBytes: limit, Compression: "none"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	b := testBatch("env", 1)
	b.Records[0] = bigRecord(2, 99_000)
	msgs, _ := messages([]*accesslog.Batch{b}, nil)
	b.Records[0] = bigRecord(2, 99_000+int(limit-messageBytes(&msgs[0])))
	msgs, _ = messages([]*accesslog.Batch{b}, nil)
	if n := messageBytes(&msgs[0]); n != limit {
		t.Fatalf("messageBytes = %d, want %d", n, limit)
	}
	if err := sink.Deliver(context.Background(), []*accesslog.Batch{b}); err != nil {
		t.Fatalf("a message of exactly --kafka.max-message-bytes: %v", err)
	}
	b.Records[0] = bigRecord(2, len(b.Records[0])+1)
	var rej *delivery.RejectedError
	if err := sink.Deliver(context.Background(), []*accesslog.Batch{b}); !errors.As(err, &rej) || !rej.Each {
		t.Fatalf("one byte over: %v, want a rejection before sending", err)
	}
}

func TestBrokerLimitBelowTheFlagIsFoundBySplitting(t *testing.T) {
	// message.max.bytes=100000 on the broker, 1 MiB planned: the produce
	// request holding the 200 KB record is refused as a whole; the worker's
	// Deliverer splits it and sets aside only that record.
	broker := testenv.Kafka(t, testenv.KafkaBrokerConfigs(map[string]string{"message.max.bytes": "100000"}))
	topic := broker.NewTopic(t, 2)
	sink, err := New(Config{Brokers: broker.Brokers(), Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	var batches []*accesslog.Batch
	for i := 0; i < 4; i++ {
		batches = append(batches, testBatch(fmt.Sprintf("env%d", i), 50))
	}
	batches[2].Records[30] = bigRecord(3, 200_000)

	err = sink.Deliver(context.Background(), batches)
	var rej *delivery.RejectedError
	if !errors.As(err, &rej) || rej.Each || rej.Reason != "message_too_large" || len(rej.Records) < 1 {
		t.Fatalf("Deliver: %v, want an inexact message_too_large rejection", err)
	}
	d := &delivery.Deliverer{Sink: sink, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}
	rejected, err := d.Deliver(context.Background(), batches, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rejected) != 1 || rejected[0].Reason != "message_too_large" || rejected[0].Batch.EnvironmentID != "env2" || rejected[0].Batch.RecordIndex(0) != 30 {
		t.Fatalf("rejected %+v, want env2's record 30 alone", rejected)
	}
	if !errors.Is(rejected[0].Err, kafkago.MessageSizeTooLarge) {
		t.Errorf("rejection error %v is not the broker's MESSAGE_TOO_LARGE", rejected[0].Err)
	}
	got := uuids(t, broker, topic)
	if got["big"] != 0 || len(got) != 199 {
		t.Fatalf("topic holds %d distinct records (big: %d), want the 199 others", len(got), got["big"])
	}
	t.Logf("records written (with retries' duplicates): %d distinct", len(got))
}

func TestLargeRecordsWithALargeLimit(t *testing.T) {
	// A 1.47 MB record with --kafka.max-message-bytes=10MiB and a broker
	// that allows 10 MB: kafka-go's batch limit follows the flag.
	broker := testenv.Kafka(t, testenv.KafkaBrokerConfigs(map[string]string{"message.max.bytes": "10485760"}))
	topic := broker.NewTopic(t, 1)
	sink, err := New(Config{Brokers: broker.Brokers(), Topic: topic, MaxMessageBytes: 10 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	b := testBatch("env", 3)
	b.Records[1] = bigRecord(4, 1_470_000)
	if err := sink.Deliver(context.Background(), []*accesslog.Batch{b}); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	recs := broker.Records(t, topic)
	if len(recs) != 3 || len(recs[1].Value) != 1_470_000 {
		t.Fatalf("%d records", len(recs))
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err             error
		permanent, each bool
		reason          string
	}{
		{kafkago.MessageSizeTooLarge, true, false, "message_too_large"},
		{fmt.Errorf("write: %w", kafkago.MessageSizeTooLarge), true, false, "message_too_large"},
		{kafkago.RecordListTooLarge, true, false, "record_list_too_large"},
		{kafkago.InvalidRecord, true, false, "invalid_record"},
		{kafkago.TopicAuthorizationFailed, true, true, "topic_authorization_failed"},
		{kafkago.InvalidTopic, true, true, "invalid_topic"},
		{kafkago.UnsupportedCompressionType, true, true, "unsupported_compression_type"},
		{kafkago.NotLeaderForPartition, false, false, ""},
		{kafkago.LeaderNotAvailable, false, false, ""},
		{kafkago.RequestTimedOut, false, false, ""},
		{kafkago.NotEnoughReplicas, false, false, ""},
		{kafkago.SASLAuthenticationFailed, false, false, ""},
		{context.DeadlineExceeded, false, false, ""},
		{errors.New("dial tcp: connection refused"), false, false, ""},
	} {
		c := classify(tc.err)
		if c.permanent != tc.permanent || c.each != tc.each || c.reason != tc.reason {
			t.Errorf("classify(%v) = %+v, want permanent %v each %v reason %q", tc.err, c, tc.permanent, tc.each, tc.reason)
		}
	}
}
