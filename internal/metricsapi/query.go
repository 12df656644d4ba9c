package metricsapi

import (
	"strings"
	"time"
)

// Query asks for a time series of one dataset over a range of buckets for a set
// of environments. The client splits it into as many API requests as the limits
// require and merges the answers.
type Query struct {
	Dataset      string
	Environments []string
	Granularity  Granularity
	// Start is inclusive and End exclusive; both are aligned to Granularity
	// by the caller.
	Start, End time.Time
	// Labels are the dimensions to group by besides time and environment_id;
	// nil asks for every one of the dataset's.
	Labels []string
	// Metrics to return; nil asks for every one of the dataset's.
	Metrics []string
	// Filters are optional further filters, by filter name.
	Filters map[string][]string
}

// Row is one bucket of one series: the values of a result's metrics for one
// environment, one combination of label values and one time bucket.
type Row struct {
	// Time is the bucket start, UTC.
	Time        time.Time
	Environment string
	// Labels holds the values of Result.Labels, in that order.
	Labels []string
	// Values holds the values of Result.Metrics, in that order. Every entry
	// is a value (finite; not negative for a count) or NaN, which means the
	// bucket has no value for that metric: the API sent none, or sent
	// something that is not a value (null, "NaN", ±Inf, a negative count,
	// text), counted in Result.Problems. NaN is never a value.
	Values []float64
}

// SeriesKey identifies the row's series (environment and label values) within
// one dataset; rows of the same series at other times share it.
func (r *Row) SeriesKey() string {
	var b strings.Builder
	n := len(r.Environment)
	for _, l := range r.Labels {
		n += 1 + len(l)
	}
	b.Grow(n)
	b.WriteString(r.Environment)
	for _, l := range r.Labels {
		b.WriteByte(0xff)
		b.WriteString(l)
	}
	return b.String()
}

// Result is the merged answer to a Query.
type Result struct {
	// Labels are the label dimensions of every row, in the order of Row.Labels.
	Labels []string
	// Metrics are the metrics of every row, in the order of Row.Values.
	Metrics []string
	// Rows come in no particular order; buckets without traffic are missing.
	Rows []Row
	// Requests is the number of data requests the query took.
	Requests int
	// Problems counts the values that were not values and the malformed
	// rows the answers held; those rows are not in Rows.
	Problems Problems
}
