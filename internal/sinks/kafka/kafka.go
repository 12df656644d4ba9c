// Package kafka is the receiver's Kafka sink: one message per access-log
// record, written with segmentio/kafka-go partition by partition and
// acknowledged by all in-sync replicas before the spool position moves (see
// producer.go for how a partition is written, and delivery.PartitionWorker
// for how partitions flow independently).
//
// Message layout: the value is the record's JSON object as delivered; the
// key is "<environment_id>/<agent_id>" (so an agent's records stay in one
// partition, in order, while agents spread over partitions); headers carry
// environment_id, profile_id, agent_id, datestamp, seq_num, record_index,
// format and record_id, a stable identity consumers deduplicate on (see
// RecordID). Batches without identity (json_array, json_lines) are keyed by
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
	"slices"
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
	// WriteTimeout bounds one produce request, from sending it to the
	// brokers' acknowledgement (default DefaultWriteTimeout). A request
	// without an answer by then is unconfirmed: its partition's leader is
	// probed until it answers, and the request is sent again (its records
	// may then be in the topic twice).
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

// Sink writes batches to Kafka, partition by partition (see producer.go).
// It is safe for concurrent use.
type Sink struct {
	cfg    Config
	codec  kafkago.CompressionCodec // nil: none
	dialer *kafkago.Dialer
	tr     *kafkago.Transport // topic creation
	sasl   *trackedMechanism  // nil without SASL
	log    *slog.Logger
	meta   *metadataCache

	topicMu sync.Mutex
	topicOK bool // topic checked or created

	mu         sync.Mutex
	parts      []*partitionConn
	partitions []int // 0 … n-1 for the balancer
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
	DefaultWriteTimeout      = 10 * time.Second
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
	s := &Sink{cfg: cfg, sasl: tracked, log: cfg.Logger, meta: newMetadataCache(cfg.Brokers)}
	switch comp {
	case 0:
	case kafkago.Lz4:
		s.codec = lz4Codec{}
	default:
		s.codec = comp.Codec()
	}
	s.dialer = &kafkago.Dialer{
		Timeout:  probeTimeout, // includes the TLS handshake and SASL exchange
		ClientID: clientID,
		TLS:      cfg.TLS,
		DialFunc: dialWire,
	}
	s.tr = &kafkago.Transport{DialTimeout: 10 * time.Second, ClientID: clientID, TLS: cfg.TLS}
	if tracked != nil {
		s.dialer.SASLMechanism = tracked
		s.tr.SASL = tracked
	}
	return s, nil
}

// clientID names the receiver to the brokers.
const clientID = "edgepipe-rtld-receiver"

