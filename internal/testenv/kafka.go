package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// KafkaDefaultPartitions is the partition count of topics the broker creates
// automatically (a producer's metadata request for an unknown topic creates it).
const KafkaDefaultPartitions = 3

// KafkaBroker is a single-node Kafka broker (kfake, from franz-go) listening
// on a free loopback port, with its log persisted in t.TempDir(). Topics are
// created automatically with KafkaDefaultPartitions partitions, or explicitly
// with CreateTopic.
//
// Outages: Pause shuts the broker down the way a stopped Kafka node looks to
// a client (open connections are closed, new ones are refused) after saving
// everything it acknowledged to its data directory; Resume starts a broker on
// the same port from that directory, so acknowledged records, topics and
// committed offsets survive. This is kfake's DataDir persistence with Close
// and NewCluster on the same Ports. It was chosen over failing requests with
// a kfake control function because a control answer is a Kafka error code
// (which clients retry in place) while real outages are TCP failures, which
// is what kafka-go's and librdkafka's reconnect logic must handle.
type KafkaBroker struct {
	t    testing.TB
	port int
	dir  string
	opts kafkaOpts

	mu      sync.Mutex
	cluster *kfake.Cluster // nil while paused
}

// KafkaOption configures the broker Kafka starts (security settings a
// production cluster has); without options the broker is plaintext and
// unauthenticated.
type KafkaOption func(*kafkaOpts)

type kafkaOpts struct {
	users         []KafkaUser
	serverTLS     *tls.Config
	clientTLS     *tls.Config
	brokerConfigs map[string]string
}

// KafkaUser is a SASL superuser of the broker. Mechanism is "PLAIN",
// "SCRAM-SHA-256" or "SCRAM-SHA-512".
type KafkaUser struct {
	Mechanism, Username, Password string
}

// KafkaSASL enables SASL on the broker with the given superusers: every
// connection must authenticate as one of them. The broker's own helper
// clients (Client, CreateTopic, Records, WaitForRecords) log in as the first.
func KafkaSASL(users ...KafkaUser) KafkaOption {
	return func(o *kafkaOpts) { o.users = append(o.users, users...) }
}

// KafkaTLS makes the broker listen with TLS using server (which holds its
// certificate); the broker's own helper clients connect with client (which
// must trust that certificate).
func KafkaTLS(server, client *tls.Config) KafkaOption {
	return func(o *kafkaOpts) { o.serverTLS, o.clientTLS = server, client }
}

// KafkaBrokerConfigs starts the broker with these broker configs, as a
// broker's server.properties would set them (kfake.BrokerConfigs), for
// example {"message.max.bytes": "100000"}: the broker then refuses larger
// record batches with MESSAGE_TOO_LARGE.
func KafkaBrokerConfigs(configs map[string]string) KafkaOption {
	return func(o *kafkaOpts) {
		if o.brokerConfigs == nil {
			o.brokerConfigs = map[string]string{}
		}
		for k, v := range configs {
			o.brokerConfigs[k] = v
		}
	}
}

// Kafka starts a kfake broker for the test and closes it on cleanup.
// Options enable SASL or TLS (see KafkaSASL, KafkaTLS).
func Kafka(t testing.TB, opts ...KafkaOption) *KafkaBroker {
	t.Helper()
	k := &KafkaBroker{t: t, dir: t.TempDir()}
	for _, o := range opts {
		o(&k.opts)
	}
	if _, err := k.clientOpts(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		if k.port, err = stablePort(); err != nil {
			break
		}
		if err = k.start(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("testenv: start kfake broker: %v", err)
	}
	t.Cleanup(k.Pause)
	return k
}

func (k *KafkaBroker) start() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cluster != nil {
		return nil
	}
	opts := []kfake.Opt{
		kfake.Ports(k.port),
		kfake.DataDir(k.dir),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(KafkaDefaultPartitions),
		kfake.ClusterID("edgepipe-test"),
	}
	if len(k.opts.users) > 0 {
		opts = append(opts, kfake.EnableSASL())
		for _, u := range k.opts.users {
			opts = append(opts, kfake.Superuser(u.Mechanism, u.Username, u.Password))
		}
	}
	if k.opts.serverTLS != nil {
		opts = append(opts, kfake.TLS(k.opts.serverTLS))
	}
	if len(k.opts.brokerConfigs) > 0 {
		opts = append(opts, kfake.BrokerConfigs(k.opts.brokerConfigs))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return fmt.Errorf("kfake on 127.0.0.1:%d: %w", k.port, err)
	}
	k.cluster = c
	return nil
}

