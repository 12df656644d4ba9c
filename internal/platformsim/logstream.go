package platformsim

import (
	"errors"
	"fmt"
	"sort"
	"time"
)

// A profile's stream is its environment's traffic as the profile logs it:
// bucket after bucket of the log model (logmodel.go), each record once. Live
// delivery draws the records whose time has come; DeliverRecords draws the
// next ones whatever the clock.

// Bounds of DeliverRecords' search for records (a tiny environment, or
// filters that pass almost nothing): how far beyond the clock it looks, and
// how many records it draws per batch at most.
const (
	maxDrawAhead = 24 * time.Hour
	maxDrawScan  = 1_000_000
)

// errNoRecords is returned by DeliverRecords when the stream holds too few
// records within its bounds.
var errNoRecords = errors.New("the profile's stream holds too few records in the next day (tiny traffic, or filters and faults that pass almost nothing)")

// logStream is the position of a profile in its environment's traffic.
type logStream struct {
	bucket time.Time   // start of the bucket being drawn
	resume time.Time   // records before it are never logged (the stream began then)
	plan   *bucketPlan // of bucket; nil until the stream reaches it
	next   int64       // the plan's next record
}

// newLogStream starts a stream at t: the records of requests from t on.
func newLogStream(t time.Time) *logStream {
	return &logStream{bucket: t.UTC().Truncate(logBucketWidth), resume: t}
}

// skipTo moves the profile's stream on to t when it lies behind: the
// records in between are never logged, and their bucket is marked Partial.
// ps.mu must be held.
func (ps *profileState) skipTo(t time.Time) {
	st := ps.stream
	if st.plan != nil && st.next < st.plan.records && st.plan.timestamp(st.next) < t.UnixMicro() {
		if b, ok := ps.buckets[st.bucket.Unix()]; ok {
			b.Partial = true
		}
		st.next = st.plan.firstAt(t)
	}
	switch {
	case !st.bucket.Add(logBucketWidth).After(t):
		ps.stream = newLogStream(t)
	case st.plan == nil && t.After(st.resume):
		st.resume = t
	}
}

// drawLimit says how far a draw goes.
type drawLimit struct {
	live    bool      // only records due at now
	now     time.Time // live: the simulated clock
	records int       // most records returned
	scan    int       // most records drawn (before filters and faults)
	horizon time.Time // not live: no bucket starting after it
}

// draw takes up to lim.records records of the profile's stream that pass
// its filters and the environment's DropRecordPercent, and counts them in
// the profile's buckets. ps.mu must be held.
func (e *deliveryEngine) draw(tg deliveryTarget, ps *profileState, lim drawLimit) ([]*logRequest, error) {
	st := ps.stream
	faults := e.envFaults(tg.profile.EnvironmentID)
	var out []*logRequest
	scanned := 0
	for len(out) < lim.records {
		if st.plan == nil {
			if ok, err := e.enterBucket(tg, ps, lim); !ok {
				return out, err
			}
		}
		if st.next >= st.plan.records {
			st.bucket, st.plan, st.next = st.bucket.Add(logBucketWidth), nil, 0
			continue
		}
		if lim.live && !due(st.plan, st.next, lim.now, faults.Late) {
			break
		}
		if scanned == lim.scan {
			if lim.live {
				break
			}
			return out, errNoRecords
		}
		scanned++
		r := st.plan.request(st.next, &tg.ctx)
		b := ps.buckets[st.bucket.Unix()]
		b.Drawn++
		switch {
		case !tg.ctx.passes(r):
			b.Filtered++
		case faults.DropRecordPercent > 0 && st.plan.h.s("skip").i(tg.profile.ID).i(st.next).u()*100 < faults.DropRecordPercent:
			b.Skipped++
			e.mu.Lock()
			e.stats.RecordsSkipped++
			e.mu.Unlock()
		default:
			r.uuid = newUUID()
			out = append(out, r)
		}
		st.next++
	}
	return out, nil
}

// due reports whether record j of plan is to be delivered at now: once the
// clock passed its timestamp, or with a Late fault once Late has passed
// after its bucket's end.
func due(plan *bucketPlan, j int64, now time.Time, late time.Duration) bool {
	if late > 0 {
		return !now.Before(plan.end().Add(late))
	}
	return plan.timestamp(j) <= now.UnixMicro()
}

