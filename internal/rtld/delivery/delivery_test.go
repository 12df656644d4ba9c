package delivery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

func idBatch(agent, day string, seq int64) *accesslog.Batch {
	return &accesslog.Batch{EnvironmentID: "env", ProfileID: "1", Format: accesslog.FormatJSON, AgentID: agent, Datestamp: day, SeqNum: seq,
		Records: []json.RawMessage{json.RawMessage(`{}`)}}
}

type flakySink struct {
	mu      sync.Mutex
	fail    int
	records []string
}

func (f *flakySink) Deliver(_ context.Context, bs []*accesslog.Batch) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		return errors.New("sink down")
	}
	for _, b := range bs {
		for _, r := range b.Records {
			f.records = append(f.records, string(r))
		}
	}
	return nil
}

func (f *flakySink) count() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.records) }

func TestWorkerRetriesAndCommitsOnlyAfterAck(t *testing.T) {
	dir := t.TempDir()
	sp, err := spool.Open(spool.Options{Dir: dir, Readers: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	for i := 0; i < 10; i++ {
		b := idBatch("a", "20261123", int64(i))
		if err := sp.Append(context.Background(), accesslog.Marshal(b)); err != nil {
			t.Fatal(err)
		}
	}
	r, _ := sp.Reader("x")
	sink := &flakySink{fail: 3}
	m := NewMetrics(prometheus.NewRegistry())
	w := &Worker{Name: "x", Sink: sink, Reader: r, Metrics: m, MaxBatches: 4, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for sink.count() < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("delivered %d of 10", sink.count())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if e := testutil.ToFloat64(m.errors.WithLabelValues("x")); e != 3 {
		t.Fatalf("errors = %v", e)
	}
	if got := r.Committed().Index; got != 10 {
		t.Fatalf("committed index %d, want 10", got)
	}
}

// pickySink refuses every record whose JSON contains "bad". Like an INSERT
// or a produce request, it cannot tell which record was at fault unless
// exact is set: it then names each bad record on its own.
type pickySink struct {
	mu         sync.Mutex
	exact      bool
	transient  int // fail this many attempts first, joined with the rejection
	deliveries int
	records    map[string]int // delivered record → times
}

func (p *pickySink) Deliver(_ context.Context, bs []*accesslog.Batch) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deliveries++
	var bad []RecordRef
	for i, b := range bs {
		for j, r := range b.Records {
			if strings.Contains(string(r), "bad") {
				bad = append(bad, RecordRef{Batch: i, Record: j})
			}
		}
	}
	if len(bad) == 0 {
		for _, b := range bs {
			for _, r := range b.Records {
				p.records[string(r)]++
			}
		}
		return nil
	}
	if p.exact {
		// Everything else is acknowledged.
		for i, b := range bs {
			for j, r := range b.Records {
				if !slices.Contains(bad, RecordRef{Batch: i, Record: j}) {
					p.records[string(r)]++
				}
			}
		}
		rej := &RejectedError{Records: bad, Each: true, Reason: "too_bad", Err: errors.New("record is bad")}
		if p.transient > 0 {
			p.transient--
			return errors.Join(rej, errors.New("broker timeout"))
		}
		return rej
	}
	return &RejectedError{Reason: "too_bad", Err: errors.New("insert refused: a bad row")}
}

type memoryDeadLetters struct {
	mu       sync.Mutex
	failures int
	letters  []Rejection
}

func (m *memoryDeadLetters) Add(_ string, rejected []Rejection) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failures > 0 {
		m.failures--
		return errors.New("disk full")
	}
	m.letters = append(m.letters, rejected...)
	return nil
}

func TestWorkerSetsAsideRejectedRecordsAndMovesOn(t *testing.T) {
	const batches, perBatch = 12, 40
	bad := map[[2]int]bool{{3, 17}: true, {3, 18}: true, {9, 0}: true}
	for _, tc := range []struct {
		name          string
		sink          *pickySink
		maxDeliveries int
	}{
		// 3 bad records among 480 in groups of 5 batches: each split costs
		// about 2·log2(n) deliveries.
		{"inexact rejections are split", &pickySink{}, 80},
		{"exact rejections, after a transient failure", &pickySink{exact: true, transient: 2}, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.sink.records = map[string]int{}
			sp, err := spool.Open(spool.Options{Dir: t.TempDir(), Readers: []string{"x"}})
			if err != nil {
				t.Fatal(err)
			}
			defer sp.Close()
			for i := 0; i < batches; i++ {
				b := idBatch("a", "20261123", int64(i))
				b.Records = nil
				for j := 0; j < perBatch; j++ {
					word := "good"
					if bad[[2]int{i, j}] {
						word = "bad"
					}
					b.Records = append(b.Records, json.RawMessage(fmt.Sprintf(`{"r":"%s-%d-%d"}`, word, i, j)))
				}
				if err := sp.Append(context.Background(), accesslog.Marshal(b)); err != nil {
					t.Fatal(err)
				}
			}
			r, _ := sp.Reader("x")
			dl := &memoryDeadLetters{failures: 1}
			m := NewMetrics(prometheus.NewRegistry())
			w := &Worker{Name: "x", Sink: tc.sink, Reader: r, DeadLetters: dl, Metrics: m, MaxBatches: 5,
				MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- w.Run(ctx) }()
			deadline := time.Now().Add(10 * time.Second)
			for r.Committed().Index < batches {
				if time.Now().After(deadline) {
					t.Fatalf("committed %d of %d batches", r.Committed().Index, batches)
				}
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := len(tc.sink.records); got != batches*perBatch-len(bad) {
				t.Errorf("%d records delivered, want every good one (%d)", got, batches*perBatch-len(bad))
			}
			for rec := range tc.sink.records {
				if strings.Contains(rec, "bad") {
					t.Errorf("bad record %s delivered", rec)
				}
			}
			if len(dl.letters) != len(bad) {
				t.Fatalf("%d dead letters, want %d", len(dl.letters), len(bad))
			}
			for _, l := range dl.letters {
				b := l.Batch
				want := fmt.Sprintf(`{"r":"bad-%d-%d"}`, b.SeqNum, b.RecordIndex(0))
				if len(b.Records) != 1 || string(b.Records[0]) != want || b.AgentID != "a" || l.Reason != "too_bad" || l.Err == nil {
					t.Errorf("dead letter %q (seq %d, index %d, reason %q): identity lost, want %s", b.Records, b.SeqNum, b.RecordIndex(0), l.Reason, want)
				}
			}
			if tc.sink.deliveries > tc.maxDeliveries {
				t.Errorf("%d deliveries to find %d bad records, want at most %d", tc.sink.deliveries, len(bad), tc.maxDeliveries)
			}
			if n := testutil.ToFloat64(m.records.WithLabelValues("x")); int(n) != batches*perBatch-len(bad) {
				t.Errorf("delivered records metric %v", n)
			}
			t.Logf("%d deliveries", tc.sink.deliveries)
		})
	}
}

func TestRejections(t *testing.T) {
	a := &RejectedError{Reason: "a"}
	b := &RejectedError{Reason: "b"}
	for _, tc := range []struct {
		name string
		err  error
		want int // -1: not a rejection
	}{
		{"nil", nil, -1},
		{"plain error", errors.New("timeout"), -1},
		{"one", a, 1},
		{"wrapped", fmt.Errorf("kafka: %w", a), 1},
		{"joined", errors.Join(a, b), 2},
		{"joined with a failure", errors.Join(a, errors.New("timeout")), -1},
		{"wrapped join", fmt.Errorf("x: %w", errors.Join(a, fmt.Errorf("y: %w", b))), 2},
	} {
		got := rejections(tc.err)
		if (got == nil && tc.want != -1) || (got != nil && len(got) != tc.want) {
			t.Errorf("%s: %d rejections, want %d", tc.name, len(got), tc.want)
		}
	}
}
