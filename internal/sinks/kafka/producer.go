package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
)

// The producer writes each partition over its own connection to the
// partition's leader (kafka-go's Conn), one produce request at a time, and
// waits for the answer before it sends anything else to that partition:
//
//   - a record is sent again only when the request that carried it was not
//     confirmed, and only that request's records;
//   - a partition whose leader is down or hung holds up no other partition;
//   - records stay in order within a partition through every retry, since
//     nothing newer is sent until the older request is confirmed;
//   - when a call returns, nothing of it is still being sent (kafka-go's
//     Writer keeps retrying abandoned batches in the background,
//     segmentio/kafka-go#1427).
//
// The leaders come from metadata the sink asks for itself, again as soon as
// a broker says it no longer leads a partition.

// Timeouts of the metadata requests and probes (a connection and one small
// request to a broker); a hung broker costs this much per attempt.
const (
	probeTimeout = 2 * time.Second
	// metadataMaxAge is how old the partition layout may be before
	// Partitions asks again (new partitions show up within it).
	metadataMaxAge = time.Minute
	// metadataMinAge spaces out the refreshes many partitions ask for at
	// once after a leader change.
	metadataMinAge = 250 * time.Millisecond
)

var (
	// errNoLeader: the metadata names no reachable leader for a partition.
	errNoLeader = errors.New("no leader known")
	// errMovedLeader: the broker the sink reached no longer leads the
	// partition.
	errMovedLeader = errors.New("the broker no longer leads the partition")
)

// partitionConn is the connection to one partition's leader. Its mutex
// makes writes to the partition one at a time.
type partitionConn struct {
	id     int
	mu     sync.Mutex
	conn   *kafkago.Conn
	wire   *wireConn
	leader int
}

// close drops the connection; the next write dials the leader again.
// Callers hold pc.mu.
func (pc *partitionConn) close() {
	if pc.conn != nil {
		_ = pc.conn.Close()
		pc.conn, pc.wire = nil, nil
	}
}

// partition returns the connection state of partition p.
func (s *Sink) partition(p int) *partitionConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.parts) <= p {
		s.parts = append(s.parts, &partitionConn{id: len(s.parts)})
	}
	return s.parts[p]
}

// connect dials the leader of pc's partition unless a connection is open,
// and asks it for the topic's metadata: that loads the API versions (so the
// reads of a produce request all come after the request was written) and
// shows that the broker answers and still leads the partition. Callers hold
// pc.mu.
func (s *Sink) connect(ctx context.Context, pc *partitionConn) error {
	if pc.conn != nil {
		return nil
	}
	part, ok := s.meta.partition(pc.id)
	if !ok || part.Leader.Host == "" {
		if err := s.meta.refresh(ctx, s, metadataMinAge); err != nil {
			return err
		}
		if part, ok = s.meta.partition(pc.id); !ok || part.Leader.Host == "" {
			return fmt.Errorf("partition %d: %w", pc.id, errNoLeader)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var wire wireHolder
	conn, err := s.dialer.DialPartition(withWire(ctx, &wire), "tcp", "", part)
	if err != nil {
		return fmt.Errorf("partition %d: connecting to its leader %s: %w", pc.id, brokerAddr(part.Leader), s.explain(err))
	}
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	parts, err := conn.ReadPartitions(s.cfg.Topic)
	_ = conn.SetDeadline(time.Time{})
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("partition %d: leader %s does not answer: %w", pc.id, brokerAddr(part.Leader), s.explain(err))
	}
	s.meta.update(parts)
	if now, ok := s.meta.partition(pc.id); !ok || now.Leader.ID != part.Leader.ID {
		_ = conn.Close()
		return fmt.Errorf("partition %d: %w", pc.id, errMovedLeader)
	}
	pc.conn, pc.wire, pc.leader = conn, wire.c.Load(), part.Leader.ID
	return nil
}

// produce writes msgs to pc's partition in one request and waits for the
// brokers' acknowledgement (acks=all). A failure is returned as is when the
// records were certainly not written (the connection or the request failed
// before the request was complete, or a broker refused it), and as a
// *delivery.UnconfirmedError when they may have been (no answer, or an
// answer saying the append happened without full confirmation).
func (s *Sink) produce(ctx context.Context, pc *partitionConn, msgs []kafkago.Message) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if err := s.connect(ctx, pc); err != nil {
		return err
	}
	deadline := time.Now().Add(s.cfg.WriteTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn := pc.conn
	_ = conn.SetDeadline(deadline)
	// Shutting down interrupts the request (its outcome is then unknown).
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	reads := pc.wire.reads()
	_, err := conn.WriteCompressedMessages(s.codec, msgs...)
	stop()
	if err == nil {
		_ = conn.SetDeadline(time.Time{})
		return nil
	}
	var ke kafkago.Error
	if errors.As(err, &ke) {
		switch {
		case ke == kafkago.RequestTimedOut || ke == kafkago.NotEnoughReplicasAfterAppend:
			// The broker appended the records and then gave up waiting
			// for the replicas: they are in the log, unconfirmed.
			return &delivery.UnconfirmedError{Records: len(msgs), Err: fmt.Errorf("partition %d: %w", pc.id, err)}
		case leaderMoved(ke):
			pc.close()
			s.meta.expire()
		}
		return fmt.Errorf("partition %d: %w", pc.id, err)
	}
	sent := pc.wire.reads() > reads
	pc.close()
	err = fmt.Errorf("partition %d: writing to leader %d: %w", pc.id, pc.leader, s.explain(err))
	if sent {
		// The response was being read: the whole request had been sent.
		return &delivery.UnconfirmedError{Records: len(msgs), Err: err}
	}
	return err
}

// probe returns nil once partition p's leader (as the brokers name it now)
// accepts a connection and answers a metadata request.
func (s *Sink) probe(ctx context.Context, p int) error {
	if err := s.meta.refresh(ctx, s, metadataMinAge); err != nil {
		return err
	}
	pc := s.partition(p)
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.conn != nil {
		ctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		deadline, _ := ctx.Deadline()
		_ = pc.conn.SetDeadline(deadline)
		_, err := pc.conn.ReadPartitions(s.cfg.Topic)
		_ = pc.conn.SetDeadline(time.Time{})
		if err == nil {
			return nil
		}
		pc.close()
	}
	return s.connect(ctx, pc)
}

// leaderMoved reports the errors of a broker that does not lead the
// partition (any more): the metadata is stale.
func leaderMoved(e kafkago.Error) bool {
	switch e {
	case kafkago.NotLeaderForPartition, kafkago.LeaderNotAvailable, kafkago.UnknownTopicOrPartition,
		kafkago.ReplicaNotAvailable, kafkago.BrokerNotAvailable, kafkago.FencedLeaderEpoch,
		kafkago.UnknownLeaderEpoch, kafkago.KafkaStorageError:
		return true
	}
	return false
}

func brokerAddr(b kafkago.Broker) string {
	return net.JoinHostPort(b.Host, strconv.Itoa(b.Port))
}

// metadataCache is the topic's partition layout as the brokers last told.
type metadataCache struct {
	refreshMu sync.Mutex // one refresh at a time

	mu         sync.Mutex
	partitions []kafkago.Partition // by ID
	brokers    []string            // addresses to ask, the last one that answered first
	fetched    time.Time
}

func newMetadataCache(bootstrap []string) *metadataCache {
	return &metadataCache{brokers: slices.Clone(bootstrap)}
}

// partition returns the last known layout of partition p.
func (m *metadataCache) partition(p int) (kafkago.Partition, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p < 0 || p >= len(m.partitions) {
		return kafkago.Partition{}, false
	}
	return m.partitions[p], true
}

// count returns the number of partitions last known.
func (m *metadataCache) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.partitions)
}

