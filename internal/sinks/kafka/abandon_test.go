package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestFailedDeliveryWritesNothingLater: when Deliver returns an error, none
// of its records is still on its way. kafka-go's Writer kept retrying the
// batch of a WriteMessages that had returned (segmentio/kafka-go#1427):
// with the broker back a moment later, the records it had given up on
// arrived anyway, and the worker's retry wrote them a second time.
func TestFailedDeliveryWritesNothingLater(t *testing.T) {
	broker := testenv.Kafka(t)
	topic := broker.NewTopic(t, 1)
	sink, err := New(Config{Brokers: broker.Brokers(), Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	if err := sink.Deliver(context.Background(), []*accesslog.Batch{testBatch("warm", 1)}); err != nil {
		t.Fatal(err)
	}
	broker.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err = sink.Deliver(ctx, []*accesslog.Batch{testBatch("lost", 10)})
	cancel()
	if err == nil {
		t.Fatal("Deliver succeeded with the broker down")
	}
	broker.Resume()
	time.Sleep(3 * time.Second) // anything still on its way lands now
	if got := uuids(t, broker, topic); len(got) != 1 {
		t.Fatalf("after the failed Deliver returned, the topic got %d records of it (%v); want none", len(got)-1, got)
	}
}
