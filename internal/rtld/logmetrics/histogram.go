package logmetrics

import (
	"math"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Native histogram settings of cdn_logs_total_time_seconds, as client_golang
// names them: schema 3 (buckets at most 9% wide, NativeHistogramBucketFactor
// 1.1), the default zero bucket, and at most 160 buckets; beyond, the
// buckets are widened (the schema lowered), never reset: a reset would
// restart the classic buckets and the count too.
const (
	nativeSchema     = 3
	nativeMinSchema  = -4
	nativeMaxBuckets = 160
	nativeZero       = prometheus.DefNativeHistogramZeroThreshold
)

// schema3Bounds are the fractions (of math.Frexp) where the buckets of
// schema 3 end: 2^(i/8)/2, the values client_golang uses.
var schema3Bounds = [8]float64{
	0.5, 0.5452538663326288, 0.5946035575013605, 0.6484197773255048,
	0.7071067811865475, 0.7711054127039704, 0.8408964152537144, 0.9170040432046711,
}

// histogram is one label set of cdn_logs_total_time_seconds: the classic
// buckets and the native histogram's exponential ones, kept by Metrics under
// its lock. It is client_golang's Histogram without the atomics and the
// sync.Map its lock-free observers need, which cost 4 to 10 times as much
// per observation (BenchmarkHistogramObserve); the scrape builds the metric
// through client_golang's NewConstNativeHistogram and adds the classic
// buckets, and TestHistogramMatchesClientGolang checks the result against
// client_golang's own Histogram fed the same values.
type histogram struct {
	count   uint64
	sum     float64
	classic []uint64 // per classic bucket, the last one +Inf (not cumulative)
	schema  int32
	zero    uint64 // observations in the zero bucket
	buckets map[int32]uint64
	created time.Time
}

func newHistogram(classicBounds int, created time.Time) *histogram {
	return &histogram{classic: make([]uint64, classicBounds+1), schema: nativeSchema, buckets: map[int32]uint64{}, created: created}
}

// observe adds v, a finite number of at least 0, with the classic bounds
// given.
func (h *histogram) observe(v float64, bounds []float64) {
	h.count++
	h.sum += v
	h.classic[sort.SearchFloat64s(bounds, v)]++
	if v <= nativeZero {
		h.zero++
		return
	}
	h.buckets[nativeKey(v, h.schema)]++
	if len(h.buckets) > nativeMaxBuckets && h.schema > nativeMinSchema {
		h.widen() // one step per observation, as client_golang
	}
}

// nativeKey returns the index of the native bucket of schema holding v > 0:
// bucket i holds (2^((i-1)/2^schema), 2^(i/2^schema)].
func nativeKey(v float64, schema int32) int32 {
	frac, exp := math.Frexp(v)
	i := 0
	for i < len(schema3Bounds) && schema3Bounds[i] < frac {
		i++
	}
	key := int32(i + (exp-1)*len(schema3Bounds))
	for s := int32(nativeSchema); s > schema; s-- {
		key = wider(key)
	}
	return key
}

// wider returns the index in the next lower schema of bucket key: buckets
// 2j-1 and 2j become bucket j.
func wider(key int32) int32 {
	if key > 0 {
		key++
	}
	return key / 2
}

// widen halves the resolution: every two buckets merge into one.
func (h *histogram) widen() {
	h.schema--
	merged := make(map[int32]uint64, len(h.buckets)/2+1)
	for k, c := range h.buckets {
		merged[wider(k)] += c
	}
	h.buckets = merged
}

// histogramSample is a histogram as copied for a scrape.
type histogramSample struct {
	labels  []string
	count   uint64
	sum     float64
	classic []uint64
	schema  int32
	zero    uint64
	buckets map[int]int64
	created time.Time
}

func (h *histogram) sample(labels []string) histogramSample {
	s := histogramSample{labels: labels, count: h.count, sum: h.sum, classic: append([]uint64(nil), h.classic...),
		schema: h.schema, zero: h.zero, buckets: make(map[int]int64, len(h.buckets)), created: h.created}
	for k, c := range h.buckets {
		s.buckets[int(k)] = int64(c)
	}
	return s
}

// metric builds the sample's metric with desc: the native histogram, as
// client_golang encodes it, with the classic buckets (bounds) added.
func (s histogramSample) metric(desc *prometheus.Desc, bounds []float64) (prometheus.Metric, error) {
	native, err := prometheus.NewConstNativeHistogram(desc, s.count, s.sum, s.buckets, nil, s.zero, s.schema, nativeZero, s.created, s.labels...)
	if err != nil {
		return nil, err
	}
	m := &dto.Metric{}
	if err := native.Write(m); err != nil {
		return nil, err
	}
	var cum uint64
	m.Histogram.Bucket = make([]*dto.Bucket, len(bounds))
	for i, b := range bounds {
		cum += s.classic[i]
		m.Histogram.Bucket[i] = &dto.Bucket{CumulativeCount: new(cum), UpperBound: new(b)}
	}
	return writtenMetric{desc, m}, nil
}

// writtenMetric is a metric already written into its dto form.
type writtenMetric struct {
	desc *prometheus.Desc
	m    *dto.Metric
}

func (w writtenMetric) Desc() *prometheus.Desc { return w.desc }

func (w writtenMetric) Write(out *dto.Metric) error {
	out.Label, out.Histogram, out.TimestampMs = w.m.Label, w.m.Histogram, w.m.TimestampMs
	return nil
}
