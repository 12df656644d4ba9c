// Package kafka is the receiver's Kafka sink: one message per access-log
// record, written with segmentio/kafka-go and acknowledged by all in-sync
// replicas before the spool position moves.
//
// Message layout: the value is the record's JSON object as delivered; the
// key is "<environment_id>/<agent_id>" (so an agent's records stay in one
// partition, in order, while agents spread over partitions); headers carry
// environment_id, profile_id, agent_id, datestamp, seq_num, record_index and
// format. Batches without identity (json_array, json_lines) are keyed by
// "<environment_id>/<batch content hash>" and carry no seq_num header.
package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
)

// Config configures the sink.
type Config struct {
	// Brokers are the bootstrap brokers (host:port).
	Brokers []string
	// Topic receives the records (default DefaultTopic).
	Topic string
	// Compression is none, gzip, snappy, lz4 or zstd (default
	// DefaultCompression).
	Compression string
	// CreateTopic creates the topic at first use when it does not exist,
	// with Partitions and ReplicationFactor (defaults DefaultPartitions and
	// DefaultReplicationFactor; -1: the broker's default).
	CreateTopic       bool
	Partitions        int
	ReplicationFactor int
	// MaxMessageBytes is the largest record batch the brokers accept (the
	// broker's message.max.bytes or the topic's max.message.bytes; default
	// 1 MiB, the broker default). The writer's batches stay under it, and a
	// record whose message alone would exceed it is rejected for good
	// (dead-lettered) before it is sent. A smaller limit on the broker is
	// found by its MESSAGE_TOO_LARGE answers: the worker splits such
	// deliveries and dead-letters only the records too large by themselves.
	MaxMessageBytes int64
	// WriteTimeout bounds one delivery (default DefaultWriteTimeout); a
	// timed-out delivery is retried by the worker.
	WriteTimeout time.Duration
	// TLS, when set, encrypts every connection to the brokers (see
	// TLSFiles.Config).
	TLS *tls.Config
	// SASL, when set, authenticates every connection (see SASLMechanism).
	// Producing and topic creation use the same connection settings.
	SASL sasl.Mechanism
	// Logger receives topic creation notes.
	Logger *slog.Logger
}

// Sink writes batches to Kafka. It is safe for concurrent use.
type Sink struct {
	cfg    Config
	tr     *kafkago.Transport // shared by the writer and topic creation
	sasl   *trackedMechanism  // nil without SASL
	w      *kafkago.Writer
	log    *slog.Logger
	mu     sync.Mutex
	topicK bool // topic checked or created
}

// ParseCompression maps a flag value to a kafka-go codec.
func ParseCompression(s string) (kafkago.Compression, error) {
	switch strings.ToLower(s) {
	case "", "lz4":
		return kafkago.Lz4, nil
	case "none":
		return 0, nil
	case "gzip":
		return kafkago.Gzip, nil
	case "snappy":
		return kafkago.Snappy, nil
	case "zstd":
		return kafkago.Zstd, nil
	}
	return 0, fmt.Errorf("unknown Kafka compression %q (none, gzip, snappy, lz4, zstd)", s)
}

// Defaults of Config.
const (
	// DefaultTopic is DESIGN.md's topic.
	DefaultTopic       = "cdn-access-logs"
	DefaultCompression = "lz4"
	// DefaultPartitions and DefaultReplicationFactor shape a topic the sink
	// creates; -1 is the broker's default.
	DefaultPartitions        = 6
	DefaultReplicationFactor = -1
	DefaultWriteTimeout      = 30 * time.Second
)

