// Package metricsapi is a typed client for the platform's Metrics API
// (/metrics/v1): dataset descriptors and the data query. The client enforces the
// API's limits itself, splitting a query into requests of at most MaxFilterValues
// environments and at most Granularity.MaxRange of time, and decodes rows keyed
// by their dimension values.
package metricsapi

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MaxFilterValues is the largest number of values the API accepts in one filter,
// and so the largest number of environments one data request can cover.
const MaxFilterValues = 20

// Well-known dimension names every dataset carries.
const (
	DimensionTime        = "time"
	DimensionEnvironment = "environment_id"
)

// Granularity is the width of a time bucket (the API's time_granularity).
type Granularity string

// The granularities the API offers.
const (
	FiveMinutes Granularity = "FIVE_MINUTES"
	Hour        Granularity = "HOUR"
	Day         Granularity = "DAY"
)

// Granularities lists every granularity, finest first.
var Granularities = []Granularity{FiveMinutes, Hour, Day}

// ParseGranularity accepts a granularity name in any case.
func ParseGranularity(s string) (Granularity, error) {
	g := Granularity(strings.ToUpper(strings.TrimSpace(s)))
	switch g {
	case FiveMinutes, Hour, Day:
		return g, nil
	}
	return "", fmt.Errorf("unknown granularity %q (want FIVE_MINUTES, HOUR or DAY)", s)
}

// Duration is the width of one bucket.
func (g Granularity) Duration() time.Duration {
	switch g {
	case FiveMinutes:
		return 5 * time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	}
	return 0
}

// MaxRange is the longest date range one request may cover at this granularity.
func (g Granularity) MaxRange() time.Duration {
	switch g {
	case FiveMinutes:
		return 24 * time.Hour
	case Hour:
		return 7 * 24 * time.Hour
	case Day:
		return 60 * 24 * time.Hour
	}
	return 0
}

// Truncate returns the start of the bucket that holds t (buckets are aligned to
// UTC midnight).
func (g Granularity) Truncate(t time.Time) time.Time {
	return t.UTC().Truncate(g.Duration())
}

// DataType is the type of a dimension, metric or data field.
type DataType string

// The data types of the API.
const (
	TypeDate   DataType = "DATE"
	TypeString DataType = "STRING"
	TypeNumber DataType = "NUMBER"
)

// Dimension describes one dimension of a dataset.
type Dimension struct {
	Name        string   `json:"name"`
	Type        DataType `json:"type"`
	Description string   `json:"description,omitempty"`
}

// Metric describes one metric of a dataset.
type Metric struct {
	Name        string   `json:"name"`
	Type        DataType `json:"type"`
	Description string   `json:"description,omitempty"`
	CreatedAt   string   `json:"created_at,omitempty"`
}

// Filter describes one filter a data query of the dataset accepts.
type Filter struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Required    bool   `json:"required"`
	Description string `json:"description,omitempty"`
}

// Retention is the dataset's data_retention_policy, in seconds per granularity.
type Retention struct {
	FiveMinutes int64 `json:"five_minutes"`
	Hour        int64 `json:"hour"`
	Day         int64 `json:"day"`
}

// For returns how far back data of granularity g is kept (0 when unknown).
func (r Retention) For(g Granularity) time.Duration {
	var s int64
	switch g {
	case FiveMinutes:
		s = r.FiveMinutes
	case Hour:
		s = r.Hour
	case Day:
		s = r.Day
	}
	return time.Duration(s) * time.Second
}

// Dataset is a dataset descriptor as GET /metrics/v1/datasets returns it. The
// descriptor drives everything downstream: table columns, metric names, labels.
type Dataset struct {
	Name              string        `json:"name"`
	Description       string        `json:"description,omitempty"`
	TimeGranularities []Granularity `json:"time_granularities"`
	Retention         Retention     `json:"data_retention_policy"`
	Dimensions        []Dimension   `json:"dimensions"`
	Metrics           []Metric      `json:"metrics"`
	Filters           []Filter      `json:"filters"`
	// Aggregated lists the label dimensions of the platform's descriptor
	// that this view of the dataset leaves out (see Select): queries do
	// not ask for them, so the API aggregates over them. Empty for a
	// descriptor as the API sent it.
	Aggregated []string `json:"-"`
}

