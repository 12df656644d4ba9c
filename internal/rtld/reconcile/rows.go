package reconcile

import (
	"context"
	"time"
)

// maxRowsPerWrite bounds one INSERT into log_completeness.
const maxRowsPerWrite = 10_000

// storeRows writes the rows of compared buckets the table does not hold
// as published yet (new, or with late records added), oldest first; what
// fails is written at a later tick.
func (r *Reconciler) storeRows(ctx context.Context, now time.Time) {
	s := r.store
	s.mu.Lock()
	var rows []completenessRow
	for env, e := range s.envs {
		for start, b := range e.buckets {
			if b.Decision == compared && !b.Stored && len(rows) < maxRowsPerWrite {
				rows = append(rows, completenessRow{env: env, start: start, expected: b.Expected, records: b.Published,
					share: b.Share, at: max(now.Unix(), b.At+1)})
			}
		}
	}
	s.mu.Unlock()
	if len(rows) == 0 {
		return
	}
	if err := r.ch.writeRows(ctx, rows); err != nil {
		r.log.Warn("reconcile: writing log_completeness failed; retrying at the next comparison", "rows", len(rows), "err", err)
		return
	}
	s.mu.Lock()
	for _, row := range rows {
		if b := s.envs[row.env].buckets[row.start]; b != nil {
			b.At = row.at
			b.Stored = b.Published == row.records // late records meanwhile: write again
		}
	}
	s.mu.Unlock()
	if _, err := s.save(); err != nil {
		r.log.Error("reconcile: saving the state", "err", err)
	}
}

// progressEvery is how often a replica reports its delivery progress
// (ClickHouse counts).
const progressEvery = 10 * time.Second

// reportProgress writes this replica's delivery progress to ClickHouse
// every progressEvery (sooner with a shorter Interval) until ctx ends, and
// once more then, marked stopped.
func (r *Reconciler) reportProgress(ctx context.Context, sp Spool) error {
	every := max(min(progressEvery, r.cfg.Interval), time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := r.reportOnce(sctx, sp, true); err != nil {
				r.log.Warn("reconcile: reporting the final delivery progress to ClickHouse failed", "err", err)
			}
			return nil
		case <-t.C:
			if err := r.reportOnce(ctx, sp, false); err != nil && ctx.Err() == nil {
				r.log.Warn("reconcile: reporting the delivery progress to ClickHouse failed", "err", err)
			}
		}
	}
}

// reportOnce reports the time before which every record this replica
// accepted is in ClickHouse: now, or the append time of the oldest spool
// entry its ClickHouse sink has not committed.
func (r *Reconciler) reportOnce(ctx context.Context, sp Spool, stopped bool) error {
	skew, ok := r.cfg.Clock.Skew()
	if !ok {
		return nil // the platform's time is not known yet
	}
	local := time.Now()
	through := local
	if oldest, pending := sp.OldestPending(r.cfg.ClickHouse.Reader); pending && oldest.Before(through) {
		through = oldest
	}
	return r.ch.report(ctx, through.Add(skew), local.Add(skew), stopped)
}
