package receiver_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// The Kafka fault test runs the receiver binary against a 3-broker kfake
// cluster (6 partitions, two led by each broker) while 12 agents post
// batches at a steady rate, breaks the cluster the ways a production Kafka
// breaks, and reads every record back with kcat, comparing by (agent,
// seq_num, record_index):
//
//   - missing: acknowledged records that never reached the topic (must be 0);
//   - extra copies: copies beyond the first; allowed only up to the records
//     of writes the brokers never confirmed, which the receiver counts in
//     edgepipe_rtld_sink_partition_unconfirmed_records_total;
//   - out of order: a record whose first copy comes after the first copy of
//     a later record of the same agent in their partition (must be 0);
//   - stall: the longest time a partition whose leader was up (neither down
//     nor hung) went without a new record (at most 10 s);
//   - resume: the time from a broker's return to the first new record in its
//     partitions (at most 5 s).
//
// Each scenario takes 20 to 60 s; they run two at a time.

const (
	faultPartitions  = 6
	faultBrokers     = 3
	faultAgents      = 12
	faultRecordsPerS = 1000
	faultBatch       = 25 // records per batch: each agent posts 1000/12/25 ≈ 3.3 batches a second
	maxLiveStall     = 10 * time.Second
	maxResume        = 5 * time.Second
)

// kafkaScenario is one row of the fault table: what is done to the
// cluster while the load runs.
type kafkaScenario struct {
	name string
	// run breaks the cluster and repairs it, recording each fault window
	// in the timeline; the load runs from before run starts until after it
	// returns.
	run func(t *testing.T, c *faultCluster)
	// answered: every failed write was answered by a broker, so no record
	// may arrive twice.
	answered bool
}

func kafkaScenarios() []kafkaScenario {
	return []kafkaScenario{
		{name: "leaders move every 3s", answered: true, run: func(t *testing.T, c *faultCluster) {
			for i := range 5 {
				c.sleep(3 * time.Second)
				for p := range int32(faultPartitions) {
					if err := c.k.MoveLeader(c.topic, p, (c.k.Leader(c.topic, p)+1+int32(i%2))%faultBrokers); err != nil {
						t.Error(err)
					}
				}
			}
			c.sleep(3 * time.Second)
		}},
		{name: "one broker down 15s", run: func(t *testing.T, c *faultCluster) {
			c.down(1)
			c.sleep(15 * time.Second)
			c.up(t, 1)
		}},
		{name: "one broker down 45s", run: func(t *testing.T, c *faultCluster) {
			c.down(2)
			c.sleep(45 * time.Second)
			c.up(t, 2)
		}},
		{name: "one broker hung 20s", run: func(_ *testing.T, c *faultCluster) {
			c.hang(0)
			c.sleep(20 * time.Second)
			c.release(0)
		}},
		{name: "5 produce answers REQUEST_TIMED_OUT after the append", run: func(t *testing.T, c *faultCluster) {
			hits := c.k.FailProduces(c.topic, kerr.RequestTimedOut, 5)
			deadline := time.Now().Add(20 * time.Second)
			for hits() < 5 && time.Now().Before(deadline) {
				c.sleep(100 * time.Millisecond)
			}
			if hits() < 5 {
				t.Errorf("only %d produce requests were faulted", hits())
			}
		}},
		{name: "one broker down 15s, another hangs as the backlog drains", run: func(t *testing.T, c *faultCluster) {
			c.down(1)
			c.sleep(15 * time.Second)
			c.up(t, 1)
			c.sleep(time.Second)
			c.hang(2)
			c.sleep(15 * time.Second)
			c.release(2)
		}},
	}
}

func TestKafkaFaults(t *testing.T) {
	testenv.Kcat(t)
	buildReceiver(t)
	for _, sc := range kafkaScenarios() {
		t.Run(strings.ReplaceAll(sc.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			runKafkaScenario(t, sc)
		})
	}
}

// faultCluster is the cluster of one scenario and the timeline of its
// faults.
type faultCluster struct {
	k     *testenv.KafkaBrokers
	topic string

	mu     sync.Mutex
	faults []faultWindow
}

// faultWindow is a time a node was down or hung; till is zero while it lasts.
type faultWindow struct {
	node       int32
	from, till time.Time
}

func (c *faultCluster) sleep(d time.Duration) { time.Sleep(d) }

func (c *faultCluster) begin(node int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults = append(c.faults, faultWindow{node: node, from: time.Now()})
}

func (c *faultCluster) end(node int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.faults {
		if c.faults[i].node == node && c.faults[i].till.IsZero() {
			c.faults[i].till = time.Now()
		}
	}
}

func (c *faultCluster) down(node int32)    { c.k.Down(node); c.begin(node) }
func (c *faultCluster) hang(node int32)    { c.k.Hang(node); c.begin(node) }
func (c *faultCluster) release(node int32) { c.k.Release(node); c.end(node) }
func (c *faultCluster) up(t *testing.T, node int32) {
	if err := c.k.Up(node); err != nil {
		t.Error(err)
	}
	c.end(node)
}

