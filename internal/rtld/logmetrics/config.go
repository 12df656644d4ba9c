// Package logmetrics derives live traffic metrics from the access-log
// records the receiver accepts: cdn_logs_requests_total,
// cdn_logs_response_bytes_total and the cdn_logs_total_time_seconds
// histogram, by environment, status class, cache status and a configurable
// set of record fields, within a series budget.
//
// Metrics is told about every batch ingest made durable (it is an
// rtld.SpoolObserver), which is each batch with an identity once, however
// often the platform resent it; it is a prometheus.Collector that builds the
// counters at scrape time from the totals it holds.
package logmetrics

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// The optional labels: record fields that may label the metrics besides
// environment_id (and, on the counters, status_class and cache_status).
const (
	// LabelPOP is the record's pop: the POP that served the request.
	LabelPOP = "pop"
	// LabelHost is the record's host, kept as a top-N label.
	LabelHost = "host"
	// LabelCountry is the record's client_country_code, kept as a top-N
	// label.
	LabelCountry = "client_country_code"
)

// OtherValue is the value a top-N label takes for the values outside an
// environment's top N.
const OtherValue = "other"

// Defaults of Config (and of the receiver's --log-metrics.* flags).
const (
	// DefaultLabels is the default optional label set, comma-separated.
	DefaultLabels = LabelPOP
	// DefaultTopN is how many values of a top-N label keep their own value
	// per environment.
	DefaultTopN = 20
	// DefaultTopNWindow is how often the top-N members are reconsidered.
	DefaultTopNWindow = 10 * time.Minute
	// DefaultMaxSeries is the default series budget: at the default labels,
	// an environment with 50 POPs, 6 cache statuses and 6 status classes
	// takes about 4,600 series, so the budget holds about ten such
	// environments before it refuses label sets.
	DefaultMaxSeries = 50_000
	// DefaultSeriesTTL is how long a label set that receives no record
	// stays exposed (as the exporter's --prometheus.series-ttl).
	DefaultSeriesTTL = 24 * time.Hour
)

// topNLabels are the labels kept as top-N; the others take every value.
var topNLabels = []string{LabelHost, LabelCountry}

// optionalLabels lists the labels Config.Labels may name.
var optionalLabels = []string{LabelPOP, LabelHost, LabelCountry}

// defaultBuckets are the classic buckets of cdn_logs_total_time_seconds:
// cache hits take milliseconds, misses tens to hundreds of milliseconds,
// large downloads seconds.
func defaultBuckets() []float64 {
	return []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
}

// Config configures Metrics.
type Config struct {
	// Labels are the optional labels, a subset of pop, host and
	// client_country_code (LabelPOP, LabelHost, LabelCountry). Nil means
	// DefaultLabels; an empty, non-nil slice means none: environment_id,
	// status_class and cache_status only.
	Labels []string
	// TopN is how many values of host and client_country_code keep their
	// own label value per environment; the others are counted as
	// OtherValue (default DefaultTopN).
	TopN int
	// TopNWindow is how often each environment's top N are reconsidered
	// (default DefaultTopNWindow); see topN.
	TopNWindow time.Duration
	// MaxSeries bounds the series exposed (0: no bound). A label set costs
	// 2 series (the two counters), and its histogram label set, when new,
	// len(Buckets)+3 more (buckets, +Inf, _sum, _count). Beyond it records
	// of new label sets are not counted in the cdn_logs_* metrics but in
	// edgepipe_rtld_log_metrics_dropped_records_total.
	MaxSeries int
	// SeriesTTL is how long a label set that receives no record stays
	// exposed (default DefaultSeriesTTL); it is checked at every
	// TopNWindow. A label set that comes back starts from zero, which
	// rate() and increase() take as a counter reset.
	SeriesTTL time.Duration
	// Buckets are the classic buckets of cdn_logs_total_time_seconds, in
	// seconds (default 1 ms to 10 s). The native histogram is kept beside
	// them.
	Buckets []float64
	// Logger receives the series budget's warnings (default: discard).
	Logger *slog.Logger
}

// withDefaults returns c with every unset field set to its default.
func (c Config) withDefaults() Config {
	if c.Labels == nil {
		c.Labels = strings.Split(DefaultLabels, ",")
	}
	if c.TopN == 0 {
		c.TopN = DefaultTopN
	}
	if c.TopNWindow == 0 {
		c.TopNWindow = DefaultTopNWindow
	}
	if c.SeriesTTL == 0 {
		c.SeriesTTL = DefaultSeriesTTL
	}
	if c.Buckets == nil {
		c.Buckets = defaultBuckets()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// validate reports every setting of c (with defaults applied) that cannot
// work.
func (c Config) validate() error {
	var errs []error
	for i, l := range c.Labels {
		switch {
		case !slices.Contains(optionalLabels, l):
			errs = append(errs, fmt.Errorf("label %q: want one of %s", l, strings.Join(optionalLabels, ", ")))
		case slices.Contains(c.Labels[:i], l):
			errs = append(errs, fmt.Errorf("label %q given twice", l))
		}
	}
	if c.TopN < 0 {
		errs = append(errs, fmt.Errorf("TopN %d: must be positive", c.TopN))
	}
	if c.TopNWindow < 0 {
		errs = append(errs, fmt.Errorf("TopNWindow %s: must be positive", c.TopNWindow))
	}
	if c.MaxSeries < 0 {
		errs = append(errs, fmt.Errorf("MaxSeries %d: must not be negative (0: no bound)", c.MaxSeries))
	}
	if c.SeriesTTL < 0 {
		errs = append(errs, fmt.Errorf("SeriesTTL %s: must be positive", c.SeriesTTL))
	}
	if len(c.Buckets) == 0 {
		errs = append(errs, errors.New("no histogram buckets"))
	}
	for i, b := range c.Buckets {
		if !(b > 0) || (i > 0 && b <= c.Buckets[i-1]) {
			errs = append(errs, fmt.Errorf("histogram buckets %v: want positive bounds in increasing order", c.Buckets))
			break
		}
	}
	return errors.Join(errs...)
}

// Fields returns the log-field codes the metrics read with the labels
// cfg.Labels (nil: DefaultLabels): a profile that restricts its fields must
// request them, or the metrics see every record as unknown.
func Fields(labels []string) []string {
	f := []string{"status_code", "cache_status", "bytes_out", "total_time"}
	if labels == nil {
		labels = strings.Split(DefaultLabels, ",")
	}
	for _, l := range optionalLabels {
		if slices.Contains(labels, l) {
			f = append(f, l)
		}
	}
	return f
}