// Labels returns the dataset's dimensions other than time and environment_id,
// in descriptor order: the dimensions that tell one series from another within
// an environment.
func (d *Dataset) Labels() []Dimension {
	out := make([]Dimension, 0, len(d.Dimensions))
	for _, dim := range d.Dimensions {
		if dim.Name == DimensionTime || dim.Name == DimensionEnvironment {
			continue
		}
		out = append(out, dim)
	}
	return out
}

// LabelNames returns the names of Labels.
func (d *Dataset) LabelNames() []string {
	labels := d.Labels()
	out := make([]string, len(labels))
	for i, l := range labels {
		out[i] = l.Name
	}
	return out
}

// MetricNames returns the names of the dataset's metrics in descriptor order.
func (d *Dataset) MetricNames() []string {
	out := make([]string, len(d.Metrics))
	for i, m := range d.Metrics {
		out[i] = m.Name
	}
	return out
}

// Supports reports whether the dataset offers granularity g. A descriptor that
// lists no granularities is taken to offer all of them.
func (d *Dataset) Supports(g Granularity) bool {
	if len(d.TimeGranularities) == 0 {
		return true
	}
	for _, x := range d.TimeGranularities {
		if Granularity(strings.ToUpper(string(x))) == g {
			return true
		}
	}
	return false
}

// MetricKind says how a metric's values may be combined, derived from its name
// by the API's naming conventions.
type MetricKind int

// The kinds of metric.
const (
	// KindGauge is a value that cannot be summed across buckets: ratios and
	// anything not otherwise recognised.
	KindGauge MetricKind = iota
	// KindCount is a count within the bucket (requests_*_total, bytes_*_total);
	// bucket values add up.
	KindCount
	// KindRate is a per-second rate over the bucket.
	KindRate
	// KindPercentile is a latency percentile in milliseconds.
	KindPercentile
)

// MetricInfo is what the naming conventions tell about a metric.
type MetricInfo struct {
	Kind MetricKind
	// Stem is the name without the percentile part, for KindPercentile
	// ("ttfb_edge_ms_95_percentile" has stem "ttfb_edge").
	Stem string
	// Percentile is P of a KindPercentile metric, as the API writes it ("95").
	Percentile string
	// Unit is the UCUM unit of the source value: "ms", "By", "{request}",
	// "bit/s", "{request}/s" or "1".
	Unit string
}

// Classify derives a metric's kind and unit from its API name.
func Classify(name string) MetricInfo {
	switch {
	case strings.HasSuffix(name, "_percentile"):
		// <stem>_ms_<P>_percentile
		base := strings.TrimSuffix(name, "_percentile")
		if i := strings.LastIndexByte(base, '_'); i > 0 {
			p := base[i+1:]
			if _, err := strconv.ParseFloat(p, 64); err == nil {
				stem := strings.TrimSuffix(base[:i], "_ms")
				return MetricInfo{Kind: KindPercentile, Stem: stem, Percentile: p, Unit: "ms"}
			}
		}
	case strings.HasSuffix(name, "_total"):
		if strings.HasPrefix(name, "bytes_") {
			return MetricInfo{Kind: KindCount, Unit: "By"}
		}
		return MetricInfo{Kind: KindCount, Unit: "{request}"}
	case strings.Contains(name, "_per_second"):
		if strings.HasPrefix(name, "bits_") {
			return MetricInfo{Kind: KindRate, Unit: "bit/s"}
		}
		return MetricInfo{Kind: KindRate, Unit: "{request}/s"}
	}
	return MetricInfo{Kind: KindGauge, Unit: "1"}
}
