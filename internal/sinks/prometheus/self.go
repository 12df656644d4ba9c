package prometheus

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
)

// SelfMetrics are the exporter's own edgepipe_* metrics. It implements
// schedule.Observer and the platform client's Observer
// (ObserveRequest), so it can be handed to both.
type SelfMetrics struct {
	now func() time.Time

	discoveryUp    prometheus.Gauge
	invalidValues  *prometheus.CounterVec
	invalidRows    *prometheus.CounterVec
	deferredRows   *prometheus.CounterVec
	decreases      *prometheus.CounterVec
	skewDesc       *prometheus.Desc
	skewMu         sync.Mutex
	skew           func() (time.Duration, bool)
	apiRequests    *prometheus.CounterVec
	apiDuration    *prometheus.HistogramVec
	pollDuration   *prometheus.HistogramVec
	pollFailures   *prometheus.CounterVec
	lastSuccess    *prometheus.GaugeVec
	up             *prometheus.GaugeVec
	revisions      *prometheus.CounterVec
	buckets        *prometheus.CounterVec
	publishErrors  *prometheus.CounterVec
	baseline       *prometheus.CounterVec
	stateFailures  *prometheus.CounterVec
	environments   prometheus.Gauge
	lagDesc        *prometheus.Desc
	newestBucketMu sync.Mutex
	newestBucket   map[string]time.Time
}

// NewSelfMetrics creates the self-metrics and registers them and the
// standard Go and process collectors on reg (the program registers its
// build info). now is the clock bucket lag is measured with (nil: time.Now).
func NewSelfMetrics(reg prometheus.Registerer, now func() time.Time) (*SelfMetrics, error) {
	if now == nil {
		now = time.Now
	}
	m := &SelfMetrics{
		now: now,
		discoveryUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgepipe_discovery_up",
			Help: "1 if the last discovery of environments and datasets succeeded, else 0 (0 until the first succeeds).",
		}),
		invalidValues: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_invalid_values_total",
			Help: "API metric values that were not numbers (null, NaN, inf, negative counts, not_a_number) and were skipped; the bucket kept its last good value.",
		}, []string{"dataset", "reason"}),
		invalidRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_invalid_rows_total",
			Help: "Malformed API rows (not_an_array, arity, time, environment, dimension) skipped; the rest of the answer was used.",
		}, []string{"dataset", "reason"}),
		deferredRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_deferred_rows_total",
			Help: "API rows of buckets that had not ended by the platform's clock when polled; left for a later poll.",
		}, []string{"dataset"}),
		decreases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_count_decreases_ignored_total",
			Help: "Revisions that lowered an API count already published; counts never go down, so the decrease was not applied in any sink.",
		}, []string{"dataset"}),
		skewDesc: prometheus.NewDesc("edgepipe_platform_clock_skew_seconds",
			"The platform's clock (Date header of its answers) minus this machine's clock, smoothed; absent before the first answer.", nil, nil),
		apiRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_api_requests_total",
			Help: "HTTP requests to the platform API by service, method and status (0: no answer).",
		}, []string{"service", "method", "status"}),
		apiDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "edgepipe_api_request_duration_seconds",
			Help:    "Duration of HTTP requests to the platform API by service.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"service"}),
		pollDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "edgepipe_poll_duration_seconds",
			Help:    "Duration of one poll of a dataset (all environments, retries included).",
			Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"dataset"}),
		pollFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_poll_failures_total",
			Help: "Polls of a dataset that failed; the next poll covers their range.",
		}, []string{"dataset"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edgepipe_last_successful_poll_timestamp_seconds",
			Help: "Unix time of the last successful poll of a dataset.",
		}, []string{"dataset"}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edgepipe_dataset_up",
			Help: "1 if the last poll of a dataset succeeded, else 0.",
		}, []string{"dataset"}),
		revisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_revisions_total",
			Help: "Buckets published again because the API revised their values (late data).",
		}, []string{"dataset"}),
		buckets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_buckets_total",
			Help: "Buckets (one series, one time) published for the first time.",
		}, []string{"dataset"}),
		publishErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_publish_errors_total",
			Help: "Batches a sink failed to accept, by sink and dataset.",
		}, []string{"sink", "dataset"}),
		baseline: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_baseline_buckets_total",
			Help: "Buckets of a baseline poll (the first poll after a start without --state.dir): remembered and shown as gauges and rows, not counted.",
		}, []string{"dataset"}),
		stateFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_state_save_failures_total",
			Help: "Polls whose state could not be saved to --state.dir; a restart would resume from an older state.",
		}, []string{"dataset"}),
		environments: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgepipe_environments",
			Help: "Environments served by this instance (after sharding).",
		}),
		lagDesc: prometheus.NewDesc("edgepipe_bucket_lag_seconds",
			"Seconds from the end of the newest bucket received for a dataset until now.", []string{"dataset"}, nil),
		newestBucket: make(map[string]time.Time),
	}
	for _, c := range []prometheus.Collector{
		m.discoveryUp, m.invalidValues, m.invalidRows, m.deferredRows, m.decreases, skewCollector{m},
		m.apiRequests, m.apiDuration, m.pollDuration, m.pollFailures, m.lastSuccess, m.up,
		m.revisions, m.buckets, m.publishErrors, m.baseline, m.stateFailures, m.environments, lagCollector{m},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register self-metrics: %w", err)
		}
	}
	return m, nil
}

