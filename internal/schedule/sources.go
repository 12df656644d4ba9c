package schedule

import (
	"context"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// Fetcher runs a data query against the Metrics API. The metricsapi client
// implements it; it splits the query into as many requests as the API's
// limits require (ceil(environments/20) per range).
type Fetcher interface {
	Data(ctx context.Context, q metricsapi.Query) (*metricsapi.Result, error)
}

// DatasetSource lists the dataset descriptors (GET /metrics/v1/datasets).
type DatasetSource interface {
	Datasets(ctx context.Context) ([]metricsapi.Dataset, error)
}

// EnvironmentSource lists the environments to serve. The scheduler calls it
// at start and then every Config.DiscoveryInterval; Discovery implements it.
type EnvironmentSource interface {
	Environments(ctx context.Context) ([]string, error)
}

// ResumeSource tells where earlier runs left off, so a restart re-fetches
// what a durable sink (ClickHouse) missed while the exporter was down.
type ResumeSource interface {
	// Resume returns, per environment of envs, the start of the newest
	// bucket of dataset ds (as polled: a selection's descriptor is stored
	// apart from the whole dataset's) at granularity g that is already
	// stored. An environment missing from the map has nothing stored. The
	// scheduler asks once per environment, before its first poll, and then
	// fetches from that point minus the settle window. The implementation
	// bounds how far back it reaches (e.g. --clickhouse.max-backfill); the
	// scheduler further bounds it to the dataset's retention.
	Resume(ctx context.Context, ds *metricsapi.Dataset, g metricsapi.Granularity, envs []string) (map[string]time.Time, error)
}

// PollReport describes one finished poll of one dataset.
type PollReport struct {
	Dataset string
	// Start is when the poll began and Duration how long it took.
	Start    time.Time
	Duration time.Duration
	// Err is the fetch error, nil on success. Publish errors are reported
	// separately and do not fail a poll.
	Err error
	// From and To are the bucket range polled (To exclusive): To is the
	// start of the current bucket, or earlier when the platform's newest
	// Date says a later bucket may not have ended there.
	From, To     time.Time
	Environments int
	// Requests is the number of API data requests the query took.
	Requests int
	// Rows received, buckets seen for the first time, and revisions
	// (buckets whose values changed since they were published).
	Rows, New, Revisions int
	// NewestBucketEnd is the end of the newest bucket received by this
	// poll (zero when no rows came back).
	NewestBucketEnd time.Time
	// Problems counts the values that were not values (the buckets kept
	// their last good value) and the malformed rows skipped.
	Problems metricsapi.Problems
	// Decreases counts count values lower than the value already published
	// for their bucket; they were not applied.
	Decreases int
	// Held counts buckets seen for the first time without a value for
	// every count: not published yet; the next poll fetches them again.
	Held int
	// Baseline counts buckets of a baseline poll (Restart): remembered,
	// published for gauges and rows, not counted.
	Baseline int
	// Replayed counts unchanged buckets republished by the first poll
	// after a Restore.
	Replayed int
	// StateErr is set when the tracker's state could not be saved
	// (Config.State); the poll itself succeeded.
	StateErr error
	// Deferred counts rows whose bucket starts at or after the poll's end
	// (To): by the platform's clock they may not have ended. They were not
	// published; the HighWaterMark stays before them, so a later poll
	// fetches them again.
	Deferred int
}

// DiscoveryReport describes one discovery (environments and datasets).
type DiscoveryReport struct {
	// Err is nil when the discovery succeeded.
	Err error
	// Environments is the number of environments served after it.
	Environments int
	// Datasets are the datasets polled after it (on success).
	Datasets []string
}

// Observer is told what the scheduler does, for self-metrics. Methods must
// be fast and must not block.
type Observer interface {
	ObservePoll(r PollReport)
	ObservePublishError(dataset, sink string, err error)
}

// DiscoveryObserver is implemented by Observers that also want to know the
// outcome of every discovery (for edgepipe_discovery_up). The same rules
// apply: fast, never blocking.
type DiscoveryObserver interface {
	ObserveDiscovery(r DiscoveryReport)
}

type nopObserver struct{}

func (nopObserver) ObservePoll(PollReport)                    {}
func (nopObserver) ObservePublishError(string, string, error) {}
