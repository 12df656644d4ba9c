// Package delivery moves spooled access-log batches into the receiver's
// sinks (Kafka, ClickHouse) with end-to-end acknowledgement: one worker per
// sink reads the spool from the sink's own cursor and commits the cursor only
// after the sink acknowledged. A Worker delivers group after group (the
// ClickHouse sink); a PartitionWorker delivers every partition of a
// Partitioned sink on its own (the Kafka sink). Sinks implement the small
// contract defined here (Sink, and optionally Preparer or Partitioned); they
// never import the HTTP ingest.
//
// The contract has three outcomes (Vector's delivered / errored / rejected):
// Deliver returns nil when every record was acknowledged; a *RejectedError
// when the sink refuses some records for good (every other record was
// acknowledged); any other error when the delivery failed for now. The
// worker retries failures with backoff, finds the refused records by
// splitting (rejection.go), sets them aside in a DeadLetters store and moves
// on, so that no record can stop the pipeline.
package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

// Sink is a destination of spooled batches (Kafka, ClickHouse). Deliver
// returns nil only once the sink has acknowledged every record of every
// batch, a *RejectedError (or several joined with errors.Join) when it
// refuses records for good and acknowledged all the others, and any other
// error when the delivery failed and is worth retrying. The worker delivers
// the same batches again after an error, so a sink must tolerate redelivery
// (ClickHouse collapses it, Kafka is at-least-once).
type Sink interface {
	Deliver(ctx context.Context, batches []*accesslog.Batch) error
}

// Worker moves spooled batches into one sink, in spool order, and commits
// its spool position only after the sink acknowledged them. While the sink
// fails it retries the same batches with exponential backoff, forever: the
// spool's size bound, not the worker, decides when ingest pushes back.
// Records the sink rejects for good go to DeadLetters, and the worker moves
// on.
type Worker struct {
	// Name is the sink's name: its spool reader and its metrics label.
	Name string
	// Sink receives the batches.
	Sink Sink
	// Reader is the sink's spool cursor.
	Reader SpoolReader
	// DeadLetters receives the records the sink rejects for good. Nil
	// drops them after logging them (for tests).
	DeadLetters DeadLetters
	// Metrics receive delivery counts and errors.
	Metrics *Metrics
	// Log receives delivery failures (default slog.Default()).
	Log *slog.Logger
	// MaxBatches and MaxBytes bound one delivery (defaults
	// DefaultMaxBatches and DefaultMaxBytes).
	MaxBatches int
	MaxBytes   int64
	// MinBackoff and MaxBackoff bound the retry delay (defaults
	// DefaultMinBackoff and DefaultMaxBackoff).
	MinBackoff, MaxBackoff time.Duration
	// IngestBusy, when set, reports how busy ingest is
	// (rtld.IngestLoad.Busy): while it is saturated, the worker holds the
	// batches it read back for up to MaxDefer after they were spooled
	// (see SaturatedBusy).
	IngestBusy func() float64
	// MaxDefer bounds that wait (default DefaultMaxDefer; negative: the
	// worker never waits).
	MaxDefer time.Duration
}

// Defaults of Worker and Deliverer.
const (
	DefaultMaxBatches = 256
	DefaultMaxBytes   = 16 << 20
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 30 * time.Second
)

// withDefaults returns w with every unset setting set to its default.
func (w Worker) withDefaults() Worker {
	if w.Log == nil {
		w.Log = slog.Default()
	}
	if w.MaxBatches == 0 {
		w.MaxBatches = DefaultMaxBatches
	}
	if w.MaxBytes == 0 {
		w.MaxBytes = DefaultMaxBytes
	}
	if w.MinBackoff == 0 {
		w.MinBackoff = DefaultMinBackoff
	}
	if w.MaxBackoff == 0 {
		w.MaxBackoff = DefaultMaxBackoff
	}
	if w.MaxDefer == 0 {
		w.MaxDefer = DefaultMaxDefer
	}
	return w
}