// ensureTopic creates the topic once, ignoring "already exists".
func (s *Sink) ensureTopic(ctx context.Context) error {
	s.topicMu.Lock()
	defer s.topicMu.Unlock()
	if s.topicOK || !s.cfg.CreateTopic {
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
	s.topicOK = true
	return nil
}

// Partitions returns the topic's number of partitions, creating the topic
// first when the sink does (delivery.Partitioned). It asks the brokers
// again once the layout is older than a minute, so partitions an operator
// adds are used from then on.
func (s *Sink) Partitions(ctx context.Context) (int, error) {
	if err := s.ensureTopic(ctx); err != nil {
		return 0, err
	}
	if err := s.meta.refresh(ctx, s, metadataMaxAge); err != nil {
		return 0, err
	}
	return s.meta.count(), nil
}

// PartitionOf returns the partition of every record of b among n: the
// Java client's murmur2 hash of the message key (delivery.Partitioned).
func (s *Sink) PartitionOf(b *accesslog.Batch, n int) int {
	s.mu.Lock()
	for len(s.partitions) < n {
		s.partitions = append(s.partitions, len(s.partitions))
	}
	parts := s.partitions[:n]
	s.mu.Unlock()
	return kafkago.Murmur2Balancer{}.Balance(kafkago.Message{Key: batchKey(b)}, parts...)
}

// PreparePartition builds the messages of batches, all of partition p, and
// sets aside those too large for MaxMessageBytes; the returned delivery
// writes the others to p in order, in requests of at most MaxMessageBytes,
// and when called again after an error starts at the first request that
// was not confirmed (delivery.Partitioned).
func (s *Sink) PreparePartition(p int, batches []*accesslog.Batch) delivery.Prepared {
	return s.preparePartition(p, batches, nil)
}

func (s *Sink) preparePartition(p int, batches []*accesslog.Batch, index []int) *partitionWrite {
	msgs, refs := messages(batches, index)
	w := &partitionWrite{s: s, p: p, msgs: msgs, refs: refs, pending: make([]int, 0, len(msgs))}
	for i := range msgs {
		if size := messageBytes(&msgs[i]); size > s.cfg.MaxMessageBytes {
			w.refused.add(refs[i], rejectTooLarge, fmt.Errorf("message of about %d bytes exceeds --kafka.max-message-bytes (%d)", size, s.cfg.MaxMessageBytes))
			continue
		}
		w.pending = append(w.pending, i)
	}
	return w
}

// Probe returns nil once partition p's leader, as the brokers name it now,
// accepts a connection and answers (delivery.Partitioned).
func (s *Sink) Probe(ctx context.Context, p int) error { return s.probe(ctx, p) }

// partitionWrite is the delivery of one partition's messages.
type partitionWrite struct {
	s       *Sink
	p       int
	msgs    []kafkago.Message
	refs    []delivery.RecordRef // the record of each message
	pending []int                // messages to send, in order
	done    int                  // pending[:done] are confirmed or refused
	refused refusals             // refused for good so far
}

// Deliver sends the pending messages in requests of at most
// MaxMessageBytes, one at a time, each only after the one before it was
// confirmed. A request the brokers refuse for good is set aside and the
// next one sent; the refusals are returned once every other message is
// confirmed. Any other failure is returned at once, and the next call
// starts with the request that failed.
func (w *partitionWrite) Deliver(ctx context.Context) error {
	s := w.s
	if w.done < len(w.pending) {
		if err := s.ensureTopic(ctx); err != nil {
			return err
		}
	}
	pc := s.partition(w.p)
	limit := s.cfg.MaxMessageBytes - recordBatchOverhead
	for w.done < len(w.pending) {
		end, size := w.done, int64(0)
		for end < len(w.pending) {
			n := messageBytes(&w.msgs[w.pending[end]]) - recordBatchOverhead
			if end > w.done && size+n > limit {
				break
			}
			size += n
			end++
		}
		req := make([]kafkago.Message, 0, end-w.done)
		for _, i := range w.pending[w.done:end] {
			req = append(req, w.msgs[i])
		}
		err := s.produce(ctx, pc, req)
		if err != nil {
			c := classify(err)
			if !c.permanent {
				return err
			}
			for _, i := range w.pending[w.done:end] {
				w.refused.addClass(w.refs[i], c, err)
			}
		}
		w.done = end
	}
	return w.refused.err()
}

// Deliver writes one message per record of every batch and returns nil only
// when the brokers acknowledged all of them (acks=all). Records Kafka
// refuses for good are reported in a *delivery.RejectedError (see
// delivery.Sink) once every other record is acknowledged.
func (s *Sink) Deliver(ctx context.Context, batches []*accesslog.Batch) error {
	return s.Prepare(batches).Deliver(ctx)
}

// Prepare returns the delivery of batches to their partitions
// (delivery.Preparer); each call of its Deliver writes every partition not
// yet confirmed, the partitions in parallel, and sends again only what was
// not confirmed.
func (s *Sink) Prepare(batches []*accesslog.Batch) delivery.Prepared {
	return &spreadWrite{s: s, batches: batches}
}

// spreadWrite is a delivery of batches of any partitions.
type spreadWrite struct {
	s       *Sink
	batches []*accesslog.Batch
	writes  []*partitionWrite // one per partition with records, once the partitions are known
}

// Deliver implements delivery.Prepared.
func (d *spreadWrite) Deliver(ctx context.Context) error {
	if d.writes == nil {
		n, err := d.s.Partitions(ctx)
		if err != nil {
			return err
		}
		byPart := map[int][]int{}
		var order []int
		for i, b := range d.batches {
			p := d.s.PartitionOf(b, n)
			if _, ok := byPart[p]; !ok {
				order = append(order, p)
			}
			byPart[p] = append(byPart[p], i)
		}
		d.writes = make([]*partitionWrite, 0, len(order))
		for _, p := range order {
			idx := byPart[p]
			bs := make([]*accesslog.Batch, len(idx))
			for k, i := range idx {
				bs[k] = d.batches[i]
			}
			d.writes = append(d.writes, d.s.preparePartition(p, bs, idx))
		}
	}
	errs := make([]error, len(d.writes))
	var wg sync.WaitGroup
	for i, w := range d.writes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.Deliver(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
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

// Close closes the connections to the brokers.
func (s *Sink) Close() error {
	s.mu.Lock()
	parts := slices.Clone(s.parts)
	s.mu.Unlock()
	for _, pc := range parts {
		pc.mu.Lock()
		pc.close()
		pc.mu.Unlock()
	}
	s.tr.CloseIdleConnections()
	return nil
}
