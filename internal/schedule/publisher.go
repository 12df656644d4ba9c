package schedule

import (
	"context"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// Update is one bucket of one series that a sink has not seen in this form:
// either its first sighting or a revision whose values changed.
type Update struct {
	Row metricsapi.Row
	// Previous holds the values published before for this bucket, in the
	// order of Row.Values, or nil on a first sighting. Sinks that export
	// deltas (counters, OTLP delta sums) send Row.Values minus Previous.
	Previous []float64
}

// Revision reports whether the update replaces a bucket published before.
func (u *Update) Revision() bool { return u.Previous != nil }

// Batch is what one poll of one dataset produced: every new or changed bucket
// of every environment polled, in no particular order.
type Batch struct {
	Dataset     *metricsapi.Dataset
	Granularity metricsapi.Granularity
	// Labels and Metrics name the entries of each Row's Labels and Values.
	Labels  []string
	Metrics []string
	Updates []Update
}

// Publisher is a sink of buckets. Publish must not keep a reference to the
// batch's slices after it returns, and must not block the poll loop on a sink
// that is down: sinks that retry do so from their own queue.
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
