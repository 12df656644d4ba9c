package metricsapi

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Request is one data request a Query is split into: at most MaxFilterValues
// environments (and values of any other filter) and at most
// Granularity.MaxRange of time.
type Request struct {
	Dataset      string
	Environments []string
	Granularity  Granularity
	// Start is inclusive, End exclusive, both aligned to Granularity.
	Start, End time.Time
	// Labels are the label dimensions asked for besides time and
	// environment_id.
	Labels  []string
	Metrics []string
	// Filters are the further filters, environment_id excluded.
	Filters map[string][]string
}

// Body is the JSON body of POST /metrics/v1/datasets/{name}/data.
type Body struct {
	DateRange       DateRange           `json:"date_range"`
	Dimensions      []string            `json:"dimensions"`
	Metrics         []string            `json:"metrics"`
	Filters         map[string][]string `json:"filters"`
	TimeGranularity Granularity         `json:"time_granularity"`
}

// DateRange is a query's date_range; start inclusive, end exclusive.
type DateRange struct {
	Start string `json:"start"`
	End   string `json:"end"`
}

// wireTime is how the client writes instants: ISO 8601 in UTC.
const wireTime = "2006-01-02T15:04:05Z"

// Dimensions returns the dimensions the request asks for: time,
// environment_id, then its labels.
func (r *Request) Dimensions() []string {
	return append([]string{DimensionTime, DimensionEnvironment}, r.Labels...)
}

// Body returns the request's JSON body. The time dimension and the
// granularity are always explicit, so the API never picks one itself.
func (r *Request) Body() Body {
	filters := make(map[string][]string, len(r.Filters)+1)
	for k, v := range r.Filters {
		filters[k] = v
	}
	filters[DimensionEnvironment] = r.Environments
	return Body{
		DateRange: DateRange{
			Start: r.Start.UTC().Format(wireTime),
			End:   r.End.UTC().Format(wireTime),
		},
		Dimensions:      r.Dimensions(),
		Metrics:         r.Metrics,
		Filters:         filters,
		TimeGranularity: r.Granularity,
	}
}

// Plan splits q into the requests the API's limits allow, in time order:
// environments in chunks of at most MaxFilterValues (ceil(n/20) chunks), the
// range in spans of at most Granularity.MaxRange, and any other filter with
// more than MaxFilterValues values in chunks too (allowed only when that
// filter is also a requested label, since otherwise the chunks' rows could not
// be told apart). An unaligned Start or End is widened to whole buckets.
// Environments and labels are deduplicated; q.Labels and q.Metrics are used as
// given (Client.Data fills in the dataset's when they are nil). A query with
// no environments or an empty range plans no requests.
func Plan(q Query) ([]Request, error) {
	if q.Dataset == "" {
		return nil, errors.New("plan query: no dataset")
	}
	fail := func(format string, a ...any) error {
		return fmt.Errorf("plan query of %s: %s", q.Dataset, fmt.Sprintf(format, a...))
	}
	g, err := ParseGranularity(string(q.Granularity))
	if err != nil {
		return nil, fail("%v", err)
	}
	if len(q.Metrics) == 0 {
		return nil, fail("no metrics")
	}
	if q.Start.IsZero() || q.End.IsZero() {
		return nil, fail("start and end are required")
	}
	if q.End.Before(q.Start) {
		return nil, fail("end %s before start %s", q.End.UTC().Format(wireTime), q.Start.UTC().Format(wireTime))
	}
	envs := dedupe(q.Environments)
	if extra, ok := q.Filters[DimensionEnvironment]; ok {
		envs = dedupe(append(envs, extra...))
	}
	for _, e := range envs {
		if e == "" {
			return nil, fail("empty environment ID")
		}
	}
	var labels []string
	for _, l := range dedupe(q.Labels) {
		if l != DimensionTime && l != DimensionEnvironment {
			labels = append(labels, l)
		}
	}
	metrics := dedupe(q.Metrics)

	start := g.Truncate(q.Start)
	end := g.Truncate(q.End)
	if end.Before(q.End) {
		end = end.Add(g.Duration())
	}
	if len(envs) == 0 || !start.Before(end) {
		return nil, nil
	}

	// Other filters: each a list of value chunks; the requests cover their
	// cartesian product.
	type filterChunks struct {
		name   string
		chunks [][]string
	}
	var filters []filterChunks
	names := make([]string, 0, len(q.Filters))
	for name := range q.Filters {
		if name != DimensionEnvironment {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		vals := dedupe(q.Filters[name])
		if len(vals) == 0 {
			return nil, fail("filter %s has no values", name)
		}
		if len(vals) > MaxFilterValues && !slices.Contains(labels, name) {
			return nil, fail("filter %s has %d values (at most %d per request) and is not a requested label, so the request cannot be split",
				name, len(vals), MaxFilterValues)
		}
		filters = append(filters, filterChunks{name: name, chunks: chunk(vals, MaxFilterValues)})
	}
	combos := []map[string][]string{nil}
	for _, f := range filters {
		next := make([]map[string][]string, 0, len(combos)*len(f.chunks))
		for _, c := range combos {
			for _, vals := range f.chunks {
				m := make(map[string][]string, len(c)+1)
				for k, v := range c {
					m[k] = v
				}
				m[f.name] = vals
				next = append(next, m)
			}
		}
		combos = next
	}

	var out []Request
	for s := start; s.Before(end); {
		e := s.Add(g.MaxRange())
		if e.After(end) {
			e = end
		}
		for _, envChunk := range chunk(envs, MaxFilterValues) {
			for _, f := range combos {
				out = append(out, Request{
					Dataset:      q.Dataset,
					Environments: envChunk,
					Granularity:  g,
					Start:        s,
					End:          e,
					Labels:       labels,
					Metrics:      metrics,
					Filters:      f,
				})
			}
		}
		s = e
	}
	return out, nil
}

// dedupe returns vals without repeats, in first-seen order.
func dedupe(vals []string) []string {
	if len(vals) == 0 {
		return nil
	}
	seen := make(map[string]bool, len(vals))
	out := make([]string, 0, len(vals))
	for _, v := range vals {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// chunk splits vals into consecutive slices of at most n.
func chunk(vals []string, n int) [][]string {
	var out [][]string
	for len(vals) > n {
		out = append(out, vals[:n:n])
		vals = vals[n:]
	}
	return append(out, vals)
}