// expire makes the next refresh ask the brokers.
func (m *metadataCache) expire() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fetched = time.Time{}
}

// update takes a broker's answer: the layout of every partition, and the
// addresses of brokers not asked so far.
func (m *metadataCache) update(parts []kafkago.Partition) {
	if len(parts) == 0 {
		return
	}
	byID := make([]kafkago.Partition, len(parts))
	for _, p := range parts {
		if p.ID < 0 || p.ID >= len(parts) {
			return // not the layout of a whole topic
		}
		byID[p.ID] = p
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.partitions, m.fetched = byID, time.Now()
	for _, p := range parts {
		for _, b := range append([]kafkago.Broker{p.Leader}, p.Replicas...) {
			if a := brokerAddr(b); b.Host != "" && !slices.Contains(m.brokers, a) {
				m.brokers = append(m.brokers, a)
			}
		}
	}
}

// refresh asks the brokers for the layout unless it is younger than
// minAge; it tries each broker in turn (the one that answered last first),
// each within probeTimeout, and fails only when none answers.
func (m *metadataCache) refresh(ctx context.Context, s *Sink, minAge time.Duration) error {
	m.refreshMu.Lock()
	defer m.refreshMu.Unlock()
	m.mu.Lock()
	fresh := m.partitions != nil && time.Since(m.fetched) < minAge
	brokers := slices.Clone(m.brokers)
	m.mu.Unlock()
	if fresh {
		return nil
	}
	var errs []error
	for _, addr := range brokers {
		parts, err := s.readPartitions(ctx, addr)
		if err == nil {
			m.update(parts)
			m.mu.Lock()
			if i := slices.Index(m.brokers, addr); i > 0 {
				m.brokers = slices.Insert(slices.Delete(m.brokers, i, i+1), 0, addr)
			}
			m.mu.Unlock()
			return nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("kafka: no broker of %v answers a metadata request for %s: %w", brokers, s.cfg.Topic, errors.Join(errs...))
}

// readPartitions asks the broker at addr for the topic's partitions.
func (s *Sink) readPartitions(ctx context.Context, addr string) ([]kafkago.Partition, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	conn, err := s.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, s.explain(err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	parts, err := conn.ReadPartitions(s.cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", addr, s.explain(err))
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("%s: topic %s has no partitions", addr, s.cfg.Topic)
	}
	return parts, nil
}

// wireConn counts the reads of a connection to a broker. kafka-go reads a
// produce response only after the request was written whole, so a read
// during a failed produce means the broker may have appended the records.
type wireConn struct {
	net.Conn
	n atomic.Int64
}

func (w *wireConn) Read(p []byte) (int, error) {
	w.n.Add(1)
	return w.Conn.Read(p)
}

// reads returns the number of reads so far (0 for nil).
func (w *wireConn) reads() int64 {
	if w == nil {
		return 0
	}
	return w.n.Load()
}

// wireHolder receives the connection a dial made (see withWire).
type wireHolder struct{ c atomic.Pointer[wireConn] }

type wireKey struct{}

// withWire asks dialWire to report the connection it makes to h.
func withWire(ctx context.Context, h *wireHolder) context.Context {
	return context.WithValue(ctx, wireKey{}, h)
}

// dialWire is the dialer's DialFunc: a TCP connection wrapped in a
// wireConn, reported to the holder in ctx when there is one.
func dialWire(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	w := &wireConn{Conn: c}
	if h, ok := ctx.Value(wireKey{}).(*wireHolder); ok {
		h.c.Store(w)
	}
	return w, nil
}
