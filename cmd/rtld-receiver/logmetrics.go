package main

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/rtld/logmetrics"
)

// logMetricsFlags are the --log-metrics.* flags.
type logMetricsFlags struct {
	enabled    bool
	labels     string
	topN       int
	topNWindow time.Duration
	maxSeries  int
	seriesTTL  time.Duration
}

// add declares the flags on app.
func (l *logMetricsFlags) add(app *cli.App) {
	app.Flag("log-metrics.enabled", "Derive live traffic metrics from the accepted records: cdn_logs_requests_total, cdn_logs_response_bytes_total and the cdn_logs_total_time_seconds histogram (classic and native), each batch counted once however often it was resent.").
		Default("true").BoolVar(&l.enabled)
	app.Flag("log-metrics.labels", "Record fields that label the log metrics besides environment_id (and status_class, cache_status on the counters): any of pop, host, client_country_code, comma-separated; empty for none. host and client_country_code keep their --log-metrics.top-n most frequent values per environment, the rest are \"other\".").
		Default(logmetrics.DefaultLabels).StringVar(&l.labels)
	app.Flag("log-metrics.top-n", "Values of host and client_country_code per environment that keep their own label value.").
		Default(strconv.Itoa(logmetrics.DefaultTopN)).IntVar(&l.topN)
	app.Flag("log-metrics.top-n-window", "How often the top-N values are reconsidered: a value replaces a member that counted less than half as many records over the last windows.").
		Default(logmetrics.DefaultTopNWindow.String()).DurationVar(&l.topNWindow)
	app.Flag("log-metrics.max-series", "Most series of the log metrics (2 per label set of the counters, histogram buckets + 3 per label set of the histogram); records of new label sets beyond it are counted in edgepipe_rtld_log_metrics_dropped_records_total instead, and logged. 0: no limit.").
		Default(strconv.Itoa(logmetrics.DefaultMaxSeries)).IntVar(&l.maxSeries)
	app.Flag("log-metrics.series-ttl", "Drop a label set of the log metrics that has had no record for this long (it starts from zero if it comes back).").
		Default(logmetrics.DefaultSeriesTTL.String()).DurationVar(&l.seriesTTL)
}

// config returns the log metrics' configuration, nil when they are off, or
// an error naming every flag that cannot work.
func (l *logMetricsFlags) config() (*logmetrics.Config, error) {
	if !l.enabled {
		return nil, nil
	}
	var errs []error
	if l.topN < 1 {
		errs = append(errs, fmt.Errorf("--log-metrics.top-n must be at least 1, got %d", l.topN))
	}
	if l.topNWindow <= 0 {
		errs = append(errs, fmt.Errorf("--log-metrics.top-n-window must be positive, got %s", l.topNWindow))
	}
	if l.maxSeries < 0 {
		errs = append(errs, fmt.Errorf("--log-metrics.max-series must not be negative (0: no limit), got %d", l.maxSeries))
	}
	if l.seriesTTL <= 0 {
		errs = append(errs, fmt.Errorf("--log-metrics.series-ttl must be positive, got %s", l.seriesTTL))
	}
	labels := cli.SplitList(l.labels)
	if labels == nil {
		labels = []string{} // none, not the default
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &logmetrics.Config{Labels: labels, TopN: l.topN, TopNWindow: l.topNWindow, MaxSeries: l.maxSeries, SeriesTTL: l.seriesTTL}, nil
}
