package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestInspect asks a kfake broker, as `rtld-receiver check` does, for the
// topic and the record batch size it takes: the topic's own
// max.message.bytes when set, else the broker's message.max.bytes (also
// for a topic that does not exist yet, which Inspect must not create:
// kcat lists the topics afterwards).
func TestInspect(t *testing.T) {
	broker := testenv.Kafka(t, testenv.KafkaBrokerConfigs(map[string]string{BrokerMaxMessageBytes: "500000"}))
	broker.CreateTopic(t, "plain", 2)
	broker.CreateTopic(t, "small", 3)
	broker.SetTopicConfig(t, "small", TopicMaxMessageBytes, "100000")
	for _, tc := range []struct {
		topic      string
		exists     bool
		partitions int
		limit      int64
		from       string
	}{
		{"plain", true, 2, 500000, "the broker's message.max.bytes"},
		{"small", true, 3, 100000, "the topic's max.message.bytes"},
		{"missing", false, 0, 500000, "the broker's message.max.bytes"},
	} {
		t.Run(tc.topic, func(t *testing.T) {
			sink, err := New(Config{Brokers: broker.Brokers(), Topic: tc.topic, CreateTopic: true})
			if err != nil {
				t.Fatal(err)
			}
			defer sink.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r, err := sink.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if r.Exists != tc.exists || r.Partitions != tc.partitions || r.MaxMessageBytes != tc.limit || r.LimitFrom != tc.from || r.LimitErr != nil ||
				len(r.Brokers) != 1 || r.Brokers[0] != broker.Addr() {
				t.Errorf("report %+v, want exists %v, %d partitions, limit %d from %q, broker %s", r, tc.exists, tc.partitions, tc.limit, tc.from, broker.Addr())
			}
		})
	}
	if _, ok := testenv.KcatTopics(t, broker.Addr())["missing"]; ok {
		t.Error("Inspect created the missing topic")
	}

	down, err := New(Config{Brokers: []string{testenv.FreeAddr(t)}, Topic: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r, err := down.Inspect(ctx); err == nil {
		t.Errorf("no broker: report %+v, no error", r)
	}
}