// Addr returns the broker's host:port.
func (k *KafkaBroker) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(k.port))
}

// Brokers returns the bootstrap broker list (one address).
func (k *KafkaBroker) Brokers() []string { return []string{k.Addr()} }

// Pause stops the broker: connections drop and new ones are refused until
// Resume. Every record acknowledged before Pause is kept. Pausing a paused
// broker does nothing; Pause is also the cleanup.
func (k *KafkaBroker) Pause() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cluster != nil {
		k.cluster.Close()
		k.cluster = nil
	}
}

// Resume starts the broker again on the same port with the data it had.
// It fails the test if the port cannot be bound again within 10 seconds.
// Call it from the test's goroutine; use ResumeContext elsewhere.
func (k *KafkaBroker) Resume() {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := k.ResumeContext(ctx); err != nil {
		k.t.Fatalf("testenv: %v", err)
	}
}

// ResumeContext is Resume returning an error instead of failing the test,
// for use from any goroutine. It retries binding the port until ctx ends.
func (k *KafkaBroker) ResumeContext(ctx context.Context) error {
	for {
		err := k.start()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("resume kfake broker: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Paused reports whether the broker is paused.
func (k *KafkaBroker) Paused() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cluster == nil
}

// clientOpts are the options every helper client of the broker starts
// with: seed broker, short dial timeout, and the broker's TLS and SASL.
func (k *KafkaBroker) clientOpts() ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(k.Addr()), kgo.DialTimeout(2 * time.Second)}
	if k.opts.clientTLS != nil {
		opts = append(opts, kgo.DialTLSConfig(k.opts.clientTLS.Clone()))
	}
	if len(k.opts.users) > 0 {
		u := k.opts.users[0]
		var m sasl.Mechanism
		switch u.Mechanism {
		case "PLAIN":
			m = plain.Auth{User: u.Username, Pass: u.Password}.AsMechanism()
		case "SCRAM-SHA-256":
			m = scram.Auth{User: u.Username, Pass: u.Password}.AsSha256Mechanism()
		case "SCRAM-SHA-512":
			m = scram.Auth{User: u.Username, Pass: u.Password}.AsSha512Mechanism()
		default:
			return nil, fmt.Errorf("kafka SASL mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", u.Mechanism)
		}
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// newClient is a helper client with the broker's settings plus extra.
func (k *KafkaBroker) newClient(extra ...kgo.Opt) (*kgo.Client, error) {
	opts, err := k.clientOpts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client for %s: %w", k.Addr(), err)
	}
	return cl, nil
}

// Client returns a franz-go client for the broker, closed on cleanup.
// Extra options are appended to the defaults (seed broker, short dial
// timeout, and the broker's TLS and SASL settings when it has them).
func (k *KafkaBroker) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := k.newClient(opts...)
	if err != nil {
		t.Fatalf("testenv: kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// CreateTopic creates topic with the given number of partitions, failing
// the test on any error other than "already exists".
func (k *KafkaBroker) CreateTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := createTopic(ctx, k.Client(t), topic, partitions); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// createTopic creates topic with cl, ignoring "already exists".
func createTopic(ctx context.Context, cl *kgo.Client, topic string, partitions int) error {
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic = topic
	rt.NumPartitions = int32(partitions)
	rt.ReplicationFactor = 1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	for _, tr := range resp.Topics {
		if err := kerr.ErrorForCode(tr.ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", topic, err)
		}
	}
	return nil
}

// SetBrokerConfig changes a broker config while the broker runs, the way
// an operator does with `kafka-configs.sh --alter --entity-type brokers
// --entity-default` (an IncrementalAlterConfigs request). The value also
// holds after Pause and Resume.
func (k *KafkaBroker) SetBrokerConfig(t testing.TB, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	rr := kmsg.NewIncrementalAlterConfigsRequestResource()
	rr.ResourceType = kmsg.ConfigResourceTypeBroker
	rc := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	rc.Name, rc.Value, rc.Op = key, kmsg.StringPtr(value), kmsg.IncrementalAlterConfigOpSet
	rr.Configs = append(rr.Configs, rc)
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, k.Client(t))
	if err != nil {
		t.Fatalf("testenv: set broker config %s=%s: %v", key, value, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			t.Fatalf("testenv: set broker config %s=%s: %v", key, value, err)
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	KafkaBrokerConfigs(map[string]string{key: value})(&k.opts)
}

// NewTopic creates a topic with a unique name derived from the test's name
// and returns the name.
func (k *KafkaBroker) NewTopic(t testing.TB, partitions int) string {
	t.Helper()
	name := uniqueName(t, "t_")
	k.CreateTopic(t, name, partitions)
	return name
}

// Records returns every record of topic up to the end offsets at the time of
// the call, in partition then offset order. A topic that does not exist has
// no records. It fails the test if the records cannot be read in 60 seconds.
func (k *KafkaBroker) Records(t testing.TB, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	recs, err := k.records(ctx, topic)
	if err != nil {
		t.Fatalf("testenv: read topic %s: %v", topic, err)
	}
	return recs
}

// WaitForRecords polls topic until it holds at least n records and returns
// them all (see Records). It fails the test after timeout, saying how many
// records it saw.
func (k *KafkaBroker) WaitForRecords(t testing.TB, topic string, n int, timeout time.Duration) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var (
		recs []*kgo.Record
		err  error
	)
	for {
		ends, e := k.endOffsets(ctx, topic)
		err = e
		if e == nil {
			var total int64
			for _, end := range ends {
				total += end
			}
			if total >= int64(n) {
				if recs, err = k.records(ctx, topic); err == nil && len(recs) >= n {
					return recs
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: topic %s: want at least %d records, have %d after %s (last error: %v)", topic, n, len(recs), timeout, err)
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// endOffsets returns the high watermark of every partition of topic, or an
// empty map when the topic does not exist.
func (k *KafkaBroker) endOffsets(ctx context.Context, topic string) (map[int32]int64, error) {
	cl, err := k.newClient()
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	mresp, err := meta.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	lo := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = topic
	for _, mt := range mresp.Topics {
		if err := kerr.ErrorForCode(mt.ErrorCode); err != nil {
			if errors.Is(err, kerr.UnknownTopicOrPartition) {
				return map[int32]int64{}, nil
			}
			return nil, fmt.Errorf("metadata of %s: %w", topic, err)
		}
		for _, p := range mt.Partitions {
			lp := kmsg.NewListOffsetsRequestTopicPartition()
			lp.Partition = p.Partition
			lp.Timestamp = -1 // latest
			lt.Partitions = append(lt.Partitions, lp)
		}
	}
	ends := make(map[int32]int64, len(lt.Partitions))
	if len(lt.Partitions) == 0 {
		return ends, nil
	}
	lo.Topics = append(lo.Topics, lt)
	lresp, err := lo.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("list offsets: %w", err)
	}
	for _, rt := range lresp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return nil, fmt.Errorf("list offsets of %s/%d: %w", topic, rp.Partition, err)
			}
			ends[rp.Partition] = rp.Offset
		}
	}
	return ends, nil
}

func (k *KafkaBroker) records(ctx context.Context, topic string) ([]*kgo.Record, error) {
	ends, err := k.endOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	parts := map[int32]kgo.Offset{}
	for p, end := range ends {
		if end > 0 {
			parts[p] = kgo.NewOffset().AtStart()
		}
	}
	if len(parts) == 0 {
		return nil, nil
	}
	cl, err := k.newClient(
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchMaxWait(200*time.Millisecond),
	)
	if err != nil {
		return nil, fmt.Errorf("kafka consumer of %s: %w", topic, err)
	}
	defer cl.Close()

	byPart := map[int32][]*kgo.Record{}
	done := func() bool {
		for p := range parts {
			rs := byPart[p]
			if len(rs) == 0 || rs[len(rs)-1].Offset+1 < ends[p] {
				return false
			}
		}
		return true
	}
	for !done() {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("consume %s: %w", topic, err)
		}
		for _, fe := range fetches.Errors() {
			if !errors.Is(fe.Err, context.Canceled) && !errors.Is(fe.Err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("fetch %s/%d: %w", fe.Topic, fe.Partition, fe.Err)
			}
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if r.Offset < ends[r.Partition] {
				byPart[r.Partition] = append(byPart[r.Partition], r)
			}
		})
	}
	ps := make([]int32, 0, len(byPart))
	for p := range byPart {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	var out []*kgo.Record
	for _, p := range ps {
		out = append(out, byPart[p]...)
	}
	return out, nil
}

// KafkaBrokers is a kfake cluster of several brokers on stable loopback
// ports whose listeners a test can break the ways a production broker
// fails, while the cluster itself (topics, records, leaders) lives on:
//
//   - Down: the broker's port is closed and its connections are cut, as
//     when a broker process dies; it stays the leader of its partitions
//     (no failover), so writes to them fail until Up listens again on the
//     same port.
//   - Hang: connections stay open and new ones are accepted, but nothing
//     is read or answered, as with a broker stuck in a long GC pause or on
//     a dead disk; on Release everything it received is processed and
//     answered (requests whose client gave up meanwhile are still applied).
//   - MoveLeader: leadership of a partition moves to another broker; the
//     old leader answers NOT_LEADER_OR_FOLLOWER.
//   - FailProduces: produce requests are applied and then answered with an
//     error such as REQUEST_TIMED_OUT (a write whose outcome the client
//     cannot know).
//
// The cluster keeps its log in memory and lives until the test ends.
type KafkaBrokers struct {
	c     *kfake.Cluster
	ports []int // ports[i] is the port of node i
	lns   []*faultListener
}

// KafkaCluster starts a kfake cluster of n brokers (node IDs 0 to n-1) for
// the test and closes it on cleanup.
func KafkaCluster(t testing.TB, n int) *KafkaBrokers {
	t.Helper()
	k := &KafkaBrokers{}
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		if err = k.start(n); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("testenv: start a kfake cluster of %d brokers: %v", n, err)
	}
	t.Cleanup(func() {
		k.c.Close()
		for _, l := range k.lns {
			l.closeConns()
		}
	})
	return k
}

func (k *KafkaBrokers) start(n int) error {
	k.ports, k.lns = make([]int, n), make([]*faultListener, n)
	byAddr := map[string]*faultListener{}
	for i := range k.ports {
		p, err := stablePort()
		if err != nil {
			return err
		}
		k.ports[i] = p
		k.lns[i] = &faultListener{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), changed: make(chan struct{})}
		byAddr[k.lns[i].addr] = k.lns[i]
	}
	c, err := kfake.NewCluster(
		kfake.Ports(k.ports...),
		kfake.ClusterID("edgepipe-test"),
		kfake.DefaultNumPartitions(KafkaDefaultPartitions),
		kfake.ListenFn(func(network, addr string) (net.Listener, error) {
			l := byAddr[addr]
			if l == nil {
				return nil, fmt.Errorf("no fault listener for %s", addr)
			}
			return l, l.listen(network)
		}),
	)
	if err != nil {
		return err
	}
	k.c = c
	return nil
}

// Brokers returns the brokers' host:port, by node ID.
func (k *KafkaBrokers) Brokers() []string {
	out := make([]string, len(k.lns))
	for i, l := range k.lns {
		out[i] = l.addr
	}
	return out
}

// BrokerList returns Brokers joined by commas (a bootstrap list).
func (k *KafkaBrokers) BrokerList() string { return strings.Join(k.Brokers(), ",") }

// CreateTopic creates topic with partitions spread over the brokers,
// failing the test on any error other than "already exists".
func (k *KafkaBrokers) CreateTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...), kgo.DialTimeout(2*time.Second))
	if err != nil {
		t.Fatalf("testenv: kafka client: %v", err)
	}
	defer cl.Close()
	if err := createTopic(ctx, cl, topic, partitions); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Leader returns the node leading a partition (-1 when it does not exist).
