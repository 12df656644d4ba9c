package delivery

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

// failingCommits is a spool reader whose first commits fail as on a broken
// disk.
type failingCommits struct {
	*spool.Reader
	mu   sync.Mutex
	fail int
}

func (f *failingCommits) Commit(p spool.Position) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		return syscall.ENOSPC
	}
	return f.Reader.Commit(p)
}

// TestWorkerRetriesAFailedCommitWithoutRedelivering: a cursor that cannot
// be written neither ends the worker nor sends the group again.
func TestWorkerRetriesAFailedCommitWithoutRedelivering(t *testing.T) {
	sp, err := spool.Open(spool.Options{Dir: t.TempDir(), Readers: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	for i := 0; i < 6; i++ {
		if err := sp.Append(context.Background(), accesslog.Marshal(idBatch("a", "20261123", int64(i)))); err != nil {
			t.Fatal(err)
		}
	}
	r, _ := sp.Reader("x")
	reader := &failingCommits{Reader: r, fail: 4}
	sink := &flakySink{}
	w := &Worker{Name: "x", Sink: sink, Reader: reader, Metrics: NewMetrics(prometheus.NewRegistry()),
		MaxBatches: 3, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for r.Committed().Index < 6 {
		select {
		case err := <-done:
			t.Fatalf("worker ended on a failed commit: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("committed %d of 6", r.Committed().Index)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if n := sink.count(); n != 6 {
		t.Fatalf("sink got %d records for 6 batches: a failed commit made the worker deliver again", n)
	}
}
