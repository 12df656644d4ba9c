package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
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
	cl := k.Client(t)
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic = topic
	rt.NumPartitions = int32(partitions)
	rt.ReplicationFactor = 1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("testenv: create topic %s: %v", topic, err)
	}
	for _, tr := range resp.Topics {
		if err := kerr.ErrorForCode(tr.ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			t.Fatalf("testenv: create topic %s: %v", topic, err)
		}
	}
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
