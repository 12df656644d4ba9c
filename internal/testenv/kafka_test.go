package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

func produce(t *testing.T, cl *kgo.Client, topic string, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rs []*kgo.Record
	for i := from; i < to; i++ {
		rs = append(rs, &kgo.Record{
			Topic:   topic,
			Key:     []byte("agent-" + strconv.Itoa(i%5)),
			Value:   []byte(fmt.Sprintf(`{"uuid":"u-%d"}`, i)),
			Headers: []kgo.RecordHeader{{Key: "seq", Value: []byte(strconv.Itoa(i))}, {Key: "env", Value: []byte("e1")}},
		})
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func TestKafkaProduceConsumeAndKcat(t *testing.T) {
	t.Parallel()
	k := Kafka(t)
	topic := k.NewTopic(t, 4)
	produce(t, k.Client(t), topic, 0, 200)

	recs := k.Records(t, topic)
	if len(recs) != 200 {
		t.Fatalf("Records: %d, want 200", len(recs))
	}
	seen := map[string]bool{}
	parts := map[int32]bool{}
	for _, r := range recs {
		seen[string(r.Value)] = true
		parts[r.Partition] = true
	}
	if len(seen) != 200 || len(parts) < 2 {
		t.Fatalf("Records: %d distinct values over %d partitions; want 200 over several", len(seen), len(parts))
	}

	msgs := k.KcatConsume(t, topic)
	if len(msgs) != 200 {
		t.Fatalf("kcat: %d messages, want 200", len(msgs))
	}
	for _, m := range msgs {
		if m.Payload == nil || !seen[*m.Payload] {
			t.Fatalf("kcat: unexpected payload %v", m.Payload)
		}
		seq, ok := m.Header("seq")
		if !ok || *m.Payload != fmt.Sprintf(`{"uuid":"u-%s"}`, seq) {
			t.Fatalf("kcat: header seq=%q (present %v) does not match payload %s", seq, ok, *m.Payload)
		}
		if env, _ := m.Header("env"); env != "e1" || m.Key == nil {
			t.Fatalf("kcat: env header %q, key %v", env, m.Key)
		}
	}
}

func TestKafkaAutoCreatedTopic(t *testing.T) {
	t.Parallel()
	k := Kafka(t)
	if got := k.Records(t, "does-not-exist"); len(got) != 0 {
		t.Fatalf("missing topic: %d records", len(got))
	}
	cl := k.Client(t, kgo.AllowAutoTopicCreation())
	produce(t, cl, "auto", 0, 30)
	if got := k.WaitForRecords(t, "auto", 30, 30*time.Second); len(got) != 30 {
		t.Fatalf("auto-created topic: %d records, want 30", len(got))
	}
}

// TestKafkaPauseKeepsAcknowledgedRecords shows that Pause looks like an
// outage to segmentio/kafka-go (the receiver's client) and that Resume
// brings back everything acknowledged before it.
func TestKafkaPauseKeepsAcknowledgedRecords(t *testing.T) {
	t.Parallel()
	k := Kafka(t)
	topic := k.NewTopic(t, 3)
	w := &kafkago.Writer{
		Addr:         kafkago.TCP(k.Addr()),
		Topic:        topic,
		RequiredAcks: kafkago.RequireAll,
		Balancer:     &kafkago.Hash{},
		BatchTimeout: 10 * time.Millisecond,
		MaxAttempts:  2,
		Compression:  kafkago.Zstd,
		Transport:    &kafkago.Transport{DialTimeout: time.Second},
	}
	defer w.Close()
	write := func(ctx context.Context, from, to int) error {
		var ms []kafkago.Message
		for i := from; i < to; i++ {
			ms = append(ms, kafkago.Message{
				Key: []byte(strconv.Itoa(i)), Value: []byte(strconv.Itoa(i)),
				Headers: []kafkago.Header{{Key: "seq", Value: []byte(strconv.Itoa(i))}},
			})
		}
		return w.WriteMessages(ctx, ms...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := write(ctx, 0, 100); err != nil {
		t.Fatalf("write before pause: %v", err)
	}

	k.Pause()
	if !k.Paused() {
		t.Fatal("not paused")
	}
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	err := write(short, 100, 110)
	cancelShort()
	if err == nil {
		t.Fatal("write succeeded while the broker was paused")
	}
	t.Logf("kafka-go while paused: %v", err)

	// Resume from another goroutine, as an outage test would.
	resumed := make(chan error, 1)
	go func() {
		time.Sleep(500 * time.Millisecond)
		resumed <- k.ResumeContext(ctx)
	}()
	if err := <-resumed; err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err = write(ctx, 100, 200); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("write after resume: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	recs := k.Records(t, topic)
	got := map[string]bool{}
	for _, r := range recs {
		got[string(r.Value)] = true
	}
	for i := 0; i < 200; i++ {
		if !got[strconv.Itoa(i)] {
			t.Fatalf("record %d missing after pause/resume (%d records)", i, len(recs))
		}
	}
	// librdkafka reads kafka-go's zstd batches with their headers.
	msgs := k.KcatConsume(t, topic)
	if len(msgs) != len(recs) {
		t.Fatalf("kcat: %d messages, franz-go: %d", len(msgs), len(recs))
	}
	for _, m := range msgs {
		if seq, _ := m.Header("seq"); m.Payload == nil || seq != *m.Payload {
			t.Fatalf("kcat: payload %v with header seq=%q", m.Payload, seq)
		}
	}
}

func TestKafkaBrokerConfigsLimitMessageSize(t *testing.T) {
	t.Parallel()
	k := Kafka(t, KafkaBrokerConfigs(map[string]string{"message.max.bytes": "100000"}))
	topic := k.NewTopic(t, 1)
	big := make([]byte, 200_000)
	for i := range big {
		big[i] = byte('a' + i*7919%26) // no compression here anyway
	}
	cl := k.Client(t, kgo.ProducerBatchCompression(kgo.NoCompression()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: big}).FirstErr(); !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("200 KB record with message.max.bytes=100000: %v, want MESSAGE_TOO_LARGE", err)
	}
	k.SetBrokerConfig(t, "message.max.bytes", "1048588")
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: big}).FirstErr(); err != nil {
		t.Fatalf("after raising message.max.bytes: %v", err)
	}
	// The raised limit holds across a restart of the broker.
	k.Pause()
	k.Resume()
	cl2 := k.Client(t, kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err := cl2.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: big}).FirstErr(); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	if n := len(k.Records(t, topic)); n != 2 {
		t.Fatalf("%d records, want 2", n)
	}
}

// TestKafkaClusterFaults checks each fault of KafkaBrokers as kafka-go (the
// receiver's client) sees it, and that kcat reads the cluster.
func TestKafkaClusterFaults(t *testing.T) {
	t.Parallel()
	k := KafkaCluster(t, 3)
	const topic = "faults"
	k.CreateTopic(t, topic, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Partition p led by node p, for a known layout.
	for p := range int32(3) {
		if err := k.MoveLeader(topic, p, p); err != nil {
			t.Fatal(err)
		}
		if got := k.Leader(topic, p); got != p {
			t.Fatalf("leader of %d is %d after the move", p, got)
		}
	}
	dial := func(node int32, p int) (*kafkago.Conn, error) {
		d := &kafkago.Dialer{Timeout: time.Second}
		c, err := d.DialContext(ctx, "tcp", k.Brokers()[node])
		if err != nil {
			return nil, err
		}
		c.Close()
		return d.DialPartition(ctx, "tcp", "", kafkago.Partition{Topic: topic, ID: p, Leader: kafkago.Broker{Host: "127.0.0.1", Port: mustPort(t, k.Brokers()[node]), ID: int(node)}})
	}
	write := func(node int32, p int, v string) error {
		c, err := dial(node, p)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		_, err = c.WriteMessages(kafkago.Message{Value: []byte(v)})
		return err
	}
	if err := write(0, 0, "a"); err != nil {
		t.Fatalf("write to the leader: %v", err)
	}
	if err := write(1, 0, "x"); !errors.Is(err, kafkago.NotLeaderForPartition) {
		t.Fatalf("write to a follower: %v, want NOT_LEADER_FOR_PARTITION", err)
	}

	// Down: refused at once, the others answer, Up on the same port.
	k.Down(1)
	start := time.Now()
	if err := write(1, 1, "b"); err == nil {
		t.Fatal("write to a broker that is down succeeded")
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("a write to a broker that is down took %s to fail, want a refusal", d)
	}
	ends, err := k.EndOffsets(ctx, topic, time.Second)
	if err != nil || ends[0] != 1 || len(ends) != 2 {
		t.Fatalf("end offsets while node 1 is down: %v %v, want partitions 0 and 2 only", ends, err)
	}
	if err := k.Up(1); err != nil {
		t.Fatal(err)
	}
	if err := write(1, 1, "b"); err != nil {
		t.Fatalf("write after Up: %v", err)
	}

	// Hang: the connection opens, nothing is answered; on Release the
	// abandoned write is applied.
	c, err := dial(2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadPartitions(topic); err != nil { // loads the API versions before the hang: the produce request is sent
		t.Fatal(err)
	}
	k.Hang(2)
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.WriteMessages(kafkago.Message{Value: []byte("c")}); err == nil || !isTimeout(err) {
		t.Fatalf("write to a hung broker: %v, want a timeout", err)
	}
	c.Close()
	if _, err := dial(2, 2); err != nil {
		t.Fatalf("dialing a hung broker: %v, want the connection accepted", err)
	}
	if err := write(2, 2, "never"); err == nil || !isTimeout(err) {
		t.Fatalf("write on a new connection to a hung broker: %v, want a timeout", err)
	}
	k.Release(2)
	waitEnd := func(p int32, want int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			ends, err := k.EndOffsets(ctx, topic, time.Second)
			if err == nil && ends[p] == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("partition %d: end offsets %v (%v), want %d", p, ends, err, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitEnd(2, 1)

	// REQUEST_TIMED_OUT after the append.
	hits := k.FailProduces(topic, kerr.RequestTimedOut, 1)
	if err := write(0, 0, "d"); !errors.Is(err, kafkago.RequestTimedOut) {
		t.Fatalf("write with a timed-out append: %v, want REQUEST_TIMED_OUT", err)
	}
	if hits() != 1 {
		t.Fatalf("fault answered %d requests", hits())
	}
	waitEnd(0, 2)

	msgs := k.KcatConsume(t, topic)
	var got []string
	for _, m := range msgs {
		got = append(got, fmt.Sprintf("%d:%s", m.Partition, *m.Payload))
	}
	slices.Sort(got)
	if want := []string{"0:a", "0:d", "1:b", "2:c"}; !slices.Equal(got, want) {
		t.Fatalf("kcat read %v, want %v", got, want)
	}
}

func mustPort(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