// withDefaults returns c with every unset field set to its default.
func (c Config) withDefaults() Config {
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.Compression == "" {
		c.Compression = DefaultCompression
	}
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = DefaultReplicationFactor
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// validate reports every setting of c (with defaults applied) that cannot
// work.
func (c Config) validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("no brokers"))
	}
	if _, err := ParseCompression(c.Compression); err != nil {
		errs = append(errs, err)
	}
	if c.Partitions < 1 && c.Partitions != -1 {
		errs = append(errs, fmt.Errorf("%d partitions: want a positive number or -1 (the broker's default)", c.Partitions))
	}
	if c.ReplicationFactor < 1 && c.ReplicationFactor != -1 {
		errs = append(errs, fmt.Errorf("replication factor %d: want a positive number or -1 (the broker's default)", c.ReplicationFactor))
	}
	if c.MaxMessageBytes <= recordBatchOverhead+1024 {
		errs = append(errs, fmt.Errorf("a max message size of %d bytes leaves no room for records", c.MaxMessageBytes))
	}
	if c.WriteTimeout < 0 {
		errs = append(errs, fmt.Errorf("write timeout %s: must be positive", c.WriteTimeout))
	}
	return errors.Join(errs...)
}

// New returns a sink. It does not connect until the first delivery.
func New(cfg Config) (*Sink, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("kafka sink: invalid configuration: %w", err)
	}
	comp, err := ParseCompression(cfg.Compression)
	if err != nil {
		return nil, err
	}
	var tracked *trackedMechanism
	if cfg.SASL != nil {
		tracked = &trackedMechanism{Mechanism: cfg.SASL}
	}
	tr := &kafkago.Transport{
		DialTimeout: 10 * time.Second, // includes the TLS handshake and SASL exchange
		ClientID:    "edgepipe-rtld-receiver",
		TLS:         cfg.TLS,
	}
	if tracked != nil {
		tr.SASL = tracked
	}
	w := &kafkago.Writer{
		Addr:                   kafkago.TCP(cfg.Brokers...),
		Transport:              tr,
		Topic:                  cfg.Topic,
		Balancer:               kafkago.Murmur2Balancer{}, // same partitioning as the Java client
		RequiredAcks:           kafkago.RequireAll,
		Compression:            comp,
		BatchSize:              10_000,
		BatchBytes:             cfg.MaxMessageBytes - recordBatchOverhead,
		BatchTimeout:           2 * time.Millisecond,
		MaxAttempts:            3,
		WriteBackoffMin:        100 * time.Millisecond,
		WriteBackoffMax:        time.Second,
		ReadTimeout:            cfg.WriteTimeout,
		WriteTimeout:           cfg.WriteTimeout,
		AllowAutoTopicCreation: cfg.CreateTopic,
	}
	return &Sink{cfg: cfg, tr: tr, sasl: tracked, w: w, log: cfg.Logger}, nil
}

// ensureTopic creates the topic once, ignoring "already exists".
func (s *Sink) ensureTopic(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.topicK || !s.cfg.CreateTopic {
		return nil
	}
	parts, rf := s.cfg.Partitions, s.cfg.ReplicationFactor
	c := &kafkago.Client{Addr: kafkago.TCP(s.cfg.Brokers...), Transport: s.tr, Timeout: 10 * time.Second}
	// Metadata first: when the connection itself fails (TLS, SASL), it
	// returns the cause, where CreateTopics only says "broker not available".
	if _, err := c.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{s.cfg.Topic}}); err != nil {
		return fmt.Errorf("kafka: connecting to %v: %w", s.cfg.Brokers, s.explain(err))
	}
	resp, err := c.CreateTopics(ctx, &kafkago.CreateTopicsRequest{
		Topics: []kafkago.TopicConfig{{Topic: s.cfg.Topic, NumPartitions: parts, ReplicationFactor: rf}},
	})
	if err != nil {
		return fmt.Errorf("creating Kafka topic %s: %w", s.cfg.Topic, s.explain(err))
	}
	if terr := resp.Errors[s.cfg.Topic]; terr != nil && !errors.Is(terr, kafkago.TopicAlreadyExists) {
		// Not fatal: the topic may be managed elsewhere; writing tells.
		s.log.Warn("kafka sink: cannot create topic; it must exist", "topic", s.cfg.Topic, "err", terr)
	} else if terr == nil {
		s.log.Info("kafka sink: created topic", "topic", s.cfg.Topic, "partitions", parts)
	}
	s.topicK = true
	return nil
}

