package platformsim

import (
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// Limits are the API's limits the simulator enforces, written down here from
// the spec (section 8, platform-api.md) and the platform notes
// (platform-notes.md), not taken from the client: the simulator is an
// independent oracle, so a client that gets a limit wrong is refused by it
// (a test checks that both agree).
type Limits struct {
	// MaxFilterValues is the most values one filter of a data request
	// accepts (notes: "Each filter accepts at most 20 values").
	MaxFilterValues int
	// Granularities lists each time_granularity with its bucket width and
	// the longest date range one request may cover (notes: FIVE_MINUTES
	// 24 hours, HOUR 7 days, DAY 60 days), finest first.
	Granularities []GranularityLimit
	// MinPageSize, MaxPageSize and DefaultPageSize bound page_size of the
	// paginated lists (spec 2.1 and 8: 1 to 100, default 20).
	MinPageSize, MaxPageSize, DefaultPageSize int
	// DefaultRTLDLimit is the default limit of RTLD lists, whose minimum is
	// MinRTLDLimit (spec 8: integer, minimum 1, default 50).
	DefaultRTLDLimit, MinRTLDLimit int
}

// GranularityLimit is one time_granularity's bucket width and longest range.
type GranularityLimit struct {
	Name     string
	Bucket   time.Duration
	MaxRange time.Duration
}

// APILimits returns the limits the simulator enforces.
func APILimits() Limits {
	return Limits{
		MaxFilterValues: 20,
		Granularities: []GranularityLimit{
			{Name: "FIVE_MINUTES", Bucket: 5 * time.Minute, MaxRange: 24 * time.Hour},
			{Name: "HOUR", Bucket: time.Hour, MaxRange: 7 * 24 * time.Hour},
			{Name: "DAY", Bucket: 24 * time.Hour, MaxRange: 60 * 24 * time.Hour},
		},
		MinPageSize:      1,
		MaxPageSize:      100,
		DefaultPageSize:  20,
		DefaultRTLDLimit: 50,
		MinRTLDLimit:     1,
	}
}

// limits is the table every handler reads.
var limits = APILimits()

// granularity returns the limits of the time_granularity named g.
func granularity(g metricsapi.Granularity) (GranularityLimit, bool) {
	for _, gl := range limits.Granularities {
		if gl.Name == string(g) {
			return gl, true
		}
	}
	return GranularityLimit{}, false
}

// bucketOf returns the bucket width of g (0 for an unknown granularity).
func bucketOf(g metricsapi.Granularity) time.Duration {
	gl, _ := granularity(g)
	return gl.Bucket
}

// truncate returns the start of g's bucket holding t; buckets are aligned
// to UTC midnight.
func truncate(g metricsapi.Granularity, t time.Time) time.Time {
	return t.UTC().Truncate(bucketOf(g))
}
