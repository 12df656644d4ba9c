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
	// bucket of dataset at granularity g that is already stored. An
	// environment missing from the map has nothing stored. The scheduler
	// asks once per environment, before its first poll, and then fetches
	// from that point minus the settle window. The implementation bounds
	// how far back it reaches (e.g. --clickhouse.max-backfill); the
	// scheduler further bounds it to the dataset's retention.
	Resume(ctx context.Context, dataset string, g metricsapi.Granularity, envs []string) (map[string]time.Time, error)
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
	// From and To are the bucket range asked for (To exclusive).
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
}

// Observer is told what the scheduler does, for self-metrics. Methods must
// be fast and must not block.
type Observer interface {
	ObservePoll(r PollReport)
	ObservePublishError(dataset, sink string, err error)
}

type nopObserver struct{}

func (nopObserver) ObservePoll(PollReport)                    {}
func (nopObserver) ObservePublishError(string, string, error) {}