// Deliver writes one message per record of every batch and returns nil only
// when the brokers acknowledged all of them (acks=all). On error some
// messages may have been written: a retry writes only the others, and a
// restart writes them all again, so Kafka is at-least-once. Records Kafka
// refuses for good are reported in a *delivery.RejectedError (see
// delivery.Sink) once every other record is acknowledged.
func (s *Sink) Deliver(ctx context.Context, batches []*accesslog.Batch) error {
	return s.Prepare(batches).Deliver(ctx)
}

// Prepare builds the messages of the batches (delivery.Preparer: the worker
// builds the next group while the brokers acknowledge the current one) and
// sets aside those too large for MaxMessageBytes; the returned delivery
// writes the others, as often as it is called.
func (s *Sink) Prepare(batches []*accesslog.Batch) delivery.Prepared {
	msgs, refs := messages(batches)
	p := &preparedWrite{s: s, msgs: msgs, refs: refs, pending: make([]int, 0, len(msgs))}
	for i := range msgs {
		if size := messageBytes(&msgs[i]); size > s.cfg.MaxMessageBytes {
			p.tooLarge = append(p.tooLarge, i)
			continue
		}
		p.pending = append(p.pending, i)
	}
	return p
}

// preparedWrite is one delivery's messages.
type preparedWrite struct {
	s        *Sink
	msgs     []kafkago.Message
	refs     []delivery.RecordRef // the record of each message
	pending  []int                // messages not acknowledged yet
	tooLarge []int                // messages over MaxMessageBytes, never sent
}

// Deliver writes the pending messages; see Sink.Deliver.
func (p *preparedWrite) Deliver(ctx context.Context) error {
	s := p.s
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
	defer cancel()
	if len(p.pending) > 0 {
		if err := s.ensureTopic(ctx); err != nil {
			return err
		}
	}
	var refused refusals
	for _, i := range p.tooLarge {
		refused.add(p.refs[i], rejectTooLarge, fmt.Errorf("message of about %d bytes exceeds --kafka.max-message-bytes (%d)", messageBytes(&p.msgs[i]), s.cfg.MaxMessageBytes))
	}
	for len(p.pending) > 0 {
		batch := make([]kafkago.Message, len(p.pending))
		for k, i := range p.pending {
			batch[k] = p.msgs[i]
		}
		err := s.w.WriteMessages(ctx, batch...)
		if err == nil {
			p.pending = p.pending[:0]
			break
		}
		var mtl kafkago.MessageTooLargeError
		if errors.As(err, &mtl) {
			// kafka-go's own check refused one message and wrote nothing
			// (messageBytes should have caught it first): refuse that one,
			// write the rest.
			k := indexOfMessage(batch, mtl.Message)
			if k < 0 {
				return fmt.Errorf("kafka: writing %d messages: %w", len(batch), err)
			}
			refused.add(p.refs[p.pending[k]], rejectTooLarge, err)
			p.tooLarge = append(p.tooLarge, p.pending[k]) // reported again if this call fails
			p.pending = append(p.pending[:k], p.pending[k+1:]...)
			continue
		}
		var we kafkago.WriteErrors
		if !errors.As(err, &we) || len(we) != len(batch) {
			// The whole write failed (metadata, connection).
			c := classify(err)
			if !c.permanent {
				return fmt.Errorf("kafka: writing %d messages: %w", len(batch), s.explain(err))
			}
			for _, i := range p.pending {
				refused.addClass(p.refs[i], c, err)
			}
			p.pending = p.pending[:0]
			break
		}
		// Per message: acknowledged, refused for good, or worth retrying.
		var failed []int // messages not acknowledged
		var retryErr error
		var now refusals
		for k, e := range we {
			if e == nil {
				continue
			}
			failed = append(failed, p.pending[k])
			if c := classify(e); c.permanent {
				now.addClass(p.refs[p.pending[k]], c, e)
			} else if retryErr == nil {
				retryErr = e
			}
		}
		p.pending = failed
		if retryErr != nil {
			// A rejection is reported only once everything else is
			// acknowledged: retry every failed message (those refused
			// for good are refused again).
			return fmt.Errorf("kafka: %d of %d messages not acknowledged: %w", len(failed), len(batch), s.explain(retryErr))
		}
		refused.merge(now)
		p.pending = p.pending[:0]
	}
	return refused.err()
}