// enterBucket draws the plan of the stream's bucket with the profile's
// share in force now (a change of downsampling_percent takes effect at the
// next bucket) and opens its LogBucket. It reports false when the draw must
// stop: a live stream at a bucket that has not begun, a draw beyond its
// horizon (errNoRecords), or an environment that is gone.
func (e *deliveryEngine) enterBucket(tg deliveryTarget, ps *profileState, lim drawLimit) (bool, error) {
	st := ps.stream
	switch {
	case lim.live && st.bucket.After(lim.now):
		return false, nil
	case !lim.live && st.bucket.After(lim.horizon):
		return false, errNoRecords
	}
	percent := downsamplingPercent(tg.profile)
	plan, ok := e.plan(tg.profile.EnvironmentID, st.bucket, percent)
	if !ok {
		return false, fmt.Errorf("environment %s: %w", tg.profile.EnvironmentID, errNoTarget)
	}
	st.plan, st.next = plan, 0
	partial := st.resume.After(st.bucket)
	if partial {
		st.next = plan.firstAt(st.resume)
	}
	key := st.bucket.Unix()
	if b, ok := ps.buckets[key]; ok {
		// The stream left this bucket and came back (the profile was
		// disabled and enabled again): whatever happened in between was
		// not logged.
		b.Partial = true
		return true, nil
	}
	ps.buckets[key] = &LogBucket{Start: st.bucket, DownsamplingPercent: percent, Requests: plan.requests,
		Sampled: plan.records, Partial: partial}
	return true, nil
}

// downsamplingPercent is the profile's downsampling_percent, 100 when it
// has none.
func downsamplingPercent(p rtldProfile) float64 {
	if p.DownsamplingPercent == nil {
		return 100
	}
	return *p.DownsamplingPercent
}

// LogBucket is what the delivery engine did with one FIVE_MINUTES bucket of
// a profile's stream: the ground truth a test compares a receiver's counts
// with.
type LogBucket struct {
	// Start of the bucket.
	Start time.Time
	// DownsamplingPercent is the profile's share in force for the bucket
	// (100: none): the one when the stream reached the bucket.
	DownsamplingPercent float64
	// Requests is the model's final requests_edge_total of the bucket (all
	// countries: what the Metrics API answers once the bucket settled), and
	// Sampled = accesslog.SampledCount(Requests, DownsamplingPercent) the
	// records the profile logs of it.
	Requests, Sampled int64
	// Partial is set when the stream did not cover the whole bucket: the
	// profile was created or enabled within it, or (without live delivery)
	// DeliverRecords skipped to the present.
	Partial bool
	// Drawn counts the records taken from the stream so far, before the
	// filters and faults; a complete bucket has Drawn == Sampled.
	Drawn int64
	// Filtered counts the drawn records the profile's filters dropped.
	Filtered int64
	// Skipped counts the records EnvironmentFaults.DropRecordPercent
	// dropped.
	Skipped int64
	// Lost counts the records in batches EnvironmentFaults.DropBatchPercent
	// lost.
	Lost int64
	// Queued counts the records in batches queued for sending: what a
	// receiver gets once every batch is acknowledged.
	Queued int64
}

// count adds the records to a counter of their buckets.
func (ps *profileState) count(recs []logRecord, field func(*LogBucket) *int64) {
	for _, r := range recs {
		if b, ok := ps.buckets[r.bucket]; ok {
			*field(b)++
		}
	}
}

// prune forgets the buckets that started before t, except the one the
// stream is in.
func (ps *profileState) prune(t time.Time) {
	for k, b := range ps.buckets {
		if b.Start.Before(t) && (ps.stream == nil || !b.Start.Equal(ps.stream.bucket)) {
			delete(ps.buckets, k)
		}
	}
}

// logBuckets returns the profile's buckets in time order.
func (e *deliveryEngine) logBuckets(profileID int64) []LogBucket {
	e.mu.Lock()
	ps, ok := e.profiles[profileID]
	e.mu.Unlock()
	if !ok {
		return nil
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]LogBucket, 0, len(ps.buckets))
	for _, b := range ps.buckets {
		out = append(out, *b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}