// ExpectDatasets exports edgepipe_dataset_up 0 (and zero problem counters)
// for datasets not polled successfully yet, so a dataset that never gets a
// good poll, because discovery or authentication fails, shows as down
// instead of missing. The exporter calls it at start with --dataset.
func (m *SelfMetrics) ExpectDatasets(names []string) {
	for _, ds := range names {
		m.up.WithLabelValues(ds) // created at 0; an existing value is kept
		m.deferredRows.WithLabelValues(ds)
		m.decreases.WithLabelValues(ds)
		m.stateFailures.WithLabelValues(ds)
		for _, r := range metricsapi.InvalidValueReasons {
			m.invalidValues.WithLabelValues(ds, r)
		}
		for _, r := range metricsapi.InvalidRowReasons {
			m.invalidRows.WithLabelValues(ds, r)
		}
	}
}

// SetClockSkew makes edgepipe_platform_clock_skew_seconds report skew (such
// as schedule.PlatformClock.Skew), read at scrape time while it says it
// knows the skew.
func (m *SelfMetrics) SetClockSkew(skew func() (time.Duration, bool)) {
	m.skewMu.Lock()
	m.skew = skew
	m.skewMu.Unlock()
}

// ObserveDiscovery records a discovery: edgepipe_discovery_up, the
// environments served, and a dataset_up series for each dataset polled.
func (m *SelfMetrics) ObserveDiscovery(r schedule.DiscoveryReport) {
	if r.Err != nil {
		m.discoveryUp.Set(0)
		return
	}
	m.discoveryUp.Set(1)
	m.environments.Set(float64(r.Environments))
	m.ExpectDatasets(r.Datasets)
}

// ObserveRequest counts one HTTP exchange with the platform.
func (m *SelfMetrics) ObserveRequest(service, method string, status int, took time.Duration) {
	m.apiRequests.WithLabelValues(service, method, strconv.Itoa(status)).Inc()
	m.apiDuration.WithLabelValues(service).Observe(took.Seconds())
}

// ObservePoll records a finished poll.
func (m *SelfMetrics) ObservePoll(r schedule.PollReport) {
	m.pollDuration.WithLabelValues(r.Dataset).Observe(r.Duration.Seconds())
	if r.Err != nil {
		m.pollFailures.WithLabelValues(r.Dataset).Inc()
		m.up.WithLabelValues(r.Dataset).Set(0)
		return
	}
	m.up.WithLabelValues(r.Dataset).Set(1)
	m.environments.Set(float64(r.Environments))
	for reason, n := range r.Problems.Values {
		m.invalidValues.WithLabelValues(r.Dataset, reason).Add(float64(n))
	}
	for reason, n := range r.Problems.Rows {
		m.invalidRows.WithLabelValues(r.Dataset, reason).Add(float64(n))
	}
	m.deferredRows.WithLabelValues(r.Dataset).Add(float64(r.Deferred))
	m.decreases.WithLabelValues(r.Dataset).Add(float64(r.Decreases))
	m.lastSuccess.WithLabelValues(r.Dataset).Set(float64(r.Start.Add(r.Duration).UnixNano()) / 1e9)
	m.revisions.WithLabelValues(r.Dataset).Add(float64(r.Revisions))
	m.buckets.WithLabelValues(r.Dataset).Add(float64(r.New))
	if r.Baseline > 0 {
		m.baseline.WithLabelValues(r.Dataset).Add(float64(r.Baseline))
	}
	if r.StateErr != nil {
		m.stateFailures.WithLabelValues(r.Dataset).Inc()
	}
	if !r.NewestBucketEnd.IsZero() {
		m.newestBucketMu.Lock()
		if r.NewestBucketEnd.After(m.newestBucket[r.Dataset]) {
			m.newestBucket[r.Dataset] = r.NewestBucketEnd
		}
		m.newestBucketMu.Unlock()
	}
}

// ObservePublishError counts a batch a sink refused.
func (m *SelfMetrics) ObservePublishError(dataset, sink string, _ error) {
	m.publishErrors.WithLabelValues(sink, dataset).Inc()
}

// skewCollector exposes the platform's clock skew, read at scrape time.
type skewCollector struct{ m *SelfMetrics }

func (c skewCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.m.skewDesc }

func (c skewCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.skewMu.Lock()
	skew := c.m.skew
	c.m.skewMu.Unlock()
	if skew == nil {
		return
	}
	if d, ok := skew(); ok {
		ch <- prometheus.MustNewConstMetric(c.m.skewDesc, prometheus.GaugeValue, d.Seconds())
	}
}

// lagCollector exposes the bucket lag, computed at scrape time.
type lagCollector struct{ m *SelfMetrics }

func (l lagCollector) Describe(ch chan<- *prometheus.Desc) { ch <- l.m.lagDesc }

func (l lagCollector) Collect(ch chan<- prometheus.Metric) {
	now := l.m.now()
	l.m.newestBucketMu.Lock()
	defer l.m.newestBucketMu.Unlock()
	for ds, end := range l.m.newestBucket {
		ch <- prometheus.MustNewConstMetric(l.m.lagDesc, prometheus.GaugeValue, now.Sub(end).Seconds(), ds)
	}
}
