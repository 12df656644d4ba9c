package rtld

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

// Batch outcomes, the "status" label of the received_* counters.
const (
	StatusAccepted     = "accepted"     // spooled and acknowledged
	StatusDuplicate    = "duplicate"    // already spooled; acknowledged without storing again
	StatusUnauthorized = "unauthorized" // 401
	StatusMalformed    = "malformed"    // 400
	StatusTooLarge     = "too_large"    // 413
	StatusUnavailable  = "unavailable"  // 503: spool or disk full, too many requests, memory in use
	StatusError        = "error"        // 5xx: the spool failed
	StatusNotFound     = "not_found"    // unknown environment
)

// Metrics are the receiver's self-metrics. Create them once with NewMetrics
// and hand them to the ingest handler and the gap tracker.
type Metrics struct {
	batches    *prometheus.CounterVec
	records    *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	ackLatency prometheus.Histogram
	inFlight   prometheus.Gauge
	memory     prometheus.Gauge
	gaps       *prometheus.CounterVec
	duplicates *prometheus.CounterVec
	late       *prometheus.CounterVec
	missing    prometheus.Gauge
}

// NewMetrics creates the receiver's metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_batches_received_total",
			Help: "Log batches received, by outcome (accepted, duplicate, unauthorized, malformed, too_large, unavailable, error, not_found).",
		}, []string{"status"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_records_received_total",
			Help: "Log records in received batches that decoded, by outcome.",
		}, []string{"status"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_received_bytes_total",
			Help: "Request body bytes received as sent (usually gzip), by outcome.",
		}, []string{"status"}),
		ackLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "edgepipe_rtld_ack_latency_seconds",
			Help:    "Time from a request's arrival to its answer, for accepted batches (decode, spool write and fsync).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgepipe_rtld_ingest_in_flight_requests",
			Help: "Ingest requests being processed.",
		}),
		memory: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgepipe_rtld_ingest_memory_bytes",
			Help: "Memory held by request bodies in flight, as received and decompressed (bounded by --ingest.max-memory-bytes).",
		}),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_seq_gaps_total",
			Help: "seq_nums never received within the grace period after a later one arrived: batches lost upstream.",
		}, []string{"environment_id", "agent_id"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_duplicate_batches_total",
			Help: "Batches received again with an already received (agent, datestamp, seq_num).",
		}, []string{"environment_id", "agent_id"}),
		late: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgepipe_rtld_late_batches_total",
			Help: "Batches that arrived after their seq_num had been counted as a gap.",
		}, []string{"environment_id", "agent_id"}),
		missing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgepipe_rtld_seq_missing",
			Help: "seq_nums currently missing but still within the grace period (the platform may still retry them).",
		}),
	}
	for _, s := range []string{StatusAccepted, StatusDuplicate, StatusUnauthorized, StatusMalformed, StatusTooLarge, StatusUnavailable, StatusError} {
		m.batches.WithLabelValues(s)
		m.bytes.WithLabelValues(s)
	}
	m.records.WithLabelValues(StatusAccepted)
	reg.MustRegister(m.batches, m.records, m.bytes, m.ackLatency, m.inFlight, m.memory, m.gaps, m.duplicates, m.late,
		m.missing)
	return m
}

// SpoolStatser is what the spool collector needs from the spool.
type SpoolStatser interface {
	Stats() spool.Stats
}

// spoolCollector reads the spool's backlog at scrape time.
type spoolCollector struct {
	s                               SpoolStatser
	bytes, entries, age, lagE, lagB *prometheus.Desc
	corruptB, corruptE, diskFull    *prometheus.Desc
}

// NewSpoolCollector returns a collector of the spool's depth, oldest-entry
// age, per-sink lag, damage found and full-disk state. Register it next to
// the Metrics.
func NewSpoolCollector(s SpoolStatser) prometheus.Collector {
	return &spoolCollector{
		s:        s,
		bytes:    prometheus.NewDesc("edgepipe_rtld_spool_bytes", "Size of the spool's segment files.", nil, nil),
		entries:  prometheus.NewDesc("edgepipe_rtld_spool_entries", "Spooled batches some sink has not yet acknowledged.", nil, nil),
		age:      prometheus.NewDesc("edgepipe_rtld_spool_oldest_entry_age_seconds", "Age of the oldest batch some sink has not yet acknowledged (0 when none).", nil, nil),
		lagE:     prometheus.NewDesc("edgepipe_rtld_sink_lag_entries", "Spooled batches a sink has not yet acknowledged.", []string{"sink"}, nil),
		lagB:     prometheus.NewDesc("edgepipe_rtld_sink_lag_bytes", "Spooled bytes a sink has not yet acknowledged.", []string{"sink"}, nil),
		corruptB: prometheus.NewDesc("edgepipe_rtld_spool_corrupt_bytes_total", "Damaged spool bytes found (at recovery or while reading) and quarantined in *.corrupt files beside their segment.", nil, nil),
		corruptE: prometheus.NewDesc("edgepipe_rtld_spool_corrupt_entries_total", "Spooled batches lost to damaged spool bytes (acknowledged batches that will not be delivered).", nil, nil),
		diskFull: prometheus.NewDesc("edgepipe_rtld_spool_disk_full", "1 while the spool's disk is full: ingest answers 503 and /readyz fails until delivery or the operator frees space.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *spoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.bytes, c.entries, c.age, c.lagE, c.lagB, c.corruptB, c.corruptE, c.diskFull} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *spoolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(st.Entries))
	age := 0.0
	if !st.OldestTime.IsZero() {
		age = time.Since(st.OldestTime).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age)
	for name, lag := range st.Readers {
		if name == GapReader {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.lagE, prometheus.GaugeValue, float64(lag.Entries), name)
		ch <- prometheus.MustNewConstMetric(c.lagB, prometheus.GaugeValue, float64(lag.Bytes), name)
	}
	ch <- prometheus.MustNewConstMetric(c.corruptB, prometheus.CounterValue, float64(st.CorruptBytes))
	ch <- prometheus.MustNewConstMetric(c.corruptE, prometheus.CounterValue, float64(st.CorruptEntries))
	full := 0.0
	if st.NoSpace {
		full = 1
	}
	ch <- prometheus.MustNewConstMetric(c.diskFull, prometheus.GaugeValue, full)
}