func (k *KafkaBrokers) Leader(topic string, partition int32) int32 {
	return k.c.LeaderFor(topic, partition)
}

// MoveLeader makes node the leader of a partition.
func (k *KafkaBrokers) MoveLeader(topic string, partition, node int32) error {
	if err := k.c.MoveTopicPartition(topic, partition, node); err != nil {
		return fmt.Errorf("testenv: moving the leader of %s/%d to node %d: %w", topic, partition, node, err)
	}
	return nil
}

// Down closes node's port and cuts its connections until Up.
func (k *KafkaBrokers) Down(node int32) { k.lns[node].down() }

// Up listens on node's port again after Down, retrying for up to 10
// seconds while the port is still in use.
func (k *KafkaBrokers) Up(node int32) error { return k.lns[node].up() }

// Hang stops node from reading or answering anything until Release.
func (k *KafkaBrokers) Hang(node int32) { k.lns[node].setHung(true) }

// Release ends a Hang: the node processes what it received meanwhile.
func (k *KafkaBrokers) Release(node int32) { k.lns[node].setHung(false) }

// FailProduces makes the next n produce requests for topic (any partition,
// any broker) be applied and then answered with code, e.g.
// kerr.RequestTimedOut: the records are in the log but the client is told
// the write failed. It returns a function reporting how many requests it
// has answered so far.
func (k *KafkaBrokers) FailProduces(topic string, code *kerr.Error, n int) func() int {
	h := k.c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: code, Count: n})
	return h.Hits
}

