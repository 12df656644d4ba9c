package logmetrics

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// Names of the metrics.
const (
	RequestsName      = "cdn_logs_requests_total"
	ResponseBytesName = "cdn_logs_response_bytes_total"
	TotalTimeName     = "cdn_logs_total_time_seconds"
	SeriesName        = "edgepipe_rtld_log_metrics_series"
	SeriesLimitName   = "edgepipe_rtld_log_metrics_series_limit"
	DroppedName       = "edgepipe_rtld_log_metrics_dropped_records_total"
	InvalidName       = "edgepipe_rtld_log_metrics_invalid_values_total"
)

// budgetLogInterval is how often refused label sets are logged again while
// refusals go on.
const budgetLogInterval = 10 * time.Minute

// Metrics holds the live traffic metrics of the records the receiver
// accepted. Hand it to ingest as its rtld.SpoolObserver and register it as
// a prometheus.Collector; it is safe for concurrent use.
//
// The metrics are built at scrape time from the totals Metrics holds (the
// histogram's too: see histogram).
type Metrics struct {
	cfg       Config
	want      fieldSet
	optFields []field // the field of each optional label, in cfg.Labels order
	topN      []bool  // whether each optional label is a top-N label
	histCost  int     // series of one histogram label set
	now       func() time.Time

	requests, respBytes, totalTime    *prometheus.Desc
	seriesD, limitD, droppedD, invalD *prometheus.Desc

	scratch sync.Pool // *scratch

	mu       sync.Mutex
	envs     map[string]*envState
	held     int // series held, counted against cfg.MaxSeries
	invalid  [numFields]uint64
	nextRoll time.Time
	lastWarn time.Time
	unlogged uint64 // refused records not logged yet
}

// envState is what Metrics holds for one environment.
type envState struct {
	id      string
	series  map[string]*series     // by key: optional labels, status class, cache_status
	hists   map[string]*histSeries // by the optional labels' part of it
	tops    []*topN                // per optional label; nil when not top-N
	dropped uint64                 // records refused by the budget
}

// series is one label set of the counters.
type series struct {
	labels   []string // environment_id, status_class, cache_status, optional labels
	requests uint64
	bytes    float64
	hist     *histSeries
	seen     int64 // unix seconds of the last record
}

// histSeries is one label set of the histogram, shared by the counters'
// label sets that differ only in status_class and cache_status.
type histSeries struct {
	key    string
	labels []string // environment_id, optional labels
	h      *histogram
	refs   int
}

// maxOptional is the number of optional labels.
const maxOptional = 3

// parsed is what the metrics take of one record. The byte slices alias
// the record (or hold its unescaped values).
type parsed struct {
	class     uint8
	bytesOut  float64
	totalTime float64
	hasTime   bool
	cache     []byte
	opt       [maxOptional][]byte
}

// scratch is a batch's parsed records, reused across batches.
type scratch struct {
	recs    []parsed
	layout  layout
	key     []byte
	invalid [numFields]uint64
}

// New returns Metrics configured by cfg, or an error naming every setting
// that cannot work.
func New(cfg Config) (*Metrics, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("log metrics: invalid configuration: %w", err)
	}
	cfg.Labels = slices.Clone(cfg.Labels)
	m := &Metrics{
		cfg: cfg, now: time.Now, envs: map[string]*envState{},
		histCost: len(cfg.Buckets) + 3,
	}
	m.want = 1<<fieldStatus | 1<<fieldCache | 1<<fieldBytes | 1<<fieldTime
	for _, l := range cfg.Labels {
		f, _ := fieldOf([]byte(l))
		m.want |= 1 << f
		m.optFields = append(m.optFields, f)
		m.topN = append(m.topN, slices.Contains(topNLabels, l))
	}
	m.nextRoll = m.now().Add(cfg.TopNWindow)
	counterLabels := append([]string{"environment_id", "status_class", "cache_status"}, cfg.Labels...)
	m.requests = prometheus.NewDesc(RequestsName,
		"Access-log records accepted, each counted once however often the platform resent its batch; status_class from status_code (unknown when absent or not 100-599).",
		counterLabels, nil)
	m.respBytes = prometheus.NewDesc(ResponseBytesName,
		"Sum of the bytes_out of the access-log records counted in cdn_logs_requests_total.", counterLabels, nil)
	m.totalTime = prometheus.NewDesc(TotalTimeName,
		"total_time of the access-log records counted in cdn_logs_requests_total that carry one (seconds); classic buckets and a native histogram.",
		append([]string{"environment_id"}, cfg.Labels...), nil)
	m.seriesD = prometheus.NewDesc(SeriesName,
		"Series of the cdn_logs_* metrics held (2 per label set of the counters, buckets+3 per label set of the histogram), counted against --log-metrics.max-series.", nil, nil)
	m.limitD = prometheus.NewDesc(SeriesLimitName, "The series budget of the cdn_logs_* metrics, --log-metrics.max-series (absent when unlimited).", nil, nil)
	m.droppedD = prometheus.NewDesc(DroppedName,
		"Accepted records not counted in the cdn_logs_* metrics because their label set would have exceeded --log-metrics.max-series.",
		[]string{"environment_id"}, nil)
	m.invalD = prometheus.NewDesc(InvalidName,
		"Record values the cdn_logs_* metrics could not use: a status_code not from 100 to 599 (counted as unknown), a bytes_out or total_time that is not a number of at least 0 (left out).",
		[]string{"field"}, nil)
	m.scratch.New = func() any { return &scratch{} }
	return m, nil
}