// validate reports every setting of w (with defaults applied) that cannot
// work.
func (w Worker) validate() error {
	var errs []error
	if w.Name == "" {
		errs = append(errs, errors.New("no name"))
	}
	if w.Reader == nil {
		errs = append(errs, errors.New("no spool reader"))
	}
	if w.Metrics == nil {
		errs = append(errs, errors.New("no metrics"))
	}
	if w.MaxBatches < 0 || w.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxBatches %d and MaxBytes %d: must be positive", w.MaxBatches, w.MaxBytes))
	}
	errs = append(errs, validateRetry(w.Sink, w.MinBackoff, w.MaxBackoff))
	return errors.Join(errs...)
}

// validateRetry checks the settings a Worker and a Deliverer share.
func validateRetry(sink Sink, minBackoff, maxBackoff time.Duration) error {
	var errs []error
	if sink == nil {
		errs = append(errs, errors.New("no sink"))
	}
	if minBackoff < 0 || maxBackoff < minBackoff {
		errs = append(errs, fmt.Errorf("backoff from %s to %s: want 0 < MinBackoff <= MaxBackoff", minBackoff, maxBackoff))
	}
	return errors.Join(errs...)
}

// Preparer is an optional extension of Sink: Prepare does a delivery's CPU
// work (converting records into the sink's wire form) without I/O, and the
// returned Prepared sends it, as often as the worker retries. A worker whose
// sink is a Preparer prepares the next group while the sink is still
// acknowledging the current one, so conversion and the sink's own work
// overlap instead of alternating.
type Preparer interface {
	Prepare(batches []*accesslog.Batch) Prepared
}

// Prepared is one prepared delivery; Deliver has Sink.Deliver's contract
// (record positions in a *RejectedError refer to the batches given to
// Prepare) and may be called again after an error.
type Prepared interface {
	Deliver(ctx context.Context) error
}

// SpoolReader is what a worker needs from its sink's spool cursor.
type SpoolReader interface {
	Next(ctx context.Context, maxEntries int, maxBytes int64) ([]spool.Entry, error)
	Commit(p spool.Position) error
}

// DeadLetters is where a worker sets aside the records its sink rejected
// for good. Add returns nil once they are durable, or once a full store has
// counted them as dropped; on error the worker retries Add with backoff
// before it commits its spool position.
type DeadLetters interface {
	Add(sink string, rejected []Rejection) error
}

// group is one read from the spool, decoded and prepared.
type group struct {
	entries  []spool.Entry
	batches  []*accesslog.Batch
	records  int
	prepared Prepared // nil when the sink is not a Preparer
}

// Run delivers until ctx ends; it returns nil then, an error if the spool
// fails, or one at once for an invalid Worker. Batches delivered but not yet committed when ctx ends are
// delivered again after a restart. Reading, decoding and preparing the next
// group runs in a second goroutine, one group ahead of delivery; Run stops
// and waits for it before returning.
func (w *Worker) Run(ctx context.Context) error {
	cfg := w.withDefaults()
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("%s worker: invalid configuration: %w", w.Name, err)
	}
	w = &cfg
	log := w.Log.With("sink", w.Name)

	readCtx, cancel := context.WithCancel(ctx)
	groups := make(chan group) // unbuffered: one group prepared ahead, one in delivery
	readErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(groups)
		readErr <- w.read(readCtx, log, groups)
	}()
	defer func() {
		cancel()
		wg.Wait()
	}()
	for g := range groups {
		if err := w.deliver(ctx, log, g); err != nil {
			return nil // ctx ended
		}
		if err := w.commit(ctx, log, g.entries[len(g.entries)-1].Next); err != nil {
			return nil // ctx ended
		}
	}
	err := <-readErr
	if err == nil || ctx.Err() != nil || errors.Is(err, spool.ErrClosed) {
		return nil
	}
	return err
}

