package delivery

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// busyFor reports ingest saturated until it has been asked n times, then
// idle; calls counts the questions.
type busyFor struct {
	n     int64
	calls atomic.Int64
}

func (b *busyFor) busy() float64 {
	if b.calls.Add(1) <= b.n {
		return 1
	}
	return 0
}

func TestYielder(t *testing.T) {
	const never = 1 << 62
	tests := []struct {
		name     string
		busyN    int64         // questions answered "saturated"; never: always
		nilBusy  bool          // no IngestBusy at all
		maxDefer time.Duration // of the yielder
		age      time.Duration // of the oldest batch when wait starts
		cancel   time.Duration // ctx ends this long after wait starts; 0: never
		want     bool
		// waitAtLeast and waitAtMost bound how long wait holds the batch
		// (the upper bound only catches a wait that does not end).
		waitAtLeast, waitAtMost time.Duration
		deferred                bool // edgepipe_rtld_sink_deferred_seconds_total grows
		asked                   bool // IngestBusy is consulted
	}{
		{name: "idle ingest: no wait", busyN: 0, maxDefer: time.Hour, want: true,
			waitAtMost: time.Second, asked: true},
		{name: "saturated, then idle: waits until idle", busyN: 5, maxDefer: time.Hour, want: true,
			waitAtLeast: 4 * yieldPoll, waitAtMost: 30 * time.Second, deferred: true, asked: true},
		{name: "always saturated: waits up to MaxDefer after spooling", busyN: never, maxDefer: 300 * time.Millisecond,
			age: 100 * time.Millisecond, want: true, waitAtLeast: 200 * time.Millisecond, waitAtMost: 30 * time.Second,
			deferred: true, asked: true},
		{name: "spooled MaxDefer ago: no wait", busyN: never, maxDefer: 300 * time.Millisecond,
			age: 300 * time.Millisecond, want: true, waitAtMost: time.Second},
		{name: "negative MaxDefer: never waits", busyN: never, maxDefer: -1, want: true, waitAtMost: time.Second},
		{name: "no IngestBusy: never waits", nilBusy: true, maxDefer: time.Hour, want: true, waitAtMost: time.Second},
		{name: "ctx ends while waiting", busyN: never, maxDefer: time.Hour, cancel: 50 * time.Millisecond,
			want: false, waitAtLeast: 50 * time.Millisecond, waitAtMost: 30 * time.Second, deferred: true, asked: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMetrics(prometheus.NewRegistry())
			b := &busyFor{n: tt.busyN}
			y := yielder{busy: b.busy, maxDefer: tt.maxDefer, sink: "s", metrics: m}
			if tt.nilBusy {
				y.busy = nil
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel > 0 {
				time.AfterFunc(tt.cancel, cancel)
			}
			start := time.Now()
			got := y.wait(ctx, start.Add(-tt.age))
			took := time.Since(start)
			if got != tt.want {
				t.Errorf("wait = %v, want %v", got, tt.want)
			}
			if took < tt.waitAtLeast || took > tt.waitAtMost {
				t.Errorf("wait held the batch %v, want %v to %v", took, tt.waitAtLeast, tt.waitAtMost)
			}
			deferred := testutil.ToFloat64(m.deferred.WithLabelValues("s"))
			if (deferred > 0) != tt.deferred {
				t.Errorf("deferred seconds = %v, want counted: %v", deferred, tt.deferred)
			}
			if asked := b.calls.Load() > 0; asked != tt.asked {
				t.Errorf("IngestBusy consulted: %v, want %v", asked, tt.asked)
			}
		})
	}
}

// TestWorkersDeliverUnderSaturatedIngest: with ingest saturated all the
// time, both kinds of worker hold their batches back and still deliver
// every one (MaxDefer after it was spooled), in order, once.
func TestWorkersDeliverUnderSaturatedIngest(t *testing.T) {
	const perAgent = 20
	saturated := func() float64 { return 1 }
	const maxDefer = 100 * time.Millisecond

	t.Run("Worker", func(t *testing.T) {
		_, r := spoolOf(t, 2, perAgent, 10)
		sink := &flakySink{}
		m := NewMetrics(prometheus.NewRegistry())
		w := &Worker{Name: "k", Sink: sink, Reader: r, Metrics: m, MaxBatches: 4,
			MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, IngestBusy: saturated, MaxDefer: maxDefer}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		eventually(t, "every batch", func() bool { return r.Committed().Index == 2*perAgent })
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := sink.count(); n != 2*perAgent {
			t.Fatalf("delivered %d records, want %d", n, 2*perAgent)
		}
		if d := testutil.ToFloat64(m.deferred.WithLabelValues("k")); d <= 0 {
			t.Fatalf("deferred seconds %v, want the worker to have waited", d)
		}
	})

	t.Run("PartitionWorker", func(t *testing.T) {
		_, r := spoolOf(t, 3, perAgent, 10)
		sink := newPartSink(3)
		m := NewMetrics(prometheus.NewRegistry())
		w := &PartitionWorker{Name: "k", Log: quiet, Sink: sink, Reader: r, Metrics: m, MaxBatches: 4,
			MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, CommitInterval: time.Millisecond,
			IngestBusy: saturated, MaxDefer: maxDefer}
		stop := runPartitionWorker(t, w)
		defer stop()
		eventually(t, "every batch", func() bool { return r.Committed().Index == 3*perAgent })
		for p := range 3 {
			if got := seqsOf(sink.deliveredTo(p), fmt.Sprintf("p%d", p)); !slices.Equal(got, upTo(perAgent)) {
				t.Fatalf("partition %d got seqs %v, want 0…%d once each in order", p, got, perAgent-1)
			}
		}
		if d := testutil.ToFloat64(m.deferred.WithLabelValues("k")); d <= 0 {
			t.Fatalf("deferred seconds %v, want the worker to have waited", d)
		}
	})
}