// ObserveSpooled counts the records of a batch ingest made durable. Ingest
// stores a batch with identity once however often the platform resends it
// (see rtld.SpoolObserver), so every call counts. It implements
// rtld.SpoolObserver.
func (m *Metrics) ObserveSpooled(b *accesslog.Batch) {
	now := m.now()
	s, _ := m.scratch.Get().(*scratch)
	m.parse(b.Records, s)
	m.mu.Lock()
	m.apply(b.EnvironmentID, s, now)
	m.mu.Unlock()
	clear(s.recs) // drop the references to the records
	s.layout.reset()
	s.recs, s.invalid = s.recs[:0], [numFields]uint64{}
	m.scratch.Put(s)
}

// parse reads the fields of every record into s.recs.
func (m *Metrics) parse(recs []json.RawMessage, s *scratch) {
	for _, rec := range recs {
		var raw rawFields
		if !scanRecord(rec, m.want, &raw, &s.layout) {
			scanRecordSlow(rec, m.want, &raw)
		}
		var p parsed
		if v := raw[fieldStatus]; present(v) {
			var ok bool
			if p.class, ok = statusClass(v); !ok {
				s.invalid[fieldStatus]++
			}
		}
		if v := raw[fieldBytes]; present(v) {
			var ok bool
			if p.bytesOut, ok = number(v); !ok {
				s.invalid[fieldBytes]++
			}
		}
		if v := raw[fieldTime]; present(v) {
			if p.totalTime, p.hasTime = number(v); !p.hasTime {
				s.invalid[fieldTime]++
			}
		}
		p.cache = labelValue(raw[fieldCache])
		for i, f := range m.optFields {
			p.opt[i] = labelValue(raw[f])
		}
		s.recs = append(s.recs, p)
	}
}

// present reports whether a raw value is there and not null.
func present(v []byte) bool { return len(v) > 0 && string(v) != "null" }

// apply counts the parsed records of environment env. m.mu is held.
func (m *Metrics) apply(env string, s *scratch, now time.Time) {
	m.maybeRoll(now)
	e := m.env(env)
	sec := now.Unix()
	for i := range s.recs {
		p := &s.recs[i]
		key := s.key[:0]
		for j := range m.optFields {
			if e.tops[j] != nil {
				p.opt[j] = e.tops[j].label(p.opt[j])
			}
			key = append(append(key, p.opt[j]...), 0xff) // 0xff is never in UTF-8
		}
		histLen := len(key)
		key = append(append(key, p.class), p.cache...)
		s.key = key
		se := e.series[string(key)]
		if se == nil {
			if se = m.newSeries(e, key, histLen, p, now); se == nil {
				e.dropped++
				continue
			}
		}
		se.requests++
		se.bytes += p.bytesOut
		se.seen = sec
		if p.hasTime {
			se.hist.h.observe(p.totalTime, m.cfg.Buckets)
		}
	}
	for f, n := range s.invalid {
		m.invalid[f] += n
	}
}

// env returns the state of environment id, created on first use.
func (m *Metrics) env(id string) *envState {
	if e := m.envs[id]; e != nil {
		return e
	}
	e := &envState{id: id, series: map[string]*series{}, hists: map[string]*histSeries{}, tops: make([]*topN, len(m.optFields))}
	for j, top := range m.topN {
		if top {
			e.tops[j] = newTopN(m.cfg.TopN)
		}
	}
	m.envs[e.id] = e
	return e
}

