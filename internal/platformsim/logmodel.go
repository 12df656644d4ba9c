package platformsim

import (
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// The access logs of the traffic model.
//
// Every record a profile gets is one of the requests the Metrics API
// counts. For one environment and FIVE_MINUTES bucket the model's final edge
// traffic (countries(): per country a status class × cache status table
// with bytes and latency) is lined up in a fixed order: country (in the
// order of the countries table), status class (2xx, 3xx, 4xx, 5xx), cache
// status (hit, miss, stale). The i-th request (from 0) is logged when
// accesslog.SampledCount(i+1, p) > accesslog.SampledCount(i, p), p the
// profile's downsampling_percent (100 when unset): systematic sampling. So a
// bucket of N requests yields exactly SampledCount(N, p) records, and every
// run of consecutive requests (a country; a country's status class; one
// cell) yields its size × p/100 records within one. A country's cache
// statuses, which cut across its status classes, are each within four.
//
// The logged requests are then put into a pseudo-random order (a Feistel
// permutation) and spread evenly over the bucket: record j of T gets the
// timestamp start + (j + u) × 5 min / T, u uniform in [0, 1). Records are
// computed one at a time from (seed, environment, bucket, position), so a
// stream holds no more than one bucket's cell table, whatever its size.
//
// A record's fields follow its cell: status_code within the class (the
// 5xx codes exactly as edge_errors splits them), cache_status from the cache
// status (hit: TCP_HIT, or TCP_PARTIAL_HIT for a 206; stale:
// TCP_EXPIRED_HIT; miss: TCP_MISS, TCP_REFRESH_MISS, CONFIG_NOCACHE or
// UNCACHEABLE), client_country_code the country in upper case ("-" for
// unknown), bytes_out shares of the cell's bytes that sum to them exactly,
// total_time and time_to_first_byte drawn from the country's latency
// percentiles.

// Cache statuses of the model, in cell order.
const (
	cacheHit = iota
	cacheMiss
	cacheStale
)

// logCell is one (country, status class, cache status) cell of a bucket.
type logCell struct {
	country, class, cache int
	first                 int64 // index of the cell's first request in the bucket's order
	n                     int64 // requests
	bytes                 int64 // bytes sent for them
}

// bucketPlan is one bucket of an environment's traffic as a profile with
// downsampling percent logs it.
type bucketPlan struct {
	start    time.Time
	h        hasher
	percent  float64
	requests int64     // N, the Metrics API's requests_edge_total
	records  int64     // SampledCount(N, percent)
	cells    []logCell // in the bucket's order
	ends     []int64   // records logged up to the end of each cell
	finals   []countryFinal
	first5xx []int64   // per country: index of its first 5xx request
	codes    [][]int64 // per country: 5xx requests up to the end of each edgeErrorCodes entry
	perm     permutation
}

// logBucketWidth is the width of a FIVE_MINUTES bucket.
const logBucketWidth = 5 * time.Minute

// logPlan builds the plan of an environment's bucket starting at start for
// a profile with downsampling percent (100 for none); false when the
// environment is gone.
func (s *Server) logPlan(envID string, start time.Time, percent float64) (*bucketPlan, bool) {
	w := s.w()
	idx, ok := w.envByID[envID]
	if !ok {
		return nil, false
	}
	b := s.bucket(w, idx, metricsapi.FiveMinutes, start, start)
	p := &bucketPlan{start: start, h: b.h.s("logs"), percent: percent, finals: b.countries(),
		first5xx: make([]int64, len(countries)), codes: make([][]int64, len(countries))}
	for i, f := range p.finals {
		if f.edge > 0 {
			p.addCountry(i, f, b.errorCodes(i, f))
		}
	}
	p.records = accesslog.SampledCount(p.requests, percent)
	p.perm = newPermutation(p.records, p.h.s("order"))
	return p, true
}

// addCountry appends the cells of country i.
func (p *bucketPlan) addCountry(i int, f countryFinal, codes []float64) {
	var sum int64
	for _, n := range codes {
		sum += int64(n)
		p.codes[i] = append(p.codes[i], sum)
	}
	for k := range 4 {
		if k == 3 {
			p.first5xx[i] = p.requests
		}
		for j := range 3 {
			n := int64(f.n[k][j])
			if n == 0 {
				continue
			}
			p.cells = append(p.cells, logCell{country: i, class: k, cache: j, first: p.requests, n: n, bytes: int64(f.bytes[k][j])})
			p.requests += n
			p.ends = append(p.ends, accesslog.SampledCount(p.requests, p.percent))
		}
	}
}

// end is the end of the plan's bucket.
func (p *bucketPlan) end() time.Time { return p.start.Add(logBucketWidth) }

// timestamp returns the time of record j (delivery order) in Unix
// microseconds: the records spread evenly over the bucket, strictly inside
// it and non-decreasing in j.
func (p *bucketPlan) timestamp(j int64) int64 {
	const span = int64(logBucketWidth / time.Microsecond)
	u := p.h.s("ts").i(j).u()
	off := int64((float64(j) + u) / float64(p.records) * float64(span))
	return p.start.UnixMicro() + min(off, span-1)
}

// firstAt returns the first record whose timestamp is at or after t.
func (p *bucketPlan) firstAt(t time.Time) int64 {
	us := t.UnixMicro()
	return int64(sort.Search(int(p.records), func(j int) bool { return p.timestamp(int64(j)) >= us }))
}

// request returns record j (delivery order) of the plan.
func (p *bucketPlan) request(j int64, rc *recordContext) *logRequest {
	q := p.perm.at(j)
	c := p.cells[sort.Search(len(p.ends), func(k int) bool { return p.ends[k] > q })]
	// The q-th logged request: the first i whose prefix logs more than q.
	i := c.first + int64(sort.Search(int(c.n), func(r int) bool {
		return accesslog.SampledCount(c.first+int64(r)+1, p.percent) > q
	}))
	r := &logRequest{h: p.h.s("request").i(i), rc: rc, ts: p.timestamp(j), bucket: p.start.Unix(), geo: geoOf(countries[c.country].code)}
	r.status = p.status(c, i, r.h)
	r.cache, r.hit = cacheStatusOf(c.cache, r.status, r.h)
	r.bytesOut = cellShare(c.bytes, c.n, i-c.first)
	r.timing(&p.finals[c.country])
	r.describe()
	return r
}

// status picks the status code of request i of cell c: 5xx codes follow the
// country's edge_errors split, the other classes a fixed mix.
func (p *bucketPlan) status(c logCell, i int64, h hasher) int64 {
	if c.class < 3 {
		return pickWeighted(h.s("status").u(), classStatuses[c.class])
	}
	rank := i - p.first5xx[c.country]
	codes := p.codes[c.country]
	k := sort.Search(len(codes), func(k int) bool { return codes[k] > rank })
	n, _ := strconv.ParseInt(edgeErrorCodes[min(k, len(codes)-1)], 10, 64)
	return n
}

// weighted is a value with a weight, for pickWeighted.
type weighted[T any] struct {
	v T
	w float64
}

// pickWeighted returns the value whose share of the total weight holds u in
// [0, 1).
func pickWeighted[T any](u float64, xs []weighted[T]) T {
	var sum float64
	for _, x := range xs {
		sum += x.w
	}
	u *= sum
	for _, x := range xs {
		if u < x.w {
			return x.v
		}
		u -= x.w
	}
	return xs[len(xs)-1].v
}

// classStatuses are the status codes of the 2xx, 3xx and 4xx classes.
var classStatuses = [3][]weighted[int64]{
	{{200, 0.9}, {206, 0.05}, {204, 0.05}},
	{{304, 0.6}, {301, 0.2}, {302, 0.2}},
	{{404, 0.55}, {403, 0.2}, {400, 0.1}, {429, 0.1}, {401, 0.05}},
}

// missStatuses are the cache_status values of requests the cache did not
// answer.
var missStatuses = []weighted[string]{{"TCP_MISS", 0.8}, {"TCP_REFRESH_MISS", 0.1}, {"CONFIG_NOCACHE", 0.05}, {"UNCACHEABLE", 0.05}}

// cacheStatusOf returns the cache_status of a request of the model's cache
// status, and whether the cache served it (hit or stale).
func cacheStatusOf(cache int, status int64, h hasher) (string, bool) {
	switch cache {
	case cacheHit:
		if status == 206 {
			return "TCP_PARTIAL_HIT", true
		}
		return "TCP_HIT", true
	case cacheStale:
		return "TCP_EXPIRED_HIT", true
	}
	return pickWeighted(h.s("miss").u(), missStatuses), false
}

// CacheStatusCategory maps a record's cache_status to the Metrics API's
// request counters it falls under: "hit" (requests_hit_total), "stale"
// (requests_stale_total) or "miss" (requests_miss_total), as the simulator
// writes them.
func CacheStatusCategory(cacheStatus string) string {
	switch cacheStatus {
	case "TCP_HIT", "TCP_PARTIAL_HIT":
		return "hit"
	case "TCP_EXPIRED_HIT":
		return "stale"
	}
	return "miss"
}

// cellShare returns the bytes of request r of a cell of n requests and
// bytes bytes: shares around the mean (0.1 to 1.9 times it) that sum to the
// cell's bytes exactly.
func cellShare(bytes, n, r int64) int64 {
	upTo := func(k int64) int64 {
		if k >= n {
			return bytes
		}
		x := float64(k) / float64(n)
		const waves = 7
		w := x + 0.9*math.Sin(2*math.Pi*waves*x)/(2*math.Pi*waves) // increasing: w' ≥ 0.1
		return int64(math.Floor(float64(bytes) * w))
	}
	return upTo(r+1) - upTo(r)
}

// percentilePoints are the percentiles of the model's latencies as shares.
var percentilePoints = [6]float64{0.05, 0.25, 0.5, 0.75, 0.95, 0.99}

// quantile reads a latency distribution given in milliseconds at
// percentilePoints at u in [0, 1), in seconds: linear between the points,
// down to half of P5 and up to 1.5 times P99 in the tails.
func quantile(v [6]float64, u float64) float64 {
	pts := percentilePoints
	switch {
	case u < pts[0]:
		return v[0] * (0.5 + 0.5*u/pts[0]) / 1000
	case u >= pts[5]:
		return v[5] * (1 + 0.5*(u-pts[5])/(1-pts[5])) / 1000
	}
	k := 1
	for u >= pts[k] {
		k++
	}
	f := (u - pts[k-1]) / (pts[k] - pts[k-1])
	return (v[k-1] + f*(v[k]-v[k-1])) / 1000
}
