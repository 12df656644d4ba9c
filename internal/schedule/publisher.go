package schedule

import (
	"context"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// Update is one bucket of one series that a sink has not seen in this form:
// its first sighting, a revision whose values changed, or (in the first poll
// after a Restore) a replay of what was published before.
type Update struct {
	Row metricsapi.Row
	// Previous holds the values published before for this bucket, in the
	// order of Row.Values, or nil on a first sighting. A replay has
	// Previous equal to Row.Values.
	Previous []float64
	// Latest reports that the bucket is published for the first time, is
	// later than every bucket of its series published before, and ended
	// within the settle window before the poll's end: a sink that sends
	// each bucket once, as a point in time order (OTLP gauges), sends
	// exactly these. A baseline bucket is never Latest.
	Latest bool
}

// Revision reports whether the update replaces a bucket published before.
func (u *Update) Revision() bool { return u.Previous != nil }

// SeriesCounts is the state of the counts of one series after a poll: the
// running totals that Prometheus counters expose, and, when Point is set,
// a point of the series at the poll's end (Batch.End) for sinks that push
// counts as cumulative or delta sums (OTLP).
type SeriesCounts struct {
	Environment string
	// Labels holds the values of Batch.Labels, in that order.
	Labels []string
	// Totals holds, in the order of Batch.Metrics, the sum of every bucket
	// value of a count counted for the series since Start (a first sighting
	// adds its value, a revision its difference, a baseline nothing), and
	// NaN for metrics that are not counts.
	Totals []float64
	// Start is when counting began for the series; it does not change for
	// the series' life (restarts with a state directory included).
	Start time.Time
	// Newest is the start of the newest bucket of the series published.
	Newest time.Time
	// Point reports that the series has a point at Batch.End: the poll's
	// end passed the series' previous point. Points of a series are in
	// time order and never share a timestamp; a revision of an older
	// bucket is folded into the next point.
	Point bool
	// PreviousPoint and PreviousTotals are the time and totals of the
	// series' previous point; PreviousPoint is zero (and PreviousTotals
	// nil) for its first point. A delta spans [PreviousPoint, End), or
	// [Start, End) for the first point.
	PreviousPoint  time.Time
	PreviousTotals []float64
}

// Batch is what one poll of one dataset produced: every new or changed
// bucket of every environment polled, ordered by bucket time, and the
// totals of the series whose counts changed (every live series when points
// are due or after a Restore).
type Batch struct {
	Dataset     *metricsapi.Dataset
	Granularity metricsapi.Granularity
	// Labels and Metrics name the entries of each Row's Labels and Values
	// and of each SeriesCounts' Labels and Totals.
	Labels  []string
	Metrics []string
	Updates []Update
	Counts  []SeriesCounts
	// End is the end of the bucket range the poll covered: every bucket of
	// the totals ended by then, and it is the time of the points.
	End time.Time
}

// Publisher is a sink of buckets. Publish must not keep a reference to the
// batch's slices after it returns, must not modify them, and must not
// block the poll loop on a sink that is down: sinks that retry do so from
// their own queue.
type Publisher interface {
	Publish(ctx context.Context, b *Batch) error
}

// EnvironmentWatcher is implemented by sinks that hold per-environment state
// and must drop it when an environment goes away (such as Prometheus series).
type EnvironmentWatcher interface {
	// SetEnvironments is called after every discovery with the complete set
	// of environments served.
	SetEnvironments(ids []string)
}

// StateSaver keeps the tracker's state of a dataset across restarts (the
// exporter's --state.dir). Save replaces what was saved for dataset,
// atomically: after a crash either the old or the new state is found.
type StateSaver interface {
	Save(dataset string, state []byte) error
}