// explain adds what to check to errors whose cause is the connection's
// security settings; the credentials themselves are never part of an error.
func (s *Sink) explain(err error) error {
	switch {
	case errors.Is(err, kafkago.SASLAuthenticationFailed):
		return fmt.Errorf("SASL authentication failed, check EDGEPIPE_KAFKA_USERNAME / EDGEPIPE_KAFKA_PASSWORD and --kafka.sasl.mechanism: %w", err)
	case errors.Is(err, kafkago.UnsupportedSASLMechanism), errors.Is(err, kafkago.IllegalSASLState):
		return fmt.Errorf("the brokers refuse this SASL mechanism, check --kafka.sasl.mechanism: %w", err)
	case (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) && s.sasl.unfinished():
		return fmt.Errorf("SASL authentication failed (the broker closed the connection during the %s exchange), check EDGEPIPE_KAFKA_USERNAME / EDGEPIPE_KAFKA_PASSWORD and --kafka.sasl.mechanism: %w", s.sasl.Name(), err)
	}
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		return fmt.Errorf("broker certificate not trusted, check --kafka.tls.ca-file: %w", err)
	}
	return err
}

// messages turns batches into Kafka messages, and names the record of each.
func messages(batches []*accesslog.Batch) ([]kafkago.Message, []delivery.RecordRef) {
	n := 0
	for _, b := range batches {
		n += len(b.Records)
	}
	msgs := make([]kafkago.Message, 0, n)
	refs := make([]delivery.RecordRef, 0, n)
	for bi, b := range batches {
		var key []byte
		if b.AgentID != "" {
			key = []byte(b.EnvironmentID + "/" + b.AgentID)
		} else {
			key = []byte(b.EnvironmentID + "/" + b.ContentHash())
		}
		base := []kafkago.Header{
			{Key: "environment_id", Value: []byte(b.EnvironmentID)},
			{Key: "format", Value: []byte(b.Format)},
		}
		if b.ProfileID != "" {
			base = append(base, kafkago.Header{Key: "profile_id", Value: []byte(b.ProfileID)})
		}
		if b.AgentID != "" {
			base = append(base, kafkago.Header{Key: "agent_id", Value: []byte(b.AgentID)})
		}
		if b.Datestamp != "" {
			base = append(base, kafkago.Header{Key: "datestamp", Value: []byte(b.Datestamp)})
		}
		if b.SeqNum >= 0 {
			base = append(base, kafkago.Header{Key: "seq_num", Value: []byte(strconv.FormatInt(b.SeqNum, 10))})
		}
		t := time.Unix(0, b.ReceivedUnixNano)
		// One allocation per batch for every record's headers and
		// record_index digits, not two per record.
		per := len(base) + 1
		headers := make([]kafkago.Header, per*len(b.Records))
		digits := make([]byte, 0, len(b.Records)*(len(strconv.Itoa(b.RecordIndex(len(b.Records)-1)+1))))
		for i, r := range b.Records {
			h := headers[i*per : (i+1)*per : (i+1)*per]
			copy(h, base)
			start := len(digits)
			digits = strconv.AppendInt(digits, int64(b.RecordIndex(i)), 10)
			h[per-1] = kafkago.Header{Key: "record_index", Value: digits[start:len(digits):len(digits)]}
			msgs = append(msgs, kafkago.Message{Key: key, Value: r, Headers: h, Time: t})
			refs = append(refs, delivery.RecordRef{Batch: bi, Record: i})
		}
	}
	return msgs, refs
}

// Ping checks that a broker answers (for readiness).
func (s *Sink) Ping(ctx context.Context) error {
	var d net.Dialer
	for _, b := range s.cfg.Brokers {
		c, err := d.DialContext(ctx, "tcp", b)
		if err == nil {
			c.Close()
			return nil
		}
	}
	return fmt.Errorf("no Kafka broker of %v answers", s.cfg.Brokers)
}

// Close flushes and closes the writer.
func (s *Sink) Close() error {
	err := s.w.Close()
	s.tr.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("closing Kafka writer: %w", err)
	}
	return nil
}
