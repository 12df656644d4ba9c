package kafka

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// clusterSink is a sink on a 3-broker cluster whose topic has 3 partitions,
// partition p led by node p.
func clusterSink(t *testing.T, cfg Config) (*testenv.KafkaBrokers, *Sink) {
	t.Helper()
	k := testenv.KafkaCluster(t, 3)
	cfg.Topic = "parts"
	k.CreateTopic(t, cfg.Topic, 3)
	for p := range int32(3) {
		if err := k.MoveLeader(cfg.Topic, p, p); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Brokers = k.Brokers()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return k, s
}

// endOffsets waits until the answering partitions' end offsets equal want.
func waitEnds(t *testing.T, k *testenv.KafkaBrokers, topic string, want map[int32]int64) {
	t.Helper()
	var got map[int32]int64
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		got, _ = k.EndOffsets(context.Background(), topic, time.Second)
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("end offsets %v, want %v", got, want)
}

// TestPartitionWritesAreIndependent: with partition 1's leader down, the
// other partitions take writes at once, a write to partition 1 fails as not
// written (the connection is refused), a probe fails until the broker is
// back, and nothing the failed write carried arrives later.
func TestPartitionWritesAreIndependent(t *testing.T) {
	k, s := clusterSink(t, Config{})
	ctx := context.Background()
	if n, err := s.Partitions(ctx); err != nil || n != 3 {
		t.Fatalf("Partitions = %d, %v", n, err)
	}
	k.Down(1)
	for _, p := range []int{0, 2} {
		if err := s.PreparePartition(p, []*accesslog.Batch{testBatch("env", 5)}).Deliver(ctx); err != nil {
			t.Fatalf("partition %d with node 1 down: %v", p, err)
		}
	}
	start := time.Now()
	err := s.PreparePartition(1, []*accesslog.Batch{testBatch("env", 5)}).Deliver(ctx)
	var u *delivery.UnconfirmedError
	if err == nil || errors.As(err, &u) {
		t.Fatalf("partition 1 with its leader down: %v, want a failure before sending", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the failure took %s", d)
	}
	if err := s.Probe(ctx, 1); err == nil {
		t.Fatal("probe of partition 1 succeeded with its leader down")
	}
	if err := k.Up(1); err != nil {
		t.Fatal(err)
	}
	if err := s.Probe(ctx, 1); err != nil {
		t.Fatalf("probe after the leader's return: %v", err)
	}
	time.Sleep(500 * time.Millisecond) // anything still on its way would land now
	waitEnds(t, k, "parts", map[int32]int64{0: 5, 1: 0, 2: 5})
}

// TestUnconfirmedWrites: a write with no answer (hung leader) and one
// answered REQUEST_TIMED_OUT after the append are unconfirmed, with their
// record counts; a write to a broker that lost the leadership is not, and
// the next one goes to the new leader.
func TestUnconfirmedWrites(t *testing.T) {
	k, s := clusterSink(t, Config{WriteTimeout: time.Second})
	ctx := context.Background()
	if _, err := s.Partitions(ctx); err != nil {
		t.Fatal(err)
	}
	deliver := func(p, n int) error {
		return s.PreparePartition(p, []*accesslog.Batch{testBatch(fmt.Sprintf("env%d", p), n)}).Deliver(ctx)
	}
	if err := deliver(0, 1); err != nil { // connected
		t.Fatal(err)
	}
	k.Hang(0)
	err := deliver(0, 4)
	var u *delivery.UnconfirmedError
	if !errors.As(err, &u) || u.Records != 4 {
		t.Fatalf("write to a hung leader: %v, want 4 unconfirmed records", err)
	}
	k.Release(0)
	waitEnds(t, k, "parts", map[int32]int64{0: 5, 1: 0, 2: 0}) // the hung broker applied it

	hits := k.FailProduces("parts", kerr.RequestTimedOut, 1)
	if err := deliver(2, 3); !errors.As(err, &u) || u.Records != 3 || !errors.Is(err, kafkago.RequestTimedOut) {
		t.Fatalf("REQUEST_TIMED_OUT after the append: %v, want 3 unconfirmed records", err)
	}
	if hits() != 1 {
		t.Fatalf("%d faulted requests", hits())
	}

	if err := deliver(1, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.MoveLeader("parts", 1, 2); err != nil {
		t.Fatal(err)
	}
	err = deliver(1, 2)
	if err == nil || errors.As(err, &u) || !errors.Is(err, kafkago.NotLeaderForPartition) {
		t.Fatalf("write to the former leader: %v, want NOT_LEADER_FOR_PARTITION, not unconfirmed", err)
	}
	if err := s.Probe(ctx, 1); err != nil {
		t.Fatalf("probe after the move: %v", err)
	}
	if err := deliver(1, 2); err != nil {
		t.Fatalf("write after the probe: %v", err)
	}
	waitEnds(t, k, "parts", map[int32]int64{0: 5, 1: 3, 2: 3})
}

// TestSpreadWriteResendsOnlyFailedPartitions: Sink.Deliver (dead-letter
// replay) writes every partition; after a partition failed, the next call
// writes only that partition again.
func TestSpreadWriteResendsOnlyFailedPartitions(t *testing.T) {
	k, s := clusterSink(t, Config{})
	ctx := context.Background()
	n, err := s.Partitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var batches []*accesslog.Batch
	want := map[int32]int64{}
	for i := 0; len(want) < 3; i++ {
		b := testBatch(fmt.Sprintf("env%d", i), 2)
		p := int32(s.PartitionOf(b, n))
		if want[p] < 2 {
			batches = append(batches, b)
			want[p] += 2
		}
	}
	k.Down(2)
	prepared := s.Prepare(batches)
	if err := prepared.Deliver(ctx); err == nil {
		t.Fatal("delivery with node 2 down succeeded")
	}
	if err := k.Up(2); err != nil {
		t.Fatal(err)
	}
	if err := prepared.Deliver(ctx); err != nil {
		t.Fatalf("delivery after the return: %v", err)
	}
	waitEnds(t, k, "parts", want)
}
