package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

// SpoolReaderName is the spool reader that counts records (spool counts):
// like a sink, it holds a spool segment until its counts are saved.
const SpoolReaderName = "reconcile"

// SpoolReader is what the counter needs of its spool cursor.
type SpoolReader interface {
	Next(ctx context.Context, maxEntries int, maxBytes int64) ([]spool.Entry, error)
	Commit(p spool.Position) error
	Committed() spool.Position
}

// Spool is what the reconciliation needs of the spool itself.
type Spool interface {
	Stats() spool.Stats
	OldestPending(reader string) (time.Time, bool)
}

// saveInterval is how often the counts are saved and the reader commits.
const saveInterval = 5 * time.Second

// countSpool counts every spooled batch into the store until ctx ends,
// saving the state (then committing the reader) every saveInterval and at
// the end.
func (r *Reconciler) countSpool(ctx context.Context, rd SpoolReader) error {
	c := &spoolCounter{r: r, rd: rd}
	next := func(ctx context.Context) ([]spool.Entry, error) { return rd.Next(ctx, 256, 16<<20) }
	if err := spool.Follow(ctx, next, saveInterval, c.count, c.save); err != nil {
		return fmt.Errorf("reconcile: reading the spool: %w", err)
	}
	return nil
}

// spoolCounter counts the entries of the reconcile reader rd.
type spoolCounter struct {
	r    *Reconciler
	rd   SpoolReader
	last *spool.Position // after the last entry counted, until committed
}

// count counts the entries es.
func (c *spoolCounter) count(es []spool.Entry) {
	for _, e := range es {
		c.r.countEntry(e)
		p := e.Next
		c.last = &p
	}
}

// save saves the counts, then commits the reader up to what they cover,
// logging a failure (the next save tries again).
func (c *spoolCounter) save() {
	if err := c.persist(); err != nil {
		c.r.log.Error("reconcile: saving the record counts", "err", err)
	}
}

func (c *spoolCounter) persist() error {
	saved, err := c.r.store.save()
	if err != nil {
		return err
	}
	if c.last != nil && c.last.Index <= saved {
		if err := c.rd.Commit(*c.last); err != nil {
			return fmt.Errorf("committing the reconcile reader: %w", err)
		}
		c.last = nil
	}
	return nil
}

// countEntry counts one spool entry.
func (r *Reconciler) countEntry(e spool.Entry) {
	b, err := accesslog.Unmarshal(e.Data)
	if err != nil {
		r.store.skipIndex(e.Index)
		r.log.Error("reconcile: unreadable spool entry; the buckets before it are not compared", "index", e.Index, "err", err)
		r.loseBefore(e.Time)
		return
	}
	if _, gap := r.store.countBatch(e.Index, b, e.Time); gap {
		r.log.Error("reconcile: spool entries were skipped as damaged; the buckets before them are not compared", "index", e.Index)
		r.loseBefore(e.Time)
	}
}

// loseMargin is added to a local time turned into the platform's when
// counts are lost: records of a batch appended at t carry timestamps
// before t, on a clock that may differ from this one.
const loseMargin = 5 * time.Minute

// loseBefore marks the buckets that began before the local time t as
// lost.
func (r *Reconciler) loseBefore(t time.Time) {
	skew, ok := r.cfg.Clock.Skew()
	if !ok {
		skew = time.Hour // not known yet: err on the safe side
	}
	r.store.markLost(t.Add(skew + loseMargin))
}

// spoolCaughtUp waits (up to wait) until the counter has counted every
// entry appended before it was called.
func (r *Reconciler) spoolCaughtUp(ctx context.Context, sp Spool, rd SpoolReader, wait time.Duration) bool {
	lag := sp.Stats().Readers[SpoolReaderName]
	end := rd.Committed().Index + lag.Entries // Committed read after Stats: at least the end then
	deadline := time.Now().Add(wait)
	for {
		r.store.mu.Lock()
		next := r.store.next
		r.store.mu.Unlock()
		if next >= end {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}
