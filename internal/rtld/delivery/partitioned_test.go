package delivery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

// partSink is a Partitioned sink whose partitions can be made to fail: a
// batch of agent "p<k>" goes to partition k mod n.
type partSink struct {
	// entered and hold, when set, make the first delivery tell that it
	// started and wait for hold to close.
	entered, hold chan struct{}
	// delay is how long every delivery takes.
	delay time.Duration

	mu        sync.Mutex
	n         int
	down      map[int]bool
	delivered map[int][]string // partition → "agent/seq" in delivery order
	calls     map[int]int      // deliveries per partition while down
}

func newPartSink(n int) *partSink {
	return &partSink{n: n, down: map[int]bool{}, delivered: map[int][]string{}, calls: map[int]int{}}
}

func (s *partSink) Deliver(context.Context, []*accesslog.Batch) error {
	return errors.New("partSink: only partition deliveries")
}

func (s *partSink) Partitions(context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, nil
}

func (s *partSink) PartitionOf(b *accesslog.Batch, n int) int {
	k, _ := strconv.Atoi(strings.TrimPrefix(b.AgentID, "p"))
	return k % n
}

func (s *partSink) setDown(p int, down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down[p] = down
}

func (s *partSink) Probe(_ context.Context, p int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down[p] {
		return errors.New("leader down")
	}
	return nil
}

func (s *partSink) PreparePartition(p int, bs []*accesslog.Batch) Prepared {
	return &partWrite{s: s, p: p, batches: bs}
}

// deliveredTo returns what partition p received.
func (s *partSink) deliveredTo(p int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.delivered[p])
}

type partWrite struct {
	s       *partSink
	p       int
	batches []*accesslog.Batch
}

