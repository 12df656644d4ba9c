package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// RecordRef names one record of a delivery: Batch indexes the batches
// handed to the sink, Record that batch's Records.
type RecordRef struct{ Batch, Record int }

// RejectedError is a sink's answer when it refuses records for good:
// delivering them again unchanged fails again (too large for the topic, a
// value the table refuses). A sink returns it only when every record it
// does not name was acknowledged; several may be joined with errors.Join.
type RejectedError struct {
	// Records are the refused records, in delivery order. Nil names every
	// record of the delivery.
	Records []RecordRef
	// Each reports that every one of Records is refused on its own (the
	// broker refused each message). Otherwise the sink could only tell that
	// the refusal concerns Records together (one INSERT, one produce
	// request), and the worker delivers them again in halves to find the
	// culprits, so one bad record does not take its neighbours with it.
	Each bool
	// Reason is the cause as a short snake_case word for metric labels
	// (message_too_large, topic_authorization_failed, code_395, …).
	Reason string
	// Err is the sink's error.
	Err error
}

// Error implements error.
func (e *RejectedError) Error() string {
	n := "all"
	if e.Records != nil {
		n = strconv.Itoa(len(e.Records))
	}
	return fmt.Sprintf("sink rejected %s records for good (%s): %v", n, e.Reason, e.Err)
}

// Unwrap returns the sink's error.
func (e *RejectedError) Unwrap() error { return e.Err }

// Rejection is one record a sink rejected for good.
type Rejection struct {
	// Batch is the record's batch narrowed to that one record (see
	// accesslog.Batch.Select: the record keeps its identity).
	Batch *accesslog.Batch
	// Reason and Err are the RejectedError's.
	Reason string
	Err    error
}

// rejections returns the RejectedErrors err consists of, or nil when any
// part of err is something else (a failure worth retrying).
func rejections(err error) []*RejectedError {
	var out []*RejectedError
	var walk func(error) bool
	walk = func(e error) bool {
		switch x := e.(type) { //nolint:errorlint // walks the error tree itself: every leaf must be a *RejectedError
		case *RejectedError:
			out = append(out, x)
			return true
		case interface{ Unwrap() []error }:
			parts := x.Unwrap()
			for _, p := range parts {
				if !walk(p) {
					return false
				}
			}
			return len(parts) > 0
		}
		if u := errors.Unwrap(e); u != nil {
			return walk(u)
		}
		return false
	}
	if err == nil || !walk(err) {
		return nil
	}
	return out
}

// Deliverer delivers groups of batches to one sink under the contract of
// Sink: it retries failures with exponential backoff until the sink
// acknowledges, and when the sink rejects records for good it finds them
// (delivering inexact rejections again in halves, down to single records)
// and returns them. The worker and `rtld-receiver dead-letter replay` share
// it, so a replay re-delivers exactly as the worker does.
type Deliverer struct {
	// Sink receives the batches; a Preparer prepares every split part.
	Sink Sink
	// MinBackoff and MaxBackoff bound the retry delay (defaults
	// DefaultMinBackoff and DefaultMaxBackoff).
	MinBackoff, MaxBackoff time.Duration
	// OnError, when set, is told of every failed attempt before the wait
	// that follows it: the error, how many batches the attempt carried,
	// the attempt number and the wait.
	OnError func(err error, batches, attempt int, wait time.Duration)
}

// withDefaults returns d with every unset setting set to its default.
func (d Deliverer) withDefaults() Deliverer {
	if d.MinBackoff == 0 {
		d.MinBackoff = DefaultMinBackoff
	}
	if d.MaxBackoff == 0 {
		d.MaxBackoff = DefaultMaxBackoff
	}
	return d
}

// validate reports every setting of d (with defaults applied) that cannot
// work.
func (d Deliverer) validate() error { return validateRetry(d.Sink, d.MinBackoff, d.MaxBackoff) }