// newSeries adds the label set key of record p (its first histLen bytes
// name the histogram's label set), or returns nil when the series budget
// has no room for it.
func (m *Metrics) newSeries(e *envState, key []byte, histLen int, p *parsed, now time.Time) *series {
	h := e.hists[string(key[:histLen])]
	cost := 2
	if h == nil {
		cost += m.histCost
	}
	if m.cfg.MaxSeries > 0 && m.held+cost > m.cfg.MaxSeries {
		m.refused(e, now)
		return nil
	}
	if h == nil {
		labels := make([]string, 1+len(m.optFields))
		labels[0] = e.id
		for j := range m.optFields {
			labels[1+j] = string(p.opt[j])
		}
		h = &histSeries{key: string(key[:histLen]), labels: labels, h: newHistogram(len(m.cfg.Buckets), now)}
		e.hists[h.key] = h
	}
	h.refs++
	labels := make([]string, 0, 3+len(m.optFields))
	labels = append(labels, e.id, statusClasses[p.class], string(p.cache))
	se := &series{labels: append(labels, h.labels[1:]...), hist: h}
	e.series[string(key)] = se
	m.held += cost
	return se
}

// refused logs, at most every budgetLogInterval, the records the budget
// refused.
func (m *Metrics) refused(e *envState, now time.Time) {
	m.unlogged++
	if !m.lastWarn.IsZero() && now.Sub(m.lastWarn) < budgetLogInterval {
		return
	}
	m.cfg.Logger.Warn("log metrics series budget reached: records of new label sets are not counted in the cdn_logs_* metrics "+
		"(those held keep counting); raise --log-metrics.max-series or keep fewer --log-metrics.labels",
		"environment_id", e.id, "refused_records", m.unlogged, "series", m.held, "max_series", m.cfg.MaxSeries)
	m.lastWarn, m.unlogged = now, 0
}

// maybeRoll ends the top-N window when it is over: every environment's
// top N are reconsidered, label sets without a record for SeriesTTL are
// dropped and old batch identities forgotten. m.mu is held.
func (m *Metrics) maybeRoll(now time.Time) {
	if now.Before(m.nextRoll) {
		return
	}
	m.nextRoll = now.Add(m.cfg.TopNWindow)
	cutoff := now.Add(-m.cfg.SeriesTTL).Unix()
	for _, e := range m.envs {
		for _, t := range e.tops {
			if t != nil {
				t.roll()
			}
		}
		m.expire(e, cutoff)
	}
}

// expire drops e's label sets without a record since cutoff (unix
// seconds), and histogram label sets no longer used.
func (m *Metrics) expire(e *envState, cutoff int64) {
	for k, se := range e.series {
		if se.seen >= cutoff {
			continue
		}
		delete(e.series, k)
		m.held -= 2
		h := se.hist
		if h.refs--; h.refs == 0 {
			delete(e.hists, h.key)
			m.held -= m.histCost
		}
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.requests, m.respBytes, m.totalTime, m.seriesD, m.limitD, m.droppedD, m.invalD} {
		ch <- d
	}
}

// sample is a label set's counters as read for a scrape.
type sample struct {
	labels   []string
	requests uint64
	bytes    float64
}

// Collect implements prometheus.Collector. The totals are copied under the
// lock and the metrics built after it, so a scrape holds ingest up only
// for the copy.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	m.maybeRoll(m.now())
	n := 0
	for _, e := range m.envs {
		n += len(e.series)
	}
	samples := make([]sample, 0, n)
	var hists []histogramSample
	dropped := make(map[string]uint64, len(m.envs))
	for id, e := range m.envs {
		for _, se := range e.series {
			samples = append(samples, sample{se.labels, se.requests, se.bytes})
		}
		for _, h := range e.hists {
			hists = append(hists, h.h.sample(h.labels))
		}
		dropped[id] = e.dropped
	}
	held, invalid := m.held, m.invalid
	m.mu.Unlock()

	for _, s := range samples {
		ch <- prometheus.MustNewConstMetric(m.requests, prometheus.CounterValue, float64(s.requests), s.labels...)
		ch <- prometheus.MustNewConstMetric(m.respBytes, prometheus.CounterValue, s.bytes, s.labels...)
	}
	for _, h := range hists {
		hm, err := h.metric(m.totalTime, m.cfg.Buckets)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(m.totalTime, err)
			continue
		}
		ch <- hm
	}
	ch <- prometheus.MustNewConstMetric(m.seriesD, prometheus.GaugeValue, float64(held))
	if m.cfg.MaxSeries > 0 {
		ch <- prometheus.MustNewConstMetric(m.limitD, prometheus.GaugeValue, float64(m.cfg.MaxSeries))
	}
	for id, n := range dropped {
		ch <- prometheus.MustNewConstMetric(m.droppedD, prometheus.CounterValue, float64(n), id)
	}
	for _, f := range []field{fieldStatus, fieldBytes, fieldTime} {
		ch <- prometheus.MustNewConstMetric(m.invalD, prometheus.CounterValue, float64(invalid[f]), fieldCodes[f])
	}
}
