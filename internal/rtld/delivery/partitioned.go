package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
	"github.com/edgepipe/edgepipe/internal/rtld/statefile"
)

// Partitioned is a Sink whose records travel in independent ordered
// partitions (Kafka): every record of a batch goes to one partition, and a
// partition whose destination is unavailable must hold up no other.
// A PartitionWorker delivers to it.
type Partitioned interface {
	Sink
	// Partitions returns the current number of partitions; it may connect
	// to find out.
	Partitions(ctx context.Context) (int, error)
	// PartitionOf returns the partition, among n, of every record of b.
	PartitionOf(b *accesslog.Batch, n int) int
	// PreparePartition prepares the delivery of batches, all of partition
	// p, in order. The returned Prepared may be delivered again after an
	// error; it then sends only what was not confirmed, and nothing newer
	// than what it has not confirmed.
	PreparePartition(p int, batches []*accesslog.Batch) Prepared
	// Probe returns nil once partition p's destination answers again;
	// it is cheap compared with a delivery.
	Probe(ctx context.Context, p int) error
}

// UnconfirmedError is a failed delivery whose records may have reached the
// sink anyway: the request was sent and no answer came, or the answer said
// the records were written without full confirmation. Delivering them again
// may store Records records twice.
type UnconfirmedError struct {
	Records int
	Err     error
}

// Error implements error.
func (e *UnconfirmedError) Error() string {
	return fmt.Sprintf("%d records sent without confirmation: %v", e.Records, e.Err)
}

// Unwrap returns the cause.
func (e *UnconfirmedError) Unwrap() error { return e.Err }

// PartitionReader is what a PartitionWorker needs from its spool cursor:
// besides reading and committing, reading again from a position it let go
// of, and starting over from the committed position.
type PartitionReader interface {
	SpoolReader
	Committed() spool.Position
	ReadFrom(p spool.Position, maxEntries int, maxBytes int64) ([]spool.Entry, error)
	Rewind()
}

// PartitionWorker moves spooled batches into a Partitioned sink, each
// partition on its own: one goroutine per partition delivers that
// partition's batches in spool order, one delivery at a time, so records
// stay in order within their partition, and only the partition whose
// delivery failed waits. While it fails, its destination is probed (every
// MinBackoff, doubling up to MaxBackoff) and the delivery is sent again as
// soon as a probe succeeds, so a broker's return is noticed within about
// MaxBackoff.
//
// The spool is read once, ahead of the partitions. A partition that cannot
// keep up (its destination is down) holds at most its share of
// MaxPendingBytes in memory; beyond that it lets go of its batches and
// later reads them from the spool again itself, so the other partitions
// keep flowing for as long as the spool holds the backlog. The spool
// position is committed up to the oldest batch some partition has not
// delivered; with MarksFile, every partition's own progress is kept too,
// so after a restart only what a partition had not delivered is sent to
// it again (and after a crash, what it delivered since the marks were last
// saved, at most CommitInterval).
//
// When the sink reports more partitions (an operator added some), the
// worker stops reading, lets the partitions deliver what they have (for up
// to a minute), and starts again from the committed position with the new
// count, since a record's partition depends on it.
type PartitionWorker struct {
	// Name is the sink's name: its spool reader and its metrics label.
	Name string
	// Sink receives the batches.
	Sink Partitioned
	// Reader is the sink's spool cursor.
	Reader PartitionReader
	// DeadLetters receives the records the sink rejects for good. Nil
	// drops them after logging them (for tests).
	DeadLetters DeadLetters
	// Metrics receive delivery counts and errors.
	Metrics *Metrics
	// Log receives delivery failures (default slog.Default()).
	Log *slog.Logger
	// MaxBatches and MaxBytes bound one read of the spool and one delivery
	// to a partition (defaults DefaultMaxBatches and DefaultMaxBytes).
	MaxBatches int
	MaxBytes   int64
	// MaxPendingBytes bounds the batches read and waiting for their
	// partitions, all partitions together (default DefaultMaxPendingBytes).
	MaxPendingBytes int64
	// MinBackoff and MaxBackoff bound the time between probes of a failing
	// partition (defaults DefaultMinBackoff and DefaultMaxProbeInterval).
	MinBackoff, MaxBackoff time.Duration
	// CommitInterval is how often the spool position is committed while
	// batches are delivered (default DefaultCommitInterval).
	CommitInterval time.Duration
	// PartitionsInterval is how often the sink is asked for its number of
	// partitions (default DefaultPartitionsInterval).
	PartitionsInterval time.Duration
	// IngestBusy and MaxDefer let ingest go first while it is saturated,
	// as for Worker: the batches read are held back before they are queued
	// for their partitions.
	IngestBusy func() float64
	MaxDefer   time.Duration
	// MarksFile, when set, keeps for every partition the spool index below
	// which all its batches are delivered (rewritten in place with the
	// spool position): after a restart a partition is not sent again what
	// it had, only the partitions behind the spool position get their
	// batches. Saving it is best effort; without it a restart sends every
	// partition the batches after the spool position again.
	MarksFile string

	marks *statefile.File // MarksFile while a run uses it
}

