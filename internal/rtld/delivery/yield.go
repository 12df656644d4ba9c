package delivery

import (
	"context"
	"time"
)

// Ingest goes first while it is saturated: the platform waits for every
// answer and resends what is not answered in time, while the sinks only
// see their records a little later. A worker whose IngestBusy reports more
// than SaturatedBusy holds back the batches it has just read (before
// converting or sending them) until ingest is below it again, but never
// longer than MaxDefer after the oldest of them was spooled. The bound
// keeps the precedence from starving delivery: under a sustained overload
// the sinks run at most MaxDefer behind plus what they cannot keep up
// with, as without it; a burst shorter than MaxDefer is accepted at the
// rate of ingest alone and delivered after it.
const (
	// DefaultMaxDefer is the default of Worker.MaxDefer and
	// PartitionWorker.MaxDefer.
	DefaultMaxDefer = 5 * time.Second
	// SaturatedBusy is the IngestBusy value above which ingest is
	// saturated (busy with some batch 90% of the recent past).
	SaturatedBusy = 0.9
	// yieldPoll is how often a holding worker looks at IngestBusy again.
	yieldPoll = 20 * time.Millisecond
)

// yielder holds a worker's batches back while ingest is saturated.
type yielder struct {
	busy     func() float64 // nil: never
	maxDefer time.Duration
	sink     string
	metrics  *Metrics
}

// wait waits while ingest is saturated, at most until oldest+maxDefer; it
// returns false when ctx ended.
func (y yielder) wait(ctx context.Context, oldest time.Time) bool {
	if y.busy == nil || y.maxDefer <= 0 {
		return true
	}
	deadline := oldest.Add(y.maxDefer)
	var start time.Time
	defer func() {
		if !start.IsZero() {
			y.metrics.deferred.WithLabelValues(y.sink).Add(time.Since(start).Seconds())
		}
	}()
	for {
		left := time.Until(deadline)
		if left <= 0 || y.busy() <= SaturatedBusy {
			return true
		}
		if start.IsZero() {
			start = time.Now()
		}
		if !sleep(ctx, min(left, yieldPoll)) {
			return false
		}
	}
}
