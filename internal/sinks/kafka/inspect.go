package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// Config names of the record batch size limit: the topic's, and the
// brokers' default for topics that do not set one.
const (
	TopicMaxMessageBytes  = "max.message.bytes"
	BrokerMaxMessageBytes = "message.max.bytes"
)

// configSourceTopic is DescribeConfigs' DYNAMIC_TOPIC_CONFIG: a value set
// on the topic itself.
const configSourceTopic = 1

// TopicReport is what Inspect found on the brokers.
type TopicReport struct {
	// Brokers are the cluster's brokers (host:port) as its metadata lists
	// them.
	Brokers []string
	// Exists reports whether the topic exists, with how many partitions.
	Exists     bool
	Partitions int
	// MaxMessageBytes is the largest record batch the topic accepts (a
	// topic created by the sink: the brokers' default), and LimitFrom the
	// setting it comes from: the topic's max.message.bytes when set on the
	// topic, else the broker's message.max.bytes. LimitErr says why it is
	// unknown (MaxMessageBytes is then 0).
	MaxMessageBytes int64
	LimitFrom       string
	LimitErr        error
}

// Inspect asks the brokers, over the sink's connection settings (TLS,
// SASL) and with Metadata and DescribeConfigs requests only, whether the
// topic exists and which record batch size it accepts. It creates and
// changes nothing (its metadata request does not let the brokers create
// the topic). An error means the brokers could not be asked or refused
// the metadata.
func (s *Sink) Inspect(ctx context.Context) (*TopicReport, error) {
	c := &kafkago.Client{Addr: kafkago.TCP(s.cfg.Brokers...), Transport: s.tr, Timeout: 10 * time.Second}
	md, err := c.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{s.cfg.Topic}})
	if err != nil {
		return nil, fmt.Errorf("kafka: connecting to %v: %w", s.cfg.Brokers, s.explain(err))
	}
	r := &TopicReport{}
	for _, b := range md.Brokers {
		r.Brokers = append(r.Brokers, net.JoinHostPort(b.Host, strconv.Itoa(b.Port)))
	}
	for _, t := range md.Topics {
		if t.Name != s.cfg.Topic {
			continue
		}
		switch {
		case t.Error == nil:
			r.Exists, r.Partitions = true, len(t.Partitions)
		case !errors.Is(t.Error, kafkago.UnknownTopicOrPartition):
			return nil, fmt.Errorf("kafka: topic %s: %w", s.cfg.Topic, t.Error)
		}
	}
	broker := md.Controller
	if broker.Host == "" && len(md.Brokers) > 0 {
		broker = md.Brokers[0]
	}
	r.MaxMessageBytes, r.LimitFrom, r.LimitErr = s.messageLimit(ctx, c, strconv.Itoa(broker.ID), r.Exists)
	return r, nil
}

// messageLimit describes the broker's message.max.bytes and, when the
// topic exists, its max.message.bytes, and returns the one that applies to
// the topic. A broker answers a topic's max.message.bytes with its
// effective value, whatever sets it; the broker's value is asked too, for
// a topic that does not exist yet and for brokers that answer a topic
// without an override of its own with the built-in default.
func (s *Sink) messageLimit(ctx context.Context, c *kafkago.Client, brokerID string, topic bool) (int64, string, error) {
	req := &kafkago.DescribeConfigsRequest{Resources: []kafkago.DescribeConfigRequestResource{
		{ResourceType: kafkago.ResourceTypeBroker, ResourceName: brokerID, ConfigNames: []string{BrokerMaxMessageBytes}},
	}}
	if topic {
		req.Resources = append(req.Resources, kafkago.DescribeConfigRequestResource{
			ResourceType: kafkago.ResourceTypeTopic, ResourceName: s.cfg.Topic, ConfigNames: []string{TopicMaxMessageBytes}})
	}
	resp, err := c.DescribeConfigs(ctx, req)
	if err != nil {
		return 0, "", fmt.Errorf("kafka: describing the configs of topic %s and broker %s: %w", s.cfg.Topic, brokerID, s.explain(err))
	}
	var brokerLimit, topicLimit int64
	var topicOwn bool
	for _, res := range resp.Resources {
		if res.Error != nil {
			return 0, "", fmt.Errorf("kafka: describing the configs of %s: %w", res.ResourceName, res.Error)
		}
		for _, e := range res.ConfigEntries {
			n, err := strconv.ParseInt(e.ConfigValue, 10, 64)
			if err != nil {
				continue
			}
			switch {
			case int8(kafkago.ResourceTypeBroker) == res.ResourceType && e.ConfigName == BrokerMaxMessageBytes:
				brokerLimit = n
			case e.ConfigName == TopicMaxMessageBytes:
				topicLimit, topicOwn = n, e.ConfigSource == configSourceTopic
			}
		}
	}
	switch {
	case topicLimit > 0 && (topicOwn || brokerLimit == 0):
		return topicLimit, "the topic's " + TopicMaxMessageBytes, nil
	case brokerLimit > 0:
		return brokerLimit, "the broker's " + BrokerMaxMessageBytes, nil
	}
	return 0, "", fmt.Errorf("kafka: the brokers did not describe %s or %s", TopicMaxMessageBytes, BrokerMaxMessageBytes)
}