// Defaults of PartitionWorker.
const (
	DefaultMaxPendingBytes    = 64 << 20
	DefaultMaxProbeInterval   = time.Second
	DefaultCommitInterval     = 100 * time.Millisecond
	DefaultPartitionsInterval = time.Minute
	// regrowWait bounds how long the partitions may deliver what they
	// hold before the worker starts again with a new partition count.
	regrowWait = time.Minute
	// minLaneBytes is the least a partition holds in memory (or MaxBytes
	// when smaller), however many partitions share MaxPendingBytes; a lane
	// holds one batch at least.
	minLaneBytes = 1 << 20
	// stillFailingEvery spaces the log lines of a partition that keeps
	// failing.
	stillFailingEvery = 30 * time.Second
	// slowLane is how long a lane's delivery may take before the
	// dispatcher stops waiting for the lane to make room (see
	// waitForRoom): the longest the other lanes can go without new
	// batches when one partition's leader hangs.
	slowLane = 500 * time.Millisecond
)

// withDefaults returns w with every unset setting set to its default.
func (w PartitionWorker) withDefaults() PartitionWorker {
	if w.Log == nil {
		w.Log = slog.Default()
	}
	if w.MaxBatches == 0 {
		w.MaxBatches = DefaultMaxBatches
	}
	if w.MaxBytes == 0 {
		w.MaxBytes = DefaultMaxBytes
	}
	if w.MaxPendingBytes == 0 {
		w.MaxPendingBytes = DefaultMaxPendingBytes
	}
	if w.MinBackoff == 0 {
		w.MinBackoff = DefaultMinBackoff
	}
	if w.MaxBackoff == 0 {
		w.MaxBackoff = DefaultMaxProbeInterval
	}
	if w.CommitInterval == 0 {
		w.CommitInterval = DefaultCommitInterval
	}
	if w.PartitionsInterval == 0 {
		w.PartitionsInterval = DefaultPartitionsInterval
	}
	if w.MaxDefer == 0 {
		w.MaxDefer = DefaultMaxDefer
	}
	return w
}

// validate reports every setting of w (with defaults applied) that cannot
// work.
func (w PartitionWorker) validate() error {
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
	if w.MaxBatches < 0 || w.MaxBytes < 0 || w.MaxPendingBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxBatches %d, MaxBytes %d and MaxPendingBytes %d: must be positive", w.MaxBatches, w.MaxBytes, w.MaxPendingBytes))
	}
	if w.CommitInterval < 0 || w.PartitionsInterval < 0 {
		errs = append(errs, fmt.Errorf("CommitInterval %s and PartitionsInterval %s: must be positive", w.CommitInterval, w.PartitionsInterval))
	}
	var sink Sink
	if w.Sink != nil {
		sink = w.Sink
	}
	errs = append(errs, validateRetry(sink, w.MinBackoff, w.MaxBackoff))
	return errors.Join(errs...)
}

// errRegrow ends a run whose partition count is out of date.
var errRegrow = errors.New("the sink has more partitions")

