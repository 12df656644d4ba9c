package delivery

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the delivery workers' self-metrics, labelled by sink. Create
// them once with NewMetrics and share them between the workers.
type Metrics struct {
	records *prometheus.CounterVec
	batches *prometheus.CounterVec
	errors  *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

// NewMetrics creates the delivery metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_sink_delivered_records_total",
			Help: "Records delivered to a sink and acknowledged by it.",
		}, []string{"sink"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_sink_delivered_batches_total",
			Help: "Spooled batches delivered to a sink and acknowledged by it.",
		}, []string{"sink"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_sink_errors_total",
			Help: "Failed delivery attempts to a sink (each is retried with backoff).",
		}, []string{"sink"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "edgepipe_rtld_sink_delivery_seconds",
			Help:    "Duration of successful deliveries of a group of spooled batches to a sink.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"sink"}),
	}
	reg.MustRegister(m.records, m.batches, m.errors, m.seconds)
	return m
}