// EndOffsets returns the high watermark of every partition of topic whose
// leader answers within timeout: a hung or closed leader's partitions are
// missing from the map rather than delaying the others.
func (k *KafkaBrokers) EndOffsets(ctx context.Context, topic string, timeout time.Duration) (map[int32]int64, error) {
	var leaders map[int32][]int32 // node → partitions
	var lastErr error
	for _, addr := range k.Brokers() {
		if leaders, lastErr = partitionLeaders(ctx, addr, topic, timeout); lastErr == nil {
			break
		}
	}
	if leaders == nil {
		return nil, lastErr
	}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		ends = map[int32]int64{}
	)
	for node, parts := range leaders {
		if node < 0 || int(node) >= len(k.lns) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := listEndOffsets(ctx, k.lns[node].addr, topic, parts, timeout)
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			maps.Copy(ends, got)
		}()
	}
	wg.Wait()
	return ends, nil
}

// KcatConsume runs KcatConsume against every broker of the cluster.
func (k *KafkaBrokers) KcatConsume(t testing.TB, topic string) []KcatMessage {
	t.Helper()
	return KcatConsume(t, k.BrokerList(), topic)
}

// seedRequest sends req to the broker at addr only (not to the cluster's
// leaders), within timeout.
func seedRequest(ctx context.Context, addr string, timeout time.Duration, req kmsg.Request) (kmsg.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DialTimeout(timeout), kgo.RequestRetries(0))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	seeds := cl.SeedBrokers()
	if len(seeds) == 0 {
		return nil, fmt.Errorf("no seed broker for %s", addr)
	}
	return seeds[0].Request(ctx, req)
}