// Deliver delivers batches, using p when it is the batches' prepared
// delivery (nil: Deliver prepares them itself), until every record is
// acknowledged or rejected for good, and returns the rejected records. It
// returns an error only when ctx ends, or at once for an invalid Deliverer.
func (d *Deliverer) Deliver(ctx context.Context, batches []*accesslog.Batch, p Prepared) ([]Rejection, error) {
	cfg := d.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("delivery: invalid configuration: %w", err)
	}
	d = &cfg
	if p == nil {
		if prep, ok := d.Sink.(Preparer); ok {
			p = prep.Prepare(batches)
		}
	}
	send := func(ctx context.Context) error { return d.Sink.Deliver(ctx, batches) }
	if p != nil {
		send = p.Deliver
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = d.MinBackoff
	b.MaxInterval = d.MaxBackoff
	b.RandomizationFactor = 0.3
	for attempt := 1; ; attempt++ {
		err := send(ctx)
		if err == nil {
			return nil, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if rejs := rejections(err); rejs != nil {
			return d.resolve(ctx, batches, rejs)
		}
		wait := b.NextBackOff()
		if d.OnError != nil {
			d.OnError(err, len(batches), attempt, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// resolve turns the sink's rejections of batches into rejected records:
// exact ones as they are, the others by delivering their records again in
// two halves (recursively, so a single bad record costs about 2·log2(n)
// deliveries).
func (d *Deliverer) resolve(ctx context.Context, batches []*accesslog.Batch, rejs []*RejectedError) ([]Rejection, error) {
	var out []Rejection
	for _, rj := range rejs {
		refs := rj.Records
		if refs == nil {
			for i, b := range batches {
				for j := range b.Records {
					refs = append(refs, RecordRef{Batch: i, Record: j})
				}
			}
		}
		if rj.Each || len(refs) == 1 {
			for _, r := range refs {
				out = append(out, Rejection{Batch: batches[r.Batch].Select(r.Record), Reason: rj.Reason, Err: rj.Err})
			}
			continue
		}
		half := len(refs) / 2
		for _, part := range [][]RecordRef{refs[:half], refs[half:]} {
			got, err := d.Deliver(ctx, narrow(batches, part), nil)
			if err != nil {
				return nil, err
			}
			out = append(out, got...)
		}
	}
	return out, nil
}

// narrow returns the batches holding only the records refs names, one
// narrowed batch per run of refs into the same batch.
func narrow(batches []*accesslog.Batch, refs []RecordRef) []*accesslog.Batch {
	var out []*accesslog.Batch
	for i := 0; i < len(refs); {
		j := i
		var idx []int
		for ; j < len(refs) && refs[j].Batch == refs[i].Batch; j++ {
			idx = append(idx, refs[j].Record)
		}
		out = append(out, batches[refs[i].Batch].Select(idx...))
		i = j
	}
	return out
}

// setAside hands the rejected records to the dead-letter store of sink
// (nil: logs them only), retrying with backoff until it succeeds or ctx
// ends, and logs them once per batch.
func setAside(ctx context.Context, log *slog.Logger, store DeadLetters, sink string, minBackoff, maxBackoff time.Duration, rejected []Rejection) error {
	if len(rejected) == 0 {
		return nil
	}
	if store == nil {
		logRejections(log, rejected, false)
		return nil
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = minBackoff, maxBackoff
	for {
		err := store.Add(sink, rejected)
		if err == nil {
			logRejections(log, rejected, true)
			return nil
		}
		wait := b.NextBackOff()
		log.Error("rtld: cannot store dead letters, retrying", "records", len(rejected), "retry_in", wait, "err", err)
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// logRejections writes one error line per batch that lost records to the
// sink.
func logRejections(log *slog.Logger, rejected []Rejection, kept bool) {
	type key struct{ env, profile, agent, datestamp, hash string }
	type entry struct {
		b       *accesslog.Batch
		indexes []int
		reasons []string
		err     error
	}
	var order []key
	byBatch := map[key]*entry{}
	for _, r := range rejected {
		b := r.Batch
		k := key{b.EnvironmentID, b.ProfileID, b.AgentID, b.Datestamp, b.BatchHash}
		if b.HasIdentity() {
			k.hash = strconv.FormatInt(b.SeqNum, 10)
		}
		e := byBatch[k]
		if e == nil {
			e = &entry{b: b, err: r.Err}
			byBatch[k] = e
			order = append(order, k)
		}
		e.indexes = append(e.indexes, b.RecordIndex(0))
		if !slices.Contains(e.reasons, r.Reason) {
			e.reasons = append(e.reasons, r.Reason)
		}
	}
	msg := "rtld: sink rejected records for good; set aside in the dead-letter store"
	if !kept {
		msg = "rtld: sink rejected records for good; dropped (no dead-letter store)"
	}
	for _, k := range order {
		e := byBatch[k]
		idx := fmt.Sprint(e.indexes)
		if len(e.indexes) > 20 {
			idx = fmt.Sprint(e.indexes[:20]) + "…"
		}
		attrs := []any{"environment_id", e.b.EnvironmentID, "records", len(e.indexes), "record_indexes", idx,
			"reason", strings.Join(e.reasons, ","), "err", e.err}
		if e.b.HasIdentity() {
			attrs = append(attrs, "profile_id", e.b.ProfileID, "agent_id", e.b.AgentID, "datestamp", e.b.Datestamp, "seq_num", e.b.SeqNum)
		} else {
			attrs = append(attrs, "format", e.b.Format, "batch_hash", e.b.BatchHash)
		}
		log.Error(msg, attrs...)
	}
}
