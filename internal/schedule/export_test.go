package schedule

import (
	"context"
	"time"
)

// RestartLoop stops the poll loop of dataset and starts it again with the
// same descriptor, as a changed descriptor does at discovery; the Tracker
// keeps the loop's state, so the restarted loop neither skips nor repeats a
// bucket. It returns false when no such loop runs.
func (s *Scheduler) RestartLoop(ctx context.Context, dataset string) bool {
	s.loopsMu.Lock()
	defer s.loopsMu.Unlock()
	l, ok := s.loops[dataset]
	if !ok {
		return false
	}
	l.cancel()
	<-l.done
	s.startLoopLocked(ctx, l.ds)
	return true
}

// HighWaterMark returns the end of the newest bucket range of dataset
// fetched successfully for env, and false when none was.
func (t *Tracker) HighWaterMark(dataset, env string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.datasets[dataset]
	if d == nil {
		return time.Time{}, false
	}
	h, ok := d.hwm[env]
	return h, ok
}

// Buckets returns how many (series, bucket) entries the tracker holds for
// dataset: the memory the settle window costs.
func (t *Tracker) Buckets(dataset string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.datasets[dataset]
	if d == nil {
		return 0
	}
	n := 0
	for _, s := range d.series {
		n += len(s.buckets)
	}
	return n
}

// Series returns how many series of dataset the tracker keeps totals for.
func (t *Tracker) Series(dataset string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d := t.datasets[dataset]; d != nil {
		return len(d.series)
	}
	return 0
}