func (w *partWrite) Deliver(ctx context.Context) error {
	s := w.s
	time.Sleep(s.delay)
	if s.hold != nil {
		close(s.entered)
		<-s.hold
		s.hold = nil
		if ctx.Err() != nil {
			return ctx.Err() // interrupted: the test fails on it
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down[w.p] {
		s.calls[w.p]++
		return &UnconfirmedError{Records: 1, Err: errors.New("no answer")}
	}
	var bad []RecordRef
	for i, b := range w.batches {
		if got := s.PartitionOf(b, s.n); got != w.p {
			return fmt.Errorf("batch of partition %d delivered to %d", got, w.p)
		}
		for j, r := range b.Records {
			if strings.Contains(string(r), "bad") {
				bad = append(bad, RecordRef{Batch: i, Record: j})
				continue
			}
			s.delivered[w.p] = append(s.delivered[w.p], fmt.Sprintf("%s/%d", b.AgentID, b.SeqNum))
		}
	}
	if bad != nil {
		return &RejectedError{Records: bad, Each: true, Reason: "bad", Err: errors.New("bad record")}
	}
	return nil
}

type memDeadLetters struct {
	mu  sync.Mutex
	got []Rejection
}

func (m *memDeadLetters) Add(_ string, r []Rejection) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.got = append(m.got, r...)
	return nil
}

// spoolOf appends batches of agents p0 … p<agents-1>, seq 0 … perAgent-1,
// interleaved, to a new spool and returns its reader.
func spoolOf(t *testing.T, agents, perAgent int, pad int) (*spool.Spool, *spool.Reader) {
	t.Helper()
	sp, err := spool.Open(spool.Options{Dir: t.TempDir(), Readers: []string{"k"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	appendBatches(t, sp, agents, 0, perAgent, pad)
	r, err := sp.Reader("k")
	if err != nil {
		t.Fatal(err)
	}
	return sp, r
}

func appendBatches(t *testing.T, sp *spool.Spool, agents, from, to, pad int) {
	t.Helper()
	for seq := from; seq < to; seq++ {
		for a := range agents {
			b := &accesslog.Batch{EnvironmentID: "env", ProfileID: "1", Format: accesslog.FormatJSON, AgentID: fmt.Sprintf("p%d", a),
				Datestamp: "20261123", SeqNum: int64(seq), Records: []json.RawMessage{json.RawMessage(`{"pad":"` + strings.Repeat("x", pad) + `"}`)}}
			if err := sp.Append(context.Background(), accesslog.Marshal(b)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// inOrder returns the seqs an agent's records arrived in.
func seqsOf(got []string, agent string) []int {
	var out []int
	for _, g := range got {
		a, seq, _ := strings.Cut(g, "/")
		if a == agent {
			n, _ := strconv.Atoi(seq)
			out = append(out, n)
		}
	}
	return out
}

func upTo(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func runPartitionWorker(t *testing.T, w *PartitionWorker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPartitionWorkerKeepsHealthyPartitionsFlowing: with partition 1
// failing, partitions 0 and 2 get all their batches, the spool position
// stays before partition 1's first batch, and once partition 1 answers it
// gets its batches, in order, exactly once.
func TestPartitionWorkerKeepsHealthyPartitionsFlowing(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxPending int64 // small: partition 1 lets go of batches and reads them again
		wantBehind float64
	}{
		{"in memory", 0, 0},
		{"read again from the spool", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const perAgent = 40
			sp, r := spoolOf(t, 3, perAgent, 100)
			sink := newPartSink(3)
			sink.setDown(1, true)
			m := NewMetrics(prometheus.NewRegistry())
			w := &PartitionWorker{Name: "k", Log: quiet, Sink: sink, Reader: r, Metrics: m, MaxBatches: 4, MaxBytes: 600,
				MaxPendingBytes: tc.maxPending, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, CommitInterval: time.Millisecond}
			stop := runPartitionWorker(t, w)
			defer stop()
			eventually(t, "partitions 0 and 2 to get their batches", func() bool {
				return len(sink.deliveredTo(0)) == perAgent && len(sink.deliveredTo(2)) == perAgent
			})
			// Partition 1's first batch is entry 1: the position stays at 1.
			time.Sleep(20 * time.Millisecond)
			if got := r.Committed().Index; got != 1 {
				t.Fatalf("committed index %d with partition 1 failing, want 1", got)
			}
			if f := testutil.ToFloat64(m.partitionFailing.WithLabelValues("k", "1")); f != 1 {
				t.Fatalf("failing gauge of partition 1 = %v", f)
			}
			if b := testutil.ToFloat64(m.partitionBehind.WithLabelValues("k", "1")); b != tc.wantBehind {
				t.Fatalf("behind gauge of partition 1 = %v, want %v", b, tc.wantBehind)
			}
			if u := testutil.ToFloat64(m.partitionUnconfirmed.WithLabelValues("k", "1")); u < 1 {
				t.Fatalf("unconfirmed records of partition 1 = %v", u)
			}
			// More batches while it fails: the others keep taking them.
			appendBatches(t, sp, 3, perAgent, 2*perAgent, 100)
			eventually(t, "partitions 0 and 2 to get the new batches", func() bool {
				return len(sink.deliveredTo(0)) == 2*perAgent && len(sink.deliveredTo(2)) == 2*perAgent
			})
			sink.setDown(1, false)
			eventually(t, "partition 1 to catch up", func() bool { return len(sink.deliveredTo(1)) == 2*perAgent })
			eventually(t, "the position to reach the end", func() bool { return r.Committed().Index == 6*perAgent })
			for p := range 3 {
				if got := seqsOf(sink.deliveredTo(p), fmt.Sprintf("p%d", p)); !slices.Equal(got, upTo(2*perAgent)) {
					t.Fatalf("partition %d got seqs %v, want 0…%d once each in order", p, got, 2*perAgent-1)
				}
			}
			if f := testutil.ToFloat64(m.partitionFailing.WithLabelValues("k", "1")); f != 0 {
				t.Fatalf("failing gauge of partition 1 = %v after it recovered", f)
			}
			if b := testutil.ToFloat64(m.partitionBehind.WithLabelValues("k", "1")); b != 0 {
				t.Fatalf("behind gauge of partition 1 = %v after it caught up", b)
			}
			if n := testutil.ToFloat64(m.records.WithLabelValues("k")); n != 6*perAgent {
				t.Fatalf("delivered records = %v, want %d", n, 6*perAgent)
			}
		})
	}
}

// rereadCounter counts the reads of a PartitionReader that read the spool
// again.
type rereadCounter struct {
	PartitionReader
	mu    sync.Mutex
	reads int
}

func (c *rereadCounter) ReadFrom(p spool.Position, maxEntries int, maxBytes int64) ([]spool.Entry, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.PartitionReader.ReadFrom(p, maxEntries, maxBytes)
}

// TestPartitionWorkerWaitsForSlowPartitions: partitions that are only
// slower than the spool fills (every delivery takes a while) are waited
// for rather than let go of: no partition falls behind and the spool is
// read once, not again by each partition for its batches.
func TestPartitionWorkerWaitsForSlowPartitions(t *testing.T) {
	const perAgent = 40
	_, r := spoolOf(t, 3, perAgent, 100)
	reader := &rereadCounter{PartitionReader: r}
	sink := newPartSink(3)
	sink.delay = 2 * time.Millisecond
	m := NewMetrics(prometheus.NewRegistry())
	w := &PartitionWorker{Name: "k", Log: quiet, Sink: sink, Reader: reader, Metrics: m, MaxBatches: 4, MaxBytes: 600,
		MaxPendingBytes: 1200, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, CommitInterval: time.Millisecond}
	stop := runPartitionWorker(t, w)
	defer stop()
	behind := 0.0
	eventually(t, "every batch", func() bool {
		for p := range 3 {
			behind = max(behind, testutil.ToFloat64(m.partitionBehind.WithLabelValues("k", strconv.Itoa(p))))
		}
		return r.Committed().Index == 3*perAgent
	})
	for p := range 3 {
		if got := seqsOf(sink.deliveredTo(p), fmt.Sprintf("p%d", p)); !slices.Equal(got, upTo(perAgent)) {
			t.Fatalf("partition %d got seqs %v, want 0…%d once each in order", p, got, perAgent-1)
		}
	}
	reader.mu.Lock()
	defer reader.mu.Unlock()
	if behind != 0 || reader.reads != 0 {
		t.Fatalf("a partition fell behind (gauge %v) and the spool was read again %d times, with every partition delivering", behind, reader.reads)
	}
}

// TestPartitionWorkerSetsAsideRejectedRecords: a record the sink refuses
// for good goes to the dead letters; its partition goes on.
func TestPartitionWorkerSetsAsideRejectedRecords(t *testing.T) {
	sp, r := spoolOf(t, 2, 3, 10)
	bad := &accesslog.Batch{EnvironmentID: "env", ProfileID: "1", Format: accesslog.FormatJSON, AgentID: "p0", Datestamp: "20261123", SeqNum: 3,
		Records: []json.RawMessage{json.RawMessage(`{"a":"good"}`), json.RawMessage(`{"a":"bad"}`)}}
	if err := sp.Append(context.Background(), accesslog.Marshal(bad)); err != nil {
		t.Fatal(err)
	}
	appendBatches(t, sp, 2, 4, 6, 10)
	sink := newPartSink(2)
	dead := &memDeadLetters{}
	w := &PartitionWorker{Name: "k", Log: quiet, Sink: sink, Reader: r, DeadLetters: dead, Metrics: NewMetrics(prometheus.NewRegistry()),
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, CommitInterval: time.Millisecond}
	stop := runPartitionWorker(t, w)
	defer stop()
	eventually(t, "every batch", func() bool { return r.Committed().Index == 11 })
	if got := seqsOf(sink.deliveredTo(0), "p0"); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5}) {
		t.Fatalf("partition 0 got %v", got)
	}
	dead.mu.Lock()
	defer dead.mu.Unlock()
	if len(dead.got) != 1 || string(dead.got[0].Batch.Records[0]) != `{"a":"bad"}` || dead.got[0].Batch.RecordIndex(0) != 1 {
		t.Fatalf("dead letters %+v, want the bad record alone", dead.got)
	}
}

// TestPartitionWorkerFollowsNewPartitions: when the sink reports more
// partitions, the worker delivers what it read, then starts again with the
// new count from the committed position: nothing lost, nothing twice.
func TestPartitionWorkerFollowsNewPartitions(t *testing.T) {
	sp, r := spoolOf(t, 3, 10, 10)
	sink := newPartSink(2)
	w := &PartitionWorker{Name: "k", Log: quiet, Sink: sink, Reader: r, Metrics: NewMetrics(prometheus.NewRegistry()),
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, CommitInterval: time.Millisecond, PartitionsInterval: 10 * time.Millisecond}
	stop := runPartitionWorker(t, w)
	defer stop()
	eventually(t, "the first batches", func() bool { return r.Committed().Index == 30 })
	sink.mu.Lock()
	sink.n = 3
	sink.mu.Unlock()
	time.Sleep(100 * time.Millisecond)
	appendBatches(t, sp, 3, 10, 20, 10)
	eventually(t, "the new batches", func() bool { return r.Committed().Index == 60 })
	// p2 went to partition 0 of 2, then to partition 2 of 3.
	if got := seqsOf(sink.deliveredTo(0), "p2"); !slices.Equal(got, upTo(10)) {
		t.Fatalf("p2 in partition 0: %v", got)
	}
	if got := seqsOf(sink.deliveredTo(2), "p2"); !slices.Equal(got, []int{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}) {
		t.Fatalf("p2 in partition 2: %v", got)
	}
	for _, a := range []string{"p0", "p1"} {
		if got := seqsOf(slices.Concat(sink.deliveredTo(0), sink.deliveredTo(1)), a); !slices.Equal(got, upTo(20)) {
			t.Fatalf("%s: %v", a, got)
		}
	}
}

var quiet = slog.New(slog.DiscardHandler)

// TestPartitionWorkerRestartSendsOnlyWhatAPartitionLacks: with partition 1
// down, the spool position stays before its first batch while partitions 0
// and 2 deliver everything. After a restart (the partition back), partition
// 1 gets its batches and, thanks to the marks file, partitions 0 and 2 get
// none of theirs again; without it they would.
func TestPartitionWorkerRestartSendsOnlyWhatAPartitionLacks(t *testing.T) {
	for _, withMarks := range []bool{true, false} {
		t.Run(fmt.Sprintf("marks=%v", withMarks), func(t *testing.T) {
			const perAgent = 20
			dir := t.TempDir()
			sp, err := spool.Open(spool.Options{Dir: dir, Readers: []string{"k"}})
			if err != nil {
				t.Fatal(err)
			}
			appendBatches(t, sp, 3, 0, perAgent, 10)
			sink := newPartSink(3)
			sink.setDown(1, true)
			marks := ""
			if withMarks {
				marks = filepath.Join(dir, "partitions-k.state")
			}
			worker := func(r *spool.Reader) *PartitionWorker {
				return &PartitionWorker{Name: "k", Log: quiet, Sink: sink, Reader: r, Metrics: NewMetrics(prometheus.NewRegistry()), MarksFile: marks,
					MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, CommitInterval: time.Millisecond}
			}
			r, _ := sp.Reader("k")
			stop := runPartitionWorker(t, worker(r))
			eventually(t, "partitions 0 and 2", func() bool {
				return len(sink.deliveredTo(0)) == perAgent && len(sink.deliveredTo(2)) == perAgent
			})
			time.Sleep(20 * time.Millisecond) // a commit and marks save
			stop()
			if err := sp.Close(); err != nil {
				t.Fatal(err)
			}
			if sp, err = spool.Open(spool.Options{Dir: dir, Readers: []string{"k"}}); err != nil {
				t.Fatal(err)
			}
			defer sp.Close()
			if got := func() uint64 { r, _ := sp.Reader("k"); return r.Committed().Index }(); got != 1 {
				t.Fatalf("committed index %d after the restart, want 1", got)
			}
			sink.setDown(1, false)
			r, _ = sp.Reader("k")
			stop = runPartitionWorker(t, worker(r))
			defer stop()
			eventually(t, "everything", func() bool { return r.Committed().Index == 3*perAgent })
			if got := seqsOf(sink.deliveredTo(1), "p1"); !slices.Equal(got, upTo(perAgent)) {
				t.Fatalf("partition 1 got %v", got)
			}
			for _, p := range []int{0, 2} {
				got := seqsOf(sink.deliveredTo(p), fmt.Sprintf("p%d", p))
				want := upTo(perAgent)
				if !withMarks {
					want = append(want, upTo(perAgent)[1:]...) // all but seq 0 of p0 (before the position) again
					if p == 2 {
						want = append(upTo(perAgent), upTo(perAgent)...)
					}
				}
				if !slices.Equal(got, want) {
					t.Fatalf("partition %d got %v, want %v", p, got, want)
				}
			}
		})
	}
}

// TestPartitionWorkerStopLetsRequestsFinish: a delivery in flight when the
// worker is stopped completes and is committed, rather than being cut off
// and sent again after the restart.
func TestPartitionWorkerStopLetsRequestsFinish(t *testing.T) {
	_, r := spoolOf(t, 1, 1, 10)
	sink := newPartSink(1)
	sink.entered, sink.hold = make(chan struct{}), make(chan struct{})
	w := &PartitionWorker{Name: "k", Log: quiet, Sink: sink, Reader: r, Metrics: NewMetrics(prometheus.NewRegistry()),
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, CommitInterval: time.Hour}
	stop := runPartitionWorker(t, w)
	<-sink.entered
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	time.Sleep(20 * time.Millisecond)
	close(sink.hold)
	<-stopped
	if got := sink.deliveredTo(0); len(got) != 1 {
		t.Fatalf("delivered %v, want the batch in flight", got)
	}
	if got := r.Committed().Index; got != 1 {
		t.Fatalf("committed index %d after the stop, want 1", got)
	}
}
