package reconcile

import "github.com/prometheus/client_golang/prometheus"

// metrics are the reconciliation's counters. A nil *metrics (a replica
// that does not compare) counts nothing.
type metrics struct {
	buckets, api, records *prometheus.CounterVec
	skipped               *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, envs []string, s *store) *metrics {
	m := &metrics{
		buckets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_reconciled_buckets_total",
			Help: "FIVE_MINUTES buckets whose accepted log records were compared with the Metrics API's requests.",
		}, []string{"environment_id"}),
		api: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_reconciled_api_requests_total",
			Help: "Over the compared buckets: the records the Metrics API's requests_edge_total (edge_usage_by_country, all countries) implies at the profile's sampling share, floor(requests × share) per bucket.",
		}, []string{"environment_id"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_reconciled_log_records_total",
			Help: "Over the compared buckets: accepted log records whose timestamp falls in them, each counted once however often it was delivered (records arriving after the comparison included).",
		}, []string{"environment_id"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_reconcile_skipped_buckets_total",
			Help: "FIVE_MINUTES buckets not compared, by reason (never counted as a loss).",
		}, []string{"environment_id", "reason"}),
	}
	// Every series from the start, so that increase() and rate() see the
	// first bucket counted (a series born at 1 shows no increase).
	for _, env := range envs {
		m.buckets.WithLabelValues(env)
		m.api.WithLabelValues(env)
		m.records.WithLabelValues(env)
		for _, reason := range Reasons {
			m.skipped.WithLabelValues(env, reason)
		}
	}
	untimed := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "edgepipe_rtld_reconcile_untimed_records_total",
		Help: "Accepted records without a usable timestamp field, which no bucket can count (request the timestamp field).",
	}, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(s.untimed)
	})
	reg.MustRegister(m.buckets, m.api, m.records, m.skipped, untimed)
	return m
}

// compare counts a compared bucket.
func (m *metrics) compare(env string, expected, records int64) {
	if m == nil {
		return
	}
	m.buckets.WithLabelValues(env).Inc()
	m.api.WithLabelValues(env).Add(float64(expected))
	m.records.WithLabelValues(env).Add(float64(records))
}

// late counts records that arrived for a compared bucket.
func (m *metrics) late(env string, n int64) {
	if m == nil {
		return
	}
	m.records.WithLabelValues(env).Add(float64(n))
}

// skip counts a skipped bucket.
func (m *metrics) skip(env, reason string) {
	if m == nil {
		return
	}
	m.skipped.WithLabelValues(env, reason).Inc()
}
