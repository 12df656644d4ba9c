package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	entries := make(chan []spool.Entry)
	readErr := make(chan error, 1)
	readCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			es, err := rd.Next(readCtx, 256, 16<<20)
			if err != nil {
				readErr <- err
				return
			}
			select {
			case entries <- es:
			case <-readCtx.Done():
				readErr <- readCtx.Err()
				return
			}
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	tick := time.NewTicker(saveInterval)
	defer tick.Stop()
	var last *spool.Position
	persist := func() error {
		saved, err := r.store.save()
		if err != nil {
			return err
		}
		if last != nil && last.Index <= saved {
			if err := rd.Commit(*last); err != nil {
				return fmt.Errorf("committing the reconcile reader: %w", err)
			}
			last = nil
		}
		return nil
	}
	for {
		select {
		case es := <-entries:
			for _, e := range es {
				r.countEntry(e)
				p := e.Next
				last = &p
			}
		case <-tick.C:
			if err := persist(); err != nil {
				r.log.Error("reconcile: saving the record counts", "err", err)
			}
		case err := <-readErr:
			if ctx.Err() != nil || errors.Is(err, spool.ErrClosed) {
				if perr := persist(); perr != nil {
					r.log.Error("reconcile: saving the record counts", "err", perr)
				}
				return nil
			}
			return fmt.Errorf("reconcile: reading the spool: %w", err)
		}
	}
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