// partitionLeaders asks the broker at addr which node leads each
// partition of topic.
func partitionLeaders(ctx context.Context, addr, topic string, timeout time.Duration) (map[int32][]int32, error) {
	req := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, mt)
	resp, err := seedRequest(ctx, addr, timeout, req)
	if err != nil {
		return nil, fmt.Errorf("metadata from %s: %w", addr, err)
	}
	out := map[int32][]int32{}
	for _, t := range resp.(*kmsg.MetadataResponse).Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return nil, fmt.Errorf("metadata of %s from %s: %w", topic, addr, err)
		}
		for _, p := range t.Partitions {
			out[p.Leader] = append(out[p.Leader], p.Partition)
		}
	}
	return out, nil
}

// listEndOffsets asks the broker at addr for the high watermarks of
// partitions of topic it leads.
func listEndOffsets(ctx context.Context, addr, topic string, partitions []int32, timeout time.Duration) (map[int32]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = topic
	for _, p := range partitions {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition = p
		lp.Timestamp = -1 // latest
		lt.Partitions = append(lt.Partitions, lp)
	}
	req.Topics = append(req.Topics, lt)
	resp, err := seedRequest(ctx, addr, timeout, req)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, rt := range resp.(*kmsg.ListOffsetsResponse).Topics {
		for _, rp := range rt.Partitions {
			if kerr.ErrorForCode(rp.ErrorCode) == nil {
				out[rp.Partition] = rp.Offset
			}
		}
	}
	return out, nil
}

