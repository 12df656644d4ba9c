package delivery

import (
	"context"
	"encoding/json"
	"errors"
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

func (f *flakySink) Deliver(ctx context.Context, bs []*accesslog.Batch) error {
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
