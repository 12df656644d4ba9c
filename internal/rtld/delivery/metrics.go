package delivery

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the delivery workers' self-metrics, labelled by sink. Create
// them once with NewMetrics and share them between the workers.
type Metrics struct {
	records *prometheus.CounterVec
	batches *prometheus.CounterVec
	errors  *prometheus.CounterVec
	seconds *prometheus.HistogramVec
	// deferred: seconds a worker held batches back while ingest was
	// saturated.
	deferred *prometheus.CounterVec

	// Of a sink delivered by a PartitionWorker, by partition.
	partitionUnconfirmed *prometheus.CounterVec
	partitionFailing     *prometheus.GaugeVec
	partitionQueued      *prometheus.GaugeVec
	partitionBehind      *prometheus.GaugeVec
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
		deferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_sink_deferred_seconds_total",
			Help: "Time a sink's worker held back batches it had read while ingest was saturated (ingest goes first; each batch at most 5 s after it was spooled).",
		}, []string{"sink"}),
	}
	m.partitionUnconfirmed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgepipe_rtld_sink_partition_unconfirmed_records_total",
		Help: "Records sent to a partition in a write the sink never confirmed (no answer, or written without full acknowledgement) and sent again: the most records the partition can hold twice.",
	}, []string{"sink", "partition"})
	m.partitionFailing = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "edgepipe_rtld_sink_partition_failing",
		Help: "1 while deliveries to a partition fail (its leader is probed until it answers; the other partitions go on).",
	}, []string{"sink", "partition"})
	m.partitionQueued = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "edgepipe_rtld_sink_partition_queued_records",
		Help: "Records read from the spool and waiting in memory for their partition.",
	}, []string{"sink", "partition"})
	m.partitionBehind = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "edgepipe_rtld_sink_partition_behind",
		Help: "1 while a partition that fell behind (its share of the memory for waiting records was full) reads its records from the spool again itself.",
	}, []string{"sink", "partition"})
	reg.MustRegister(m.records, m.batches, m.errors, m.seconds, m.deferred,
		m.partitionUnconfirmed, m.partitionFailing, m.partitionQueued, m.partitionBehind)
	return m
}

// initPartition exposes a partition's series from the start (0 until
// something happens).
func (m *Metrics) initPartition(sink, partition string) {
	m.partitionUnconfirmed.WithLabelValues(sink, partition)
	m.partitionFailing.WithLabelValues(sink, partition)
	m.partitionQueued.WithLabelValues(sink, partition)
	m.partitionBehind.WithLabelValues(sink, partition)
}