// faultListener is one broker's listener: kfake accepts from it, and the
// test closes, reopens and hangs it.
type faultListener struct {
	addr string

	mu      sync.Mutex
	ln      net.Listener // nil while down
	network string
	hung    bool
	closed  bool                    // closed for good (the cluster closed)
	changed chan struct{}           // closed and replaced at every change
	conns   map[*faultConn]struct{} // open accepted connections
}

func (l *faultListener) listen(network string) error {
	ln, err := net.Listen(network, l.addr)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ln, l.network = ln, network
	return nil
}

// notify wakes everything waiting for a change. Callers hold l.mu.
func (l *faultListener) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Accept returns the next connection; while the broker is down it waits
// for Up instead of failing (kfake stops accepting for good on an error).
func (l *faultListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		ln, changed, closed := l.ln, l.changed, l.closed
		l.mu.Unlock()
		if closed {
			return nil, net.ErrClosed
		}
		if ln == nil {
			<-changed
			continue
		}
		c, err := ln.Accept()
		if err != nil {
			l.mu.Lock()
			replaced := l.ln != ln || l.closed
			l.mu.Unlock()
			if replaced {
				continue // closed by down or Close: look again
			}
			return nil, err
		}
		fc := &faultConn{Conn: c, l: l}
		l.mu.Lock()
		if l.ln != ln { // went down meanwhile
			l.mu.Unlock()
			c.Close()
			continue
		}
		if l.conns == nil {
			l.conns = map[*faultConn]struct{}{}
		}
		l.conns[fc] = struct{}{}
		l.mu.Unlock()
		return fc, nil
	}
}

// Close ends the listener for good (kfake's Close).
func (l *faultListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	var err error
	if l.ln != nil {
		err = l.ln.Close()
		l.ln = nil
	}
	l.hung = false
	l.notify()
	return err
}

// Addr is the broker's address, also while it is down.
func (l *faultListener) Addr() net.Addr {
	a, _ := net.ResolveTCPAddr("tcp", l.addr)
	return a
}

func (l *faultListener) down() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		l.ln.Close()
		l.ln = nil
	}
	for c := range l.conns {
		c.Conn.Close()
	}
	l.conns = nil
	l.notify()
}

func (l *faultListener) up() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		if l.ln != nil || l.closed {
			l.mu.Unlock()
			return nil
		}
		ln, err := net.Listen(l.network, l.addr)
		if err == nil {
			l.ln = ln
			l.notify()
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: listening again on %s: %w", l.addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (l *faultListener) setHung(hung bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hung = hung
	l.notify()
}

// wait blocks while the broker hangs.
func (l *faultListener) wait() {
	for {
		l.mu.Lock()
		hung, changed := l.hung, l.changed
		l.mu.Unlock()
		if !hung {
			return
		}
		<-changed
	}
}

func (l *faultListener) closeConns() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		c.Conn.Close()
	}
	l.conns = nil
}

func (l *faultListener) forget(c *faultConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.conns, c)
}

// faultConn is an accepted connection that stops reading and writing while
// its broker hangs: bytes read just before a hang are held until Release.
type faultConn struct {
	net.Conn
	l *faultListener
}

func (c *faultConn) Read(p []byte) (int, error) {
	c.l.wait()
	n, err := c.Conn.Read(p)
	c.l.wait()
	return n, err
}

func (c *faultConn) Write(p []byte) (int, error) {
	c.l.wait()
	return c.Conn.Write(p)
}

func (c *faultConn) Close() error {
	c.l.forget(c)
	return c.Conn.Close()
}