// Run delivers until ctx ends; it returns nil then, an error if the spool
// fails, or one at once for an invalid PartitionWorker.
func (w *PartitionWorker) Run(ctx context.Context) error {
	cfg := w.withDefaults()
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("%s worker: invalid configuration: %w", w.Name, err)
	}
	w = &cfg
	log := w.Log.With("sink", w.Name)
	for {
		n, err := w.partitions(ctx, log)
		if err != nil {
			return nil //nolint:nilerr // ctx ended (Run's contract)
		}
		err = w.runWith(ctx, log, n)
		switch {
		case errors.Is(err, errRegrow):
			w.Reader.Rewind()
			continue
		case err == nil || ctx.Err() != nil || errors.Is(err, spool.ErrClosed):
			return nil //nolint:nilerr // a stopped worker or a closed spool ends delivery normally (Run's contract)
		}
		return err
	}
}

// partitions asks the sink for its partition count until it answers or
// ctx ends.
func (w *PartitionWorker) partitions(ctx context.Context, log *slog.Logger) (int, error) {
	wait := w.MinBackoff
	for attempt := 1; ; attempt++ {
		n, err := w.Sink.Partitions(ctx)
		if err == nil && n > 0 {
			if attempt > 1 {
				log.Info("rtld: sink reachable, delivering", "partitions", n)
			}
			return n, nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if err == nil {
			err = errors.New("no partitions")
		}
		w.Metrics.errors.WithLabelValues(w.Name).Inc()
		log.Warn("rtld: cannot learn the sink's partitions, retrying", "attempt", attempt, "retry_in", wait, "err", err)
		if !sleep(ctx, wait) {
			return 0, ctx.Err()
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// runWith delivers with n partitions until ctx ends, the spool fails, or
// the sink has more partitions (errRegrow).
func (w *PartitionWorker) runWith(ctx context.Context, log *slog.Logger, n int) error {
	r := &partitionRun{w: w, log: log, read: w.Reader.Committed(), changed: make(chan struct{})}
	r.committed = r.read
	laneCtx, stopLanes := context.WithCancel(ctx)
	defer stopLanes()
	var wg sync.WaitGroup
	r.lanes = make([]*lane, n)
	marks := w.loadMarks(log, n)
	defer r.closeMarks()
	for p := range r.lanes {
		l := &lane{id: p, label: strconv.Itoa(p), wake: make(chan struct{}, 1), limit: max(w.MaxPendingBytes/int64(n), min(w.MaxBytes, minLaneBytes))}
		if marks != nil {
			l.delivered = marks[p]
		}
		r.lanes[p] = l
		w.Metrics.initPartition(w.Name, l.label)
		wg.Go(func() { r.runLane(laneCtx, l) })
	}
	readCtx, stopReading := context.WithCancelCause(ctx)
	defer stopReading(nil)
	wg.Go(func() { r.commitEvery(laneCtx) })
	wg.Go(func() { r.watchPartitions(readCtx, stopReading, n) })
	err := r.dispatch(readCtx)
	if errors.Is(context.Cause(readCtx), errRegrow) && ctx.Err() == nil {
		log.Info("rtld: the sink has more partitions; delivering what is read, then starting again with them")
		r.drain(ctx, regrowWait)
		err = errRegrow
	}
	stopLanes()
	wg.Wait()
	r.commit() // what the partitions confirmed last
	return err
}

// item is one spooled batch waiting for its partition.
type item struct {
	batch       *accesslog.Batch
	start, next spool.Position // the entry's place in the spool
	bytes       int64
}

// records returns the number of records of the item's batch.
func (it *item) records() int { return len(it.batch.Records) }

// lane is one partition's queue.
type lane struct {
	id    int
	label string        // id for metric labels
	wake  chan struct{} // a send wakes the lane's goroutine
	limit int64         // bytes it may hold
	// delivered: the lane's batches below this spool index were delivered
	// before a restart (from the marks file); they are skipped.
	delivered uint64

	// Guarded by partitionRun.mu.
	queue    []item // oldest first
	inFlight int    // queue[:inFlight] are being delivered
	// deliveringSince is when the lane's delivery in progress started
	// (zero between deliveries).
	deliveringSince time.Time
	bytes           int64           // of queue
	records         int             // of queue
	behind          *spool.Position // set when the lane let go of batches: it reads the spool from here itself
}

// low is where the lane's oldest batch not yet delivered starts, or nil.
// Callers hold partitionRun.mu.
func (l *lane) low() *spool.Position {
	switch {
	case len(l.queue) > 0:
		return &l.queue[0].start
	case l.behind != nil:
		return l.behind
	}
	return nil
}

// partitionRun is the state of one run of a PartitionWorker.
type partitionRun struct {
	w   *PartitionWorker
	log *slog.Logger

	saved       []uint64 // the marks last saved
	marksFailed bool     // the last save failed (logged once)

	mu        sync.Mutex
	lanes     []*lane
	queued    int64          // bytes of every lane's queue
	read      spool.Position // after the last entry dispatched
	committed spool.Position
	changed   chan struct{} // closed and replaced when a lane delivered
}

// notify wakes the dispatcher and the committer. Callers hold r.mu.
func (r *partitionRun) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// dispatch reads the spool and queues every batch for its partition until
// ctx ends or the spool fails.
func (r *partitionRun) dispatch(ctx context.Context) error {
	yield := yielder{busy: r.w.IngestBusy, maxDefer: r.w.MaxDefer, sink: r.w.Name, metrics: r.w.Metrics}
	for {
		if err := r.waitForALane(ctx); err != nil {
			return nil //nolint:nilerr // ctx ended
		}
		entries, err := r.w.Reader.Next(ctx, r.w.MaxBatches, r.w.MaxBytes)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, spool.ErrClosed) {
				return nil //nolint:nilerr // a stopped worker or a closed spool ends reading normally
			}
			return fmt.Errorf("%s worker reading the spool: %w", r.w.Name, err)
		}
		if len(entries) > 0 && !yield.wait(ctx, entries[0].Time) {
			return nil
		}
		r.mu.Lock()
		start := r.read
		r.mu.Unlock()
		items := make([]item, 0, len(entries))
		parts := make([]int, 0, len(entries))
		for _, e := range entries {
			it := item{start: start, next: e.Next, bytes: int64(len(e.Data))}
			start = e.Next
			b, err := accesslog.Unmarshal(e.Data)
			if err != nil {
				// The entry passed its checksum, so this is a bug or a
				// version skew; skipping it is the only way forward.
				r.log.Error("rtld: skipping an undecodable spool entry", "index", e.Index, "err", err)
				continue
			}
			it.batch = b
			items = append(items, it)
			parts = append(parts, r.w.Sink.PartitionOf(b, len(r.lanes)))
		}
		r.mu.Lock()
		for i, it := range items {
			l := r.lanes[parts[i]]
			if !r.waitForRoom(ctx, l, it) {
				r.mu.Unlock()
				return nil
			}
			r.add(l, it)
		}
		r.read = start
		r.mu.Unlock()
		for _, l := range r.lanes {
			l.poke()
		}
	}
}

// waitForRoom waits until it fits in its lane's queue, for as long as
// every lane holding batches keeps delivering (its delivery in progress
// started less than slowLane ago): partitions that are only slower than
// ingest are waited for, since letting go of a lane's batches would have
// it read the spool again for them, every lane that fell behind reading
// all of it. While some partition is failing or slow to answer, nothing
// is waited for (add lets go of the batches that do not fit, and the
// other lanes go on). It returns false when ctx ended. Callers hold r.mu,
// which it releases while it waits.
func (r *partitionRun) waitForRoom(ctx context.Context, l *lane, it item) bool {
	for l.behind == nil && !r.fits(l, it) && r.progressing() {
		for _, other := range r.lanes {
			other.poke() // deliver what was queued so far
		}
		changed := r.changed
		r.mu.Unlock()
		t := time.NewTimer(slowLane)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		r.mu.Lock()
		if ctx.Err() != nil {
			return false
		}
	}
	return true
}

// progressing reports whether some lane holds batches and every lane that
// does is delivering, each delivery in progress started less than
// slowLane ago (a lane with a queue is delivering or about to). Callers
// hold r.mu.
func (r *partitionRun) progressing() bool {
	holding := false
	for _, l := range r.lanes {
		if len(l.queue) == 0 {
			continue
		}
		holding = true
		if !l.deliveringSince.IsZero() && time.Since(l.deliveringSince) >= slowLane {
			return false
		}
	}
	return holding
}

// fits reports whether it may be queued in l now: within the lane's share
// and the bound of all lanes together, or into an empty lane within the
// bound (or when nothing is queued at all). Callers hold partitionRun.mu.
func (r *partitionRun) fits(l *lane, it item) bool {
	return l.bytes+it.bytes <= l.limit && r.queued+it.bytes <= r.w.MaxPendingBytes ||
		len(l.queue) == 0 && (r.queued+it.bytes <= r.w.MaxPendingBytes || r.queued == 0)
}

// add queues it, or lets go of it when the lane is behind or full, or all
// lanes together hold MaxPendingBytes (a lane with nothing queued takes a
// batch within that bound, and any batch when nothing is queued at all).
// Callers hold partitionRun.mu.
func (r *partitionRun) add(l *lane, it item) {
	if it.start.Index < l.delivered {
		return // delivered before a restart
	}
	if l.behind == nil && r.fits(l, it) {
		l.queue = append(l.queue, it)
		l.bytes += it.bytes
		r.queued += it.bytes
		l.records += it.records()
		r.w.Metrics.partitionQueued.WithLabelValues(r.w.Name, l.label).Set(float64(l.records))
		return
	}
	if l.behind == nil {
		start := it.start
		l.behind = &start
		r.w.Metrics.partitionBehind.WithLabelValues(r.w.Name, l.label).Set(1)
	}
}

func (l *lane) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// waitForALane waits while every lane is behind (reading ahead would only
// let go of what is read).
func (r *partitionRun) waitForALane(ctx context.Context) error {
	for {
		r.mu.Lock()
		all := true
		for _, l := range r.lanes {
			if l.behind == nil {
				all = false
				break
			}
		}
		changed := r.changed
		r.mu.Unlock()
		if !all {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// runLane delivers the lane's batches until ctx ends.
func (r *partitionRun) runLane(ctx context.Context, l *lane) {
	for {
		items, reached, err := r.next(ctx, l)
		if err != nil {
			return
		}
		if len(items) > 0 {
			if err := r.deliver(ctx, l, items); err != nil {
				return // ctx ended
			}
		}
		r.mu.Lock()
		l.deliveringSince = time.Time{}
		if reached != nil { // read from the spool: the lane is past it
			l.behind = reached
			r.caughtUp(l)
		} else {
			for _, it := range l.queue[:l.inFlight] {
				l.bytes -= it.bytes
				r.queued -= it.bytes
				l.records -= it.records()
			}
			clear(l.queue[:l.inFlight])
			l.queue = l.queue[l.inFlight:]
			l.inFlight = 0
			r.w.Metrics.partitionQueued.WithLabelValues(r.w.Name, l.label).Set(float64(l.records))
		}
		r.notify()
		r.mu.Unlock()
	}
}

// caughtUp lets the dispatcher queue for a lane that fell behind again
// once it has read the spool up to the dispatcher. Callers hold r.mu.
func (r *partitionRun) caughtUp(l *lane) {
	if l.behind != nil && l.behind.Index >= r.read.Index && len(l.queue) == 0 {
		l.behind = nil
		r.w.Metrics.partitionBehind.WithLabelValues(r.w.Name, l.label).Set(0)
	}
}

// next waits for the lane's next batches: queued ones (reached is nil), or
// once the queue is empty and the lane is behind, the ones it reads from
// the spool itself (reached is where that read ended).
func (r *partitionRun) next(ctx context.Context, l *lane) ([]item, *spool.Position, error) {
	for {
		r.mu.Lock()
		if len(l.queue) > 0 {
			n, size := 0, int64(0)
			for n < len(l.queue) && n < r.w.MaxBatches && (n == 0 || size+l.queue[n].bytes <= r.w.MaxBytes) {
				size += l.queue[n].bytes
				n++
			}
			l.inFlight = n
			l.deliveringSince = time.Now()
			items := l.queue[:n:n]
			r.mu.Unlock()
			return items, nil, nil
		}
		if l.behind != nil {
			from, until := *l.behind, r.read
			r.mu.Unlock()
			if from.Index < until.Index {
				items, reached, err := r.reread(l, from, until)
				if err != nil {
					r.log.Error("rtld: reading the spool again for a partition that fell behind", "partition", l.id, "err", err)
					if !sleep(ctx, r.w.MaxBackoff) {
						return nil, nil, ctx.Err()
					}
					continue
				}
				return items, &reached, nil
			}
			r.mu.Lock()
			r.caughtUp(l)
			r.mu.Unlock()
			continue
		}
		r.mu.Unlock()
		select {
		case <-l.wake:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// reread reads the spool from `from` (up to `until`, where the dispatcher
// is) and returns the lane's batches in it and where the read ended.
func (r *partitionRun) reread(l *lane, from, until spool.Position) ([]item, spool.Position, error) {
	entries, err := r.w.Reader.ReadFrom(from, r.w.MaxBatches, r.w.MaxBytes)
	if err != nil {
		return nil, from, err
	}
	if len(entries) == 0 {
		// What lies between is gone (damaged and quarantined).
		return nil, until, nil
	}
	reached := from
	var items []item
	for _, e := range entries {
		if e.Index >= until.Index {
			reached = until // damaged entries up to the dispatcher's
			break
		}
		it := item{start: reached, next: e.Next, bytes: int64(len(e.Data))}
		reached = e.Next
		if e.Index < l.delivered {
			continue
		}
		b, err := accesslog.Unmarshal(e.Data)
		if err != nil || r.w.Sink.PartitionOf(b, len(r.lanes)) != l.id {
			continue // an undecodable entry was logged when it was dispatched
		}
		it.batch = b
		items = append(items, it)
	}
	return items, reached, nil
}

// deliver delivers items to the lane's partition until every record is
// acknowledged or rejected for good (set aside in the dead letters),
// probing the partition between attempts; it fails only when ctx ends.
func (r *partitionRun) deliver(ctx context.Context, l *lane, items []item) error {
	w := r.w
	batches := make([]*accesslog.Batch, len(items))
	records := 0
	for i, it := range items {
		batches[i] = it.batch
		records += len(it.batch.Records)
	}
	prepared := w.Sink.PreparePartition(l.id, batches)
	var failedSince, loggedAt time.Time
	attempts := 0
	for {
		start := time.Now()
		// A request in flight when ctx ends is let finish (the sink bounds
		// it): interrupted, its records would be sent again after the
		// restart.
		err := prepared.Deliver(context.WithoutCancel(ctx))
		if err == nil {
			w.Metrics.seconds.WithLabelValues(w.Name).Observe(time.Since(start).Seconds())
			r.delivered(l, len(batches), records, nil, failedSince, attempts)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if rejs := rejections(err); rejs != nil {
			d := &Deliverer{Sink: partitionSink{w.Sink, l.id}, MinBackoff: w.MinBackoff, MaxBackoff: w.MaxBackoff}
			rejected, err := d.resolve(ctx, batches, rejs)
			if err == nil {
				err = setAside(ctx, r.log, w.DeadLetters, w.Name, w.MinBackoff, w.MaxBackoff, rejected)
			}
			if err != nil {
				return err
			}
			r.delivered(l, len(batches), records, rejected, failedSince, attempts)
			return nil
		}
		attempts++
		w.Metrics.errors.WithLabelValues(w.Name).Inc()
		var u *UnconfirmedError
		if errors.As(err, &u) {
			w.Metrics.partitionUnconfirmed.WithLabelValues(w.Name, l.label).Add(float64(u.Records))
		}
		if failedSince.IsZero() {
			failedSince = time.Now()
			r.setFailing(l, true)
		}
		if time.Since(loggedAt) >= stillFailingEvery {
			loggedAt = time.Now()
			r.log.Warn("rtld: partition delivery failed; probing it and sending again when it answers (other partitions go on)",
				"partition", l.id, "batches", len(batches), "attempt", attempts, "failing_for", time.Since(failedSince).Round(time.Millisecond), "err", err)
		}
		if err := r.probe(ctx, l); err != nil {
			return err
		}
	}
}

// probe probes the lane's partition until it answers, every MinBackoff
// at first, doubling up to MaxBackoff, with jitter; it fails only when ctx
// ends.
func (r *partitionRun) probe(ctx context.Context, l *lane) error {
	wait := r.w.MinBackoff
	for {
		jittered := wait/2 + rand.N(wait/2+1)
		if !sleep(ctx, jittered) {
			return ctx.Err()
		}
		if err := r.w.Sink.Probe(ctx, l.id); err == nil {
			return nil
		}
		wait = min(2*wait, r.w.MaxBackoff)
	}
}

// delivered counts a finished delivery and logs a partition's recovery.
func (r *partitionRun) delivered(l *lane, batches, records int, rejected []Rejection, failedSince time.Time, attempts int) {
	w := r.w
	w.Metrics.batches.WithLabelValues(w.Name).Add(float64(batches))
	w.Metrics.records.WithLabelValues(w.Name).Add(float64(records - len(rejected)))
	if !failedSince.IsZero() {
		r.setFailing(l, false)
		r.log.Info("rtld: partition is delivering again", "partition", l.id, "failed_for", time.Since(failedSince).Round(time.Millisecond), "failed_attempts", attempts)
	}
}

func (r *partitionRun) setFailing(l *lane, failing bool) {
	v := 0.0
	if failing {
		v = 1
	}
	r.w.Metrics.partitionFailing.WithLabelValues(r.w.Name, l.label).Set(v)
}

// low returns the position before the oldest batch not yet delivered to
// every partition.
func (r *partitionRun) low() spool.Position {
	r.mu.Lock()
	defer r.mu.Unlock()
	low := r.read
	for _, l := range r.lanes {
		if p := l.low(); p != nil && p.Index < low.Index {
			low = *p
		}
	}
	return low
}

// commitEvery commits the spool position every CommitInterval while it
// moves, until ctx ends.
func (r *partitionRun) commitEvery(ctx context.Context) {
	t := time.NewTicker(r.w.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.saveMarks()
		if low := r.low(); low.Index > r.committed.Index {
			if err := commit(ctx, r.log, r.w.Reader, r.w.MinBackoff, r.w.MaxBackoff, low); err != nil {
				return
			}
			r.committed = low
		}
	}
}

// commit commits the position once more after the lanes stopped.
func (r *partitionRun) commit() {
	r.saveMarks()
	if low := r.low(); low.Index > r.committed.Index {
		if err := r.w.Reader.Commit(low); err != nil {
			r.log.Error("rtld: cannot commit the spool position at shutdown; the batches after it are delivered again after the restart", "err", err)
			return
		}
		r.committed = low
	}
}

// watchPartitions asks the sink for its partition count every
// PartitionsInterval and stops reading (errRegrow) when it grew.
func (r *partitionRun) watchPartitions(ctx context.Context, stop context.CancelCauseFunc, n int) {
	t := time.NewTicker(r.w.PartitionsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if now, err := r.w.Sink.Partitions(ctx); err == nil && now > n {
			stop(errRegrow)
			return
		}
	}
}

// drain waits until every lane delivered what it holds, at most limit.
func (r *partitionRun) drain(ctx context.Context, limit time.Duration) {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		empty := true
		for _, l := range r.lanes {
			if l.low() != nil {
				empty = false
			}
		}
		changed := r.changed
		r.mu.Unlock()
		if empty {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// partitionSink delivers to one partition of a Partitioned sink (for the
// Deliverer that finds rejected records by splitting).
type partitionSink struct {
	s Partitioned
	p int
}

func (ps partitionSink) Deliver(ctx context.Context, batches []*accesslog.Batch) error {
	return ps.s.PreparePartition(ps.p, batches).Deliver(ctx)
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
