package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/edgepipe/edgepipe/internal/preflight"
	kafkasink "github.com/edgepipe/edgepipe/internal/sinks/kafka"
)

// The Kafka checks live with the receiver, the one program with a Kafka
// sink: in internal/preflight they would link the sink, and with it the
// receiver's delivery and spool packages, into the exporter.

// checkKafka is the name of the Kafka brokers' check.
const checkKafka = "Kafka"

// kafkaCheck is what the Kafka checks need: the receiver's Kafka settings
// and the sink's Inspect.
type kafkaCheck struct {
	Brokers []string
	Topic   string
	// CreateTopic, Partitions: the sink creates a missing topic at start
	// (--kafka.create-topic, --kafka.partitions).
	CreateTopic bool
	Partitions  int
	// MaxMessageBytes is --kafka.max-message-bytes, MaxRecordBytes
	// --ingest.max-record-bytes (which must not exceed it).
	MaxMessageBytes, MaxRecordBytes int64
	// Inspect asks the brokers (kafkasink.Sink.Inspect).
	Inspect func(context.Context) (*kafkasink.TopicReport, error)

	report *kafkasink.TopicReport
}

// checks are "Kafka" (the brokers answer), "Kafka topic <topic>" and
// "Kafka message size", the last two from what the first learnt.
func (k *kafkaCheck) checks() []preflight.Check {
	topic := "Kafka topic " + k.Topic
	return []preflight.Check{
		{Name: checkKafka, Run: k.brokers},
		{Name: topic, Needs: []string{checkKafka}, Run: k.topic},
		{Name: "Kafka message size", Needs: []string{topic}, Run: k.messageSize},
	}
}

func (k *kafkaCheck) brokers(ctx context.Context) preflight.Result {
	r, err := k.Inspect(ctx)
	if err != nil {
		return preflight.Fail("%v; check --kafka.brokers (%s), --kafka.tls and its files, --kafka.sasl.mechanism and the Kafka credentials, and that this machine reaches the brokers",
			err, strings.Join(k.Brokers, ","))
	}
	k.report = r
	return preflight.Pass("%d broker(s) answer: %s", len(r.Brokers), strings.Join(r.Brokers, ", "))
}

func (k *kafkaCheck) topic(context.Context) preflight.Result {
	switch r := k.report; {
	case r.Exists:
		return preflight.Pass("exists, %d partitions", r.Partitions)
	case k.CreateTopic:
		return preflight.Pass("does not exist yet: the receiver creates it at start (--kafka.create-topic, %d partitions)", k.Partitions)
	}
	return preflight.Fail("does not exist, and --kafka.create-topic=false: create it (kafka-topics.sh --create --topic %s), or let the receiver create it with --kafka.create-topic", k.Topic)
}

func (k *kafkaCheck) messageSize(context.Context) preflight.Result {
	r := k.report
	if r.LimitErr != nil {
		return preflight.Fail("%v; the brokers must allow DescribeConfigs on the topic and the cluster to check --kafka.max-message-bytes", r.LimitErr)
	}
	which := "topic " + k.Topic
	if !r.Exists {
		which = "a topic created at start"
	}
	if k.MaxMessageBytes > r.MaxMessageBytes {
		lower := fmt.Sprintf("--kafka.max-message-bytes=%d", r.MaxMessageBytes)
		if k.MaxRecordBytes > r.MaxMessageBytes {
			lower += fmt.Sprintf(" and --ingest.max-record-bytes at most that (it is %d)", k.MaxRecordBytes)
		}
		raise := fmt.Sprintf("raise the topic's %s to %d (kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config %s=%d)",
			kafkasink.TopicMaxMessageBytes, k.MaxMessageBytes, k.Topic, kafkasink.TopicMaxMessageBytes, k.MaxMessageBytes)
		if !r.Exists {
			raise = fmt.Sprintf("create the topic with that limit first (kafka-topics.sh --create --topic %s --config %s=%d)",
				k.Topic, kafkasink.TopicMaxMessageBytes, k.MaxMessageBytes)
		}
		return preflight.Fail("--kafka.max-message-bytes is %d bytes, but %s takes record batches of at most %d bytes (%s): larger batches are refused (MESSAGE_TOO_LARGE), split again and again, and records too large alone are dead-lettered; "+
			"set %s, or %s", k.MaxMessageBytes, which, r.MaxMessageBytes, r.LimitFrom, lower, raise)
	}
	return preflight.Pass("%s takes record batches of up to %d bytes (%s), at least --kafka.max-message-bytes (%d)", which, r.MaxMessageBytes, r.LimitFrom, k.MaxMessageBytes)
}