// faulted reports whether node was down or hung at any time in [from, to].
func (c *faultCluster) faulted(node int32, from, to time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.faults {
		till := f.till
		if till.IsZero() {
			till = to
		}
		if f.node == node && f.from.Before(to) && till.After(from) {
			return true
		}
	}
	return false
}

// faultAgentIDs returns faultAgents agent IDs, two per partition under the
// Java client's murmur2 partitioning of the receiver's key.
func faultAgentIDs() []string {
	parts := make([]int, faultPartitions)
	for i := range parts {
		parts[i] = i
	}
	per := map[int]int{}
	var out []string
	for i := 0; len(out) < faultAgents; i++ {
		id := fmt.Sprintf("agent-%02d", i)
		p := kafkago.Murmur2Balancer{}.Balance(kafkago.Message{Key: []byte(faultEnv + "/" + id)}, parts...)
		if per[p] < faultAgents/faultPartitions {
			per[p]++
			out = append(out, id)
		}
	}
	return out
}

// offsetSample is the partitions' end offsets at one time (partitions whose
// leader did not answer are missing).
type offsetSample struct {
	at   time.Time
	ends map[int32]int64
}

func runKafkaScenario(t *testing.T, sc kafkaScenario) {
	k := testenv.KafkaCluster(t, faultBrokers)
	topic := "faults"
	k.CreateTopic(t, topic, faultPartitions)
	for p := range int32(faultPartitions) {
		if err := k.MoveLeader(topic, p, p%faultBrokers); err != nil {
			t.Fatal(err)
		}
	}
	p, base := faultReceiver(t, "--spool.dir="+filepath.Join(t.TempDir(), "spool"),
		"--kafka.brokers="+k.BrokerList(), "--kafka.topic="+topic, "--no-kafka.create-topic")
	c := &faultCluster{k: k, topic: topic}

	ctx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	agents := faultAgentIDs()
	acked := make([]atomic.Int64, len(agents)) // batches acknowledged per agent (seq 0 … n-1)
	var loadWG sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	url := base + "/ingest/" + faultEnv
	interval := time.Duration(float64(time.Second) * faultAgents * faultBatch / faultRecordsPerS)
	for i, agent := range agents {
		loadWG.Add(1)
		go func() {
			defer loadWG.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for seq := 0; ; {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				recs := make([]string, faultBatch)
				for r := range recs {
					recs[r] = fmt.Sprintf(`{"uuid":"%s-%d-%d","pad":"%s"}`, agent, seq, r, strings.Repeat("x", 200))
				}
				a, err := post(client, url, gzipBytes(t, envelope(agent, seq, recs)))
				if err == nil && a.status == http.StatusOK {
					acked[i].Store(int64(seq + 1))
					seq++
				}
			}
		}()
	}
	var samples []offsetSample
	pollDone := make(chan struct{})
	go func() {
		defer close(pollDone)
		for ctx.Err() == nil {
			ends, err := k.EndOffsets(ctx, topic, time.Second)
			if err == nil {
				samples = append(samples, offsetSample{at: time.Now(), ends: ends})
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()

	time.Sleep(3 * time.Second) // steady state first
	sc.run(t, c)
	time.Sleep(6 * time.Second) // the return, and steady state again
	stopLoad()
	loadWG.Wait()
	<-pollDone
	loadEnd := time.Now()

	// Drain, then read everything back with kcat.
	metrics := base + "/metrics"
	waitFor(t, "the Kafka sink to deliver the backlog", 90*time.Second, func() bool {
		alive(t, p)
		return scrape(client, metrics, `edgepipe_rtld_sink_lag_entries{sink="kafka"}`) == 0
	})
	unconfirmed := scrapeSum(client, metrics, "edgepipe_rtld_sink_partition_unconfirmed_records_total")
	msgs := k.KcatConsume(t, topic)

	res := checkRecords(t, msgs, agents, acked)
	stall, resumes := liveStall(c, samples, loadEnd)
	t.Logf("%s: acked %d records, missing %d, extra copies %d (unconfirmed writes: %s), out of order %d, longest stall of a partition with a live leader %.1fs, resumed after %s",
		sc.name, res.acked, res.missing, res.extra, unconfirmedText(unconfirmed), res.outOfOrder, stall.Seconds(), resumes)
	if res.missing > 0 {
		t.Errorf("%d acknowledged records missing from the topic", res.missing)
	}
	if res.outOfOrder > 0 {
		t.Errorf("%d records out of order within their agent and partition", res.outOfOrder)
	}
	switch {
	case sc.answered && res.extra > 0:
		t.Errorf("%d extra copies though every failed write was answered by a broker", res.extra)
	case unconfirmed < 0 && res.extra > 0:
		t.Errorf("%d extra copies and no count of unconfirmed writes", res.extra)
	case unconfirmed >= 0 && res.extra > int(unconfirmed):
		t.Errorf("%d extra copies, more than the %d records of unconfirmed writes", res.extra, int(unconfirmed))
	}
	if stall > maxLiveStall {
		t.Errorf("a partition with a live leader stalled for %.1fs (at most %s)", stall.Seconds(), maxLiveStall)
	}
	for _, r := range resumes {
		if r > maxResume {
			t.Errorf("delivery resumed %.1fs after a broker's return (at most %s)", r.Seconds(), maxResume)
		}
	}
}

func unconfirmedText(v float64) string {
	if v < 0 {
		return "not counted"
	}
	return strconv.Itoa(int(v)) + " records"
}

// scrapeSum sums every sample of a metric family (-1 when there is none).
func scrapeSum(client *http.Client, metricsURL, name string) float64 {
	resp, err := client.Get(metricsURL)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	sum, found := 0.0, false
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum, found = sum+v, true
		}
	}
	if !found {
		return -1
	}
	return sum
}

type recordCheck struct {
	acked, missing, extra, outOfOrder int
}

// checkRecords compares the topic with what was acknowledged.
func checkRecords(t *testing.T, msgs []testenv.KcatMessage, agents []string, acked []atomic.Int64) recordCheck {
	t.Helper()
	type id struct {
		agent          string
		seq, recordIdx int
	}
	copies := map[id]int{}
	last := map[string]id{} // newest first copy per agent
	var res recordCheck
	for _, m := range msgs { // partition by partition, in offset order
		agent, _ := m.Header("agent_id")
		seq, err1 := headerInt(m, "seq_num")
		idx, err2 := headerInt(m, "record_index")
		if agent == "" || err1 != nil || err2 != nil {
			t.Fatalf("message at %d/%d without identity headers: %+v", m.Partition, m.Offset, m.Headers)
		}
		r := id{agent, seq, idx}
		copies[r]++
		if copies[r] > 1 {
			continue
		}
		if prev, ok := last[agent]; ok && (seq < prev.seq || seq == prev.seq && idx < prev.recordIdx) {
			res.outOfOrder++
			continue
		}
		last[agent] = r
	}
	for i, agent := range agents {
		n := int(acked[i].Load())
		for seq := range n {
			for idx := range faultBatch {
				res.acked++
				if c := copies[id{agent, seq, idx}]; c == 0 {
					res.missing++
				}
			}
		}
	}
	for _, c := range copies {
		res.extra += c - 1
	}
	return res
}

func headerInt(m testenv.KcatMessage, key string) (int, error) {
	v, ok := m.Header(key)
	if !ok {
		return 0, fmt.Errorf("no %s header", key)
	}
	return strconv.Atoi(v)
}

// liveStall returns the longest time a partition whose leader was up went
// without a new record, and for each return of a broker the time until its
// partitions took records again.
func liveStall(c *faultCluster, samples []offsetSample, end time.Time) (time.Duration, []time.Duration) {
	var stall time.Duration
	for p := range int32(faultPartitions) {
		var lastEnd int64 = -1
		var since time.Time
		for _, s := range samples {
			e, ok := s.ends[p]
			if !ok {
				continue
			}
			if e != lastEnd {
				lastEnd, since = e, s.at
				continue
			}
			// No progress since `since`: it counts when the leader was up
			// all along (leader moves keep a leader up).
			if !c.faulted(c.k.Leader(c.topic, p), since, s.at) {
				stall = max(stall, s.at.Sub(since))
			}
		}
	}
	var resumes []time.Duration
	c.mu.Lock()
	faults := slices.Clone(c.faults)
	c.mu.Unlock()
	for _, f := range faults {
		if f.till.IsZero() || f.till.After(end) {
			continue
		}
		var resume time.Duration
		for p := range int32(faultPartitions) {
			if c.k.Leader(c.topic, p) == f.node {
				resume = max(resume, resumeAfter(samples, p, f.till))
			}
		}
		resumes = append(resumes, resume)
	}
	return stall, resumes
}

// resumeAfter returns how long after a broker's return at `back` the end
// offset of partition p grew in two consecutive samples: a hung broker
// applies the writes it held the moment it is released, so one jump can
// be those; a second one is new delivery.
func resumeAfter(samples []offsetSample, p int32, back time.Time) time.Duration {
	var prev int64 = -1
	grew := false
	for _, s := range samples {
		e, ok := s.ends[p]
		if !ok {
			continue
		}
		if s.at.After(back) && prev >= 0 && e > prev {
			if grew {
				return s.at.Sub(back)
			}
			grew = true
		} else if s.at.After(back) {
			grew = false
		}
		prev = e
	}
	return time.Duration(math.MaxInt64)
}