// read reads, decodes and prepares groups into out until ctx ends or the
// spool fails.
func (w *Worker) read(ctx context.Context, log *slog.Logger, out chan<- group) error {
	prep, _ := w.Sink.(Preparer)
	yield := yielder{busy: w.IngestBusy, maxDefer: w.MaxDefer, sink: w.Name, metrics: w.Metrics}
	for {
		entries, err := w.Reader.Next(ctx, w.MaxBatches, w.MaxBytes)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, spool.ErrClosed) {
				return nil //nolint:nilerr // a stopped worker or a closed spool ends reading normally (Run's contract)
			}
			return fmt.Errorf("%s worker reading the spool: %w", w.Name, err)
		}
		if len(entries) == 0 {
			continue
		}
		if !yield.wait(ctx, entries[0].Time) {
			return nil
		}
		g := group{entries: entries, batches: make([]*accesslog.Batch, 0, len(entries))}
		for _, e := range entries {
			b, err := accesslog.Unmarshal(e.Data)
			if err != nil {
				// The entry passed its checksum, so this is a bug or a
				// version skew; skipping it is the only way forward.
				log.Error("rtld: skipping an undecodable spool entry", "index", e.Index, "err", err)
				continue
			}
			g.batches = append(g.batches, b)
			g.records += len(b.Records)
		}
		if len(g.batches) > 0 && prep != nil {
			g.prepared = prep.Prepare(g.batches)
		}
		select {
		case out <- g:
		case <-ctx.Done():
			return nil
		}
	}
}

// deliver delivers a group until the sink acknowledged or rejected every
// record, and sets the rejected ones aside; it fails only when ctx ends.
func (w *Worker) deliver(ctx context.Context, log *slog.Logger, g group) error {
	if len(g.batches) == 0 {
		return nil
	}
	failed := 0
	d := &Deliverer{
		Sink: w.Sink, MinBackoff: w.MinBackoff, MaxBackoff: w.MaxBackoff,
		OnError: func(err error, batches, attempt int, wait time.Duration) {
			failed++
			w.Metrics.errors.WithLabelValues(w.Name).Inc()
			log.Warn("rtld: delivery failed, retrying", "batches", batches, "attempt", attempt, "retry_in", wait, "err", err)
		},
	}
	start := time.Now()
	rejected, err := d.Deliver(ctx, g.batches, g.prepared)
	if err != nil {
		return err
	}
	w.Metrics.seconds.WithLabelValues(w.Name).Observe(time.Since(start).Seconds())
	if failed > 0 {
		log.Info("rtld: sink is delivering again", "failed_attempts", failed)
	}
	if len(rejected) > 0 {
		if err := setAside(ctx, log, w.DeadLetters, w.Name, w.MinBackoff, w.MaxBackoff, rejected); err != nil {
			return err
		}
	}
	w.Metrics.batches.WithLabelValues(w.Name).Add(float64(len(g.batches)))
	w.Metrics.records.WithLabelValues(w.Name).Add(float64(g.records - len(rejected)))
	return nil
}

// commit persists the worker's spool position, retrying with backoff until
// it succeeds or ctx ends: a failed commit (a disk error) must neither end
// the process nor deliver the group again.
func (w *Worker) commit(ctx context.Context, log *slog.Logger, p spool.Position) error {
	return commit(ctx, log, w.Reader, w.MinBackoff, w.MaxBackoff, p)
}

// commit commits p on reader, retrying with backoff from minBackoff to
// maxBackoff until it succeeds or ctx ends.
func commit(ctx context.Context, log *slog.Logger, reader SpoolReader, minBackoff, maxBackoff time.Duration, p spool.Position) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = minBackoff
	b.MaxInterval = maxBackoff
	for attempt := 1; ; attempt++ {
		err := reader.Commit(p)
		if err == nil {
			if attempt > 1 {
				log.Info("rtld: spool position committed again", "attempts", attempt)
			}
			return nil
		}
		wait := b.NextBackOff()
		log.Error("rtld: cannot commit the spool position, retrying (the group is delivered and is not sent again)",
			"attempt", attempt, "retry_in", wait, "err", err)
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}
