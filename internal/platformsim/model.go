package platformsim

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// The traffic model.
//
// Every value is a pure function of (seed, dataset, environment, dimension
// values, granularity, bucket start) for the final value, and of the time of
// the question for the late-data effect. The model first draws, for one
// environment and bucket, the final edge traffic of every country (a joint
// table of status class × cache status, bytes, prefetches, latency). Every
// dataset is derived from those finals:
//
//   - edge_usage_by_country: the country cells themselves.
//   - edge_errors: each country's 5xx count split over status codes.
//   - origin_usage_by_country: origin requests = misses + half the stale hits
//     (revalidations), split over the environment's origins.
//   - origin_usage: each origin's total split over method × content type.
//   - origin_errors: a Poisson share of each origin_usage cell, split over
//     4xx/5xx codes.
//   - origin_offload: the environment's edge total split over method ×
//     content type, origin counts from origin_usage (never above edge).
//
// Late data: every leaf count is reported as floor(final × c) where the
// completeness c grows monotonically from 0 when the bucket starts to 1 when
// LateData has passed after the bucket's end (0.85 at the end), with a
// per-leaf exponent so leaves converge at different speeds. Counts therefore
// only ever grow between polls, sums of leaves stay consistent (totals are
// computed from the scaled leaves), and after LateData values are final.
// Percentiles are reported as final × (0.9 + 0.1c): they rise as slow
// requests arrive late.
//
// Buckets of different granularities are drawn independently from the same
// smooth curves, so an HOUR bucket is close to, not exactly, the sum of its
// twelve FIVE_MINUTES buckets.

// cell holds aggregatable values: counts are sums, percentiles are sums of
// value × weight (weight = edge or origin requests).
type cell struct {
	edge, hit, miss, stale float64
	prefetch, prefetchHit  float64
	cachable               float64
	status                 [4]float64 // 2xx, 3xx, 4xx, 5xx
	bytesEdge, bytesHit    float64
	bytesMiss, bytesStale  float64
	origin, bytesOrigin    float64
	wEdge, wOrigin         float64
	ttfbEdge, rtEdge       [6]float64
	ttfbOrigin, rtOrigin   [6]float64
}

func (c *cell) add(o *cell) {
	c.edge += o.edge
	c.hit += o.hit
	c.miss += o.miss
	c.stale += o.stale
	c.prefetch += o.prefetch
	c.prefetchHit += o.prefetchHit
	c.cachable += o.cachable
	for i := range c.status {
		c.status[i] += o.status[i]
	}
	c.bytesEdge += o.bytesEdge
	c.bytesHit += o.bytesHit
	c.bytesMiss += o.bytesMiss
	c.bytesStale += o.bytesStale
	c.origin += o.origin
	c.bytesOrigin += o.bytesOrigin
	c.wEdge += o.wEdge
	c.wOrigin += o.wOrigin
	for i := 0; i < 6; i++ {
		c.ttfbEdge[i] += o.ttfbEdge[i]
		c.rtEdge[i] += o.rtEdge[i]
		c.ttfbOrigin[i] += o.ttfbOrigin[i]
		c.rtOrigin[i] += o.rtOrigin[i]
	}
}

// value renders one metric of an aggregated cell. seconds is the time the
// cell covers, for per-second rates.
func (c *cell) value(metric string, seconds float64) float64 {
	ratio := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return a / b
	}
	switch metric {
	case "requests_edge_total":
		return c.edge
	case "requests_per_second_edge":
		return ratio(c.edge, seconds)
	case "requests_hit_total":
		return c.hit
	case "requests_cache_hit_ratio":
		return ratio(c.hit+c.stale, c.edge)
	case "requests_miss_total":
		return c.miss
	case "requests_stale_total":
		return c.stale
	case "requests_prefetch_total":
		return c.prefetch
	case "requests_prefetch_cache_hit_ratio":
		return ratio(c.prefetchHit, c.prefetch)
	case "requests_cachable_total":
		return c.cachable
	case "requests_2xx_total":
		return c.status[0]
	case "requests_3xx_total":
		return c.status[1]
	case "requests_4xx_total":
		return c.status[2]
	case "requests_5xx_total":
		return c.status[3]
	case "requests_error_ratio":
		return ratio(c.status[3], c.edge)
	case "bytes_edge_total":
		return c.bytesEdge
	case "bytes_hit_total":
		return c.bytesHit
	case "bytes_miss_total":
		return c.bytesMiss
	case "bytes_stale_total":
		return c.bytesStale
	case "bits_per_second_edge":
		return ratio(c.bytesEdge*8, seconds)
	case "requests_origin_total":
		return c.origin
	case "bytes_origin_total":
		return c.bytesOrigin
	}
	if stem, p, ok := percentileOf(metric); ok {
		switch stem {
		case "ttfb_edge":
			return ratio(c.ttfbEdge[p], c.wEdge)
		case "response_time_edge":
			return ratio(c.rtEdge[p], c.wEdge)
		case "ttfb_origin":
			return ratio(c.ttfbOrigin[p], c.wOrigin)
		case "response_time_origin":
			return ratio(c.rtOrigin[p], c.wOrigin)
		}
	}
	return 0
}

// percentileOf parses "<stem>_ms_<P>_percentile" into the stem and the index
// of P in percentiles.
func percentileOf(metric string) (string, int, bool) {
	const suffix = "_percentile"
	if len(metric) <= len(suffix) || metric[len(metric)-len(suffix):] != suffix {
		return "", 0, false
	}
	base := metric[:len(metric)-len(suffix)]
	for i := len(base) - 1; i >= 0; i-- {
		if base[i] == '_' {
			p := base[i+1:]
			stem := base[:i]
			if len(stem) < 3 || stem[len(stem)-3:] != "_ms" {
				return "", 0, false
			}
			for j, q := range percentiles {
				if q == p {
					return stem[:len(stem)-3], j, true
				}
			}
			return "", 0, false
		}
	}
	return "", 0, false
}

// leaf is one row of a dataset at full dimensionality for one environment
// and bucket.
type leaf struct {
	labels []string // dataset label dimensions in descriptor order
	cell   cell
}

// Percentile shapes: multipliers of the median, increasing in P.
var (
	ttfbShape     = [6]float64{0.3, 0.6, 1, 1.7, 4, 9}
	transferShape = [6]float64{0.15, 0.5, 1, 1.8, 4.5, 11}
)

type methodType struct {
	method, ctype string
	weight        float64
	size          float64 // bytes per response relative to... absolute mean
	miss          float64 // relative origin share
}

var contentTypes = []struct {
	ctype  string
	weight float64
	size   float64
	miss   float64
}{
	{"text/html", 0.15, 35000, 2.2},
	{"application/json", 0.25, 6000, 2.5},
	{"image/webp", 0.20, 55000, 0.6},
	{"image/jpeg", 0.10, 90000, 0.6},
	{"application/javascript", 0.12, 40000, 0.4},
	{"text/css", 0.08, 15000, 0.4},
	{"video/mp4", 0.05, 900000, 1.0},
	{"font/woff2", 0.05, 30000, 0.2},
}

// methodTypes are the (http_method, content_type) combinations traffic uses.
var methodTypes = func() []methodType {
	var out []methodType
	for _, ct := range contentTypes {
		out = append(out, methodType{"GET", ct.ctype, 0.90 * ct.weight, ct.size, ct.miss})
	}
	for _, ct := range contentTypes {
		out = append(out, methodType{"HEAD", ct.ctype, 0.04 * ct.weight, 250, ct.miss})
	}
	out = append(out,
		methodType{"POST", "application/json", 0.05, 2500, 3.5},
		methodType{"POST", "text/html", 0.01, 8000, 3.5},
	)
	return out
}()

var (
	edgeErrorCodes   = []string{"500", "502", "503", "504", "522", "524"}
	edgeErrorWeights = []float64{0.25, 0.3, 0.25, 0.12, 0.05, 0.03}
	originErrorCodes = []string{"400", "401", "403", "404", "429", "500", "502", "503", "504"}
	originErrorW     = []float64{0.08, 0.05, 0.07, 0.45, 0.05, 0.12, 0.07, 0.07, 0.04}
)

// curve is the daily traffic shape at local hour h: low at 04:00, peak at 16:00.
func curve(h float64) float64 {
	x := (1 - math.Cos(2*math.Pi*(h-4)/24)) / 2
	return 0.08 + 0.92*math.Pow(x, 1.3)
}

// curveMean is the mean of curve over a day.
var curveMean = func() float64 {
	var s float64
	const n = 2880
	for i := 0; i < n; i++ {
		s += curve(24 * float64(i) / n)
	}
	return s / n
}()

// completeness is the late-data share of a bucket reported at time at, for a
// leaf with exponent factor k in [0.8, 1.2]; ok is false when the bucket has
// not started.
func completeness(start, end, at time.Time, late time.Duration, k float64) (float64, bool) {
	if at.Before(start) {
		return 0, false
	}
	if !at.Before(end.Add(late)) {
		return 1, true
	}
	var c0 float64
	if at.Before(end) {
		c0 = 0.85 * float64(at.Sub(start)) / float64(end.Sub(start))
	} else {
		c0 = 0.85 + 0.15*float64(at.Sub(end))/float64(late)
	}
	return math.Pow(c0, k), true
}

// bucketCtx is what the model needs to know about one (environment, bucket).
type bucketCtx struct {
	s       *Server
	w       *world
	h       hasher // seed ⊕ environment ⊕ granularity ⊕ bucket start
	env     int
	m       *envModel
	g       metricsapi.Granularity
	start   time.Time
	end     time.Time
	at      time.Time
	seconds float64
}

func (s *Server) bucket(w *world, env int, g metricsapi.Granularity, start, at time.Time) bucketCtx {
	d := bucketOf(g)
	return bucketCtx{
		s:       s,
		w:       w,
		h:       s.hash.s(w.envs[env].ID).s(string(g)).i(start.Unix()),
		env:     env,
		m:       &w.models[env],
		g:       g,
		start:   start,
		end:     start.Add(d),
		at:      at,
		seconds: d.Seconds(),
	}
}

// comp returns the completeness of a leaf identified by key.
func (b *bucketCtx) comp(key hasher) (float64, bool) {
	k := 0.8 + 0.4*key.s("late-k").u()
	return completeness(b.start, b.end, b.at, b.s.cfg.LateData, k)
}

// countryFinal is the final edge traffic of one country in a bucket.
type countryFinal struct {
	n                               [4][3]float64 // status class × (hit, miss, stale)
	bytes                           [4][3]float64
	prefetch, prefetchHit, cachable float64
	ttfb, rt                        [6]float64
	edge                            float64
	origin, bytesOrigin             float64
	originTTFB50                    float64
}

// countries returns the final edge cells of every country (zero where no
// traffic) of the bucket.
func (b *bucketCtx) countries() []countryFinal {
	out := make([]countryFinal, len(countries))
	burst := b.burst()
	hitNoise := 0.015 * b.h.s("hitnoise").z()
	for i := range countries {
		if edge := b.countryEdge(i); edge > 0 {
			out[i] = b.countryFinal(i, edge, burst, hitNoise)
		}
	}
	return out
}

// burst is the factor on the 5xx rate: 1, or 20 to 100 in the 4 % of
// buckets that hold an error burst.
func (b *bucketCtx) burst() float64 {
	if bh := b.h.s("burst"); bh.u() < 0.04 {
		return 20 + 80*bh.i(1).u()
	}
	return 1
}

// countryEdge draws the final edge requests of country i: the daily curve
// at the country's local time, the weekend dip, a bucket's noise, the
// environment's size and Config.TrafficScale.
func (b *bucketCtx) countryEdge(i int) float64 {
	c, m := countries[i], b.m
	mid := b.start.Add(time.Duration(b.seconds/2) * time.Second)
	shape := curveMean
	if b.g != "DAY" {
		utcHour := float64(mid.Hour()) + float64(mid.Minute())/60
		shape = curve(math.Mod(utcHour+c.tz+m.phase+48, 24))
	}
	local := mid.Add(time.Duration(c.tz * float64(time.Hour)))
	if wd := local.Weekday(); wd == time.Saturday || wd == time.Sunday {
		shape *= 1 - m.weekendDip
	}
	// Noise of a five-minute bucket; a longer bucket averages many, so
	// its noise shrinks with the square root of its length.
	ch := b.h.s(c.code)
	sd := 0.08 * math.Sqrt(300/b.seconds)
	lambda := m.peakRPS * m.countryW[i] * shape * b.seconds * math.Exp(sd*ch.s("noise").z()) * b.s.cfg.TrafficScale
	return ch.s("edge").poisson(lambda)
}

// countryFinal splits a country's edge requests into the status class ×
// cache status table with bytes, prefetches, latency and origin traffic.
func (b *bucketCtx) countryFinal(i int, edge, burst, hitNoise float64) countryFinal {
	c, m := countries[i], b.m
	ch := b.h.s(c.code)
	f := countryFinal{edge: edge}
	classes := b.statusClasses(ch, edge, burst)
	hit2 := clamp(m.hitBase+hitNoise+0.01*ch.s("hit").z(), 0.6, 0.995)
	hitRatios := [4]float64{hit2, 0.95, 0.5, 0.02}
	perReq := [4]float64{m.avgBytes * (0.85 + 0.3*ch.s("size").u()), 350, 900, 600}
	var hits, misses, stales float64
	for k, n := range classes {
		hit := math.Round(n * hitRatios[k])
		stale := math.Min(math.Round(n*m.staleFrac), n-hit)
		miss := n - hit - stale
		f.n[k] = [3]float64{hit, miss, stale}
		for j := 0; j < 3; j++ {
			f.bytes[k][j] = math.Round(f.n[k][j] * perReq[k])
		}
		hits, misses, stales = hits+hit, misses+miss, stales+stale
	}
	f.prefetch = math.Round(edge * m.prefetch)
	f.prefetchHit = math.Round(f.prefetch * (0.85 + 0.13*ch.s("pfh").u()))
	f.cachable = hits + stales + math.Round(misses*0.6)
	p50 := c.latency * m.latency * (1 + 3*misses/edge) * math.Exp(0.1*ch.s("lat").z())
	transfer := perReq[0] / 250000 * 1000 * (0.8 + 0.4*ch.s("xfer").u()) // ms at ~2 Mbit/s
	for p := 0; p < 6; p++ {
		f.ttfb[p] = p50 * ttfbShape[p]
		f.rt[p] = f.ttfb[p] + transfer*transferShape[p]
	}
	f.origin = misses + math.Floor(stales/2)
	f.bytesOrigin = math.Round(f.origin * perReq[0] * 0.7)
	f.originTTFB50 = m.originMs * (0.7 + c.latency/60) * math.Exp(0.12*ch.s("olat").z())
	return f
}

// statusClasses splits a country's edge requests over 2xx, 3xx, 4xx, 5xx.
func (b *bucketCtx) statusClasses(ch hasher, edge, burst float64) [4]float64 {
	n5 := ch.s("5xx").poisson(edge * b.m.errBase * burst * (0.5 + ch.s("5xxc").u()))
	n5 = math.Min(n5, math.Floor(edge*0.6))
	n4 := math.Min(math.Round(edge*(0.02+0.04*ch.s("4xx").u())), edge-n5)
	n3 := math.Min(math.Round(edge*(0.03+0.05*ch.s("3xx").u())), edge-n5-n4)
	return [4]float64{edge - n5 - n4 - n3, n3, n4, n5}
}

// scaled returns floor(x × c), the late-data view of a final count.
func scaled(x, c float64) float64 {
	if c >= 1 {
		return x
	}
	return math.Floor(x * c)
}

func pctScale(c float64) float64 { return 0.9 + 0.1*c }

// leaves returns every non-empty leaf of dataset ds for the bucket.
func (b *bucketCtx) leaves(ds string) []leaf {
	switch ds {
	case DatasetEdgeUsageByCountry:
		return b.edgeUsage()
	case DatasetEdgeErrors:
		return b.edgeErrors()
	case DatasetOriginUsageByCountry:
		return b.originByCountry()
	case DatasetOriginUsage:
		return b.originUsage(false)
	case DatasetOriginErrors:
		return b.originUsage(true)
	case DatasetOriginOffload:
		return b.originOffload()
	}
	return nil
}

func (b *bucketCtx) edgeUsage() []leaf {
	var out []leaf
	for i, f := range b.countries() {
		if f.edge == 0 {
			continue
		}
		code := countries[i].code
		c, ok := b.comp(b.h.s("edge").s(code))
		if !ok {
			return nil
		}
		var x cell
		for k := 0; k < 4; k++ {
			for j := 0; j < 3; j++ {
				n := scaled(f.n[k][j], c)
				by := scaled(f.bytes[k][j], c)
				x.status[k] += n
				x.edge += n
				x.bytesEdge += by
				switch j {
				case 0:
					x.hit += n
					x.bytesHit += by
				case 1:
					x.miss += n
					x.bytesMiss += by
				case 2:
					x.stale += n
					x.bytesStale += by
				}
			}
		}
		if x.edge == 0 {
			continue
		}
		x.prefetch = scaled(f.prefetch, c)
		x.prefetchHit = scaled(f.prefetchHit, c)
		x.cachable = scaled(f.cachable, c)
		x.wEdge = x.edge
		ps := pctScale(c)
		for p := 0; p < 6; p++ {
			x.ttfbEdge[p] = f.ttfb[p] * ps * x.wEdge
			x.rtEdge[p] = f.rt[p] * ps * x.wEdge
		}
		out = append(out, leaf{labels: []string{code}, cell: x})
	}
	return out
}

func (b *bucketCtx) edgeErrors() []leaf {
	var out []leaf
	for i, f := range b.countries() {
		code := countries[i].code
		for j, n := range b.errorCodes(i, f) {
			if n == 0 {
				continue
			}
			c, ok := b.comp(b.h.s("edge-err").s(code).s(edgeErrorCodes[j]))
			if !ok {
				return nil
			}
			v := scaled(n, c)
			if v == 0 {
				continue
			}
			out = append(out, leaf{labels: []string{code, edgeErrorCodes[j]}, cell: cell{edge: v}})
		}
	}
	return out
}

// errorCodes splits the final 5xx requests of country i (final f) over
// edgeErrorCodes; a burst is dominated by one code. The access logs use the
// same split, so their 5xx status codes match edge_errors.
func (b *bucketCtx) errorCodes(i int, f countryFinal) []float64 {
	n5 := f.n[3][0] + f.n[3][1] + f.n[3][2]
	if n5 == 0 {
		return make([]float64, len(edgeErrorCodes))
	}
	w := append([]float64(nil), edgeErrorWeights...)
	if bh := b.h.s("burst"); bh.u() < 0.04 {
		w[int(bh.i(2).u()*float64(len(w)))] += 3
	}
	ch := b.h.s(countries[i].code).s("ecode")
	for j := range w {
		w[j] *= 0.5 + ch.i(int64(j)).u()
	}
	return split(n5, w)
}

func (b *bucketCtx) originCell(n, bytes, ttfb50, transfer float64, c float64) cell {
	x := cell{origin: scaled(n, c), bytesOrigin: scaled(bytes, c)}
	x.wOrigin = x.origin
	ps := pctScale(c)
	for p := 0; p < 6; p++ {
		t := ttfb50 * ttfbShape[p]
		x.ttfbOrigin[p] = t * ps * x.wOrigin
		x.rtOrigin[p] = (t + transfer*transferShape[p]) * ps * x.wOrigin
	}
	return x
}

func (b *bucketCtx) originByCountry() []leaf {
	var out []leaf
	origins := b.w.envs[b.env].Origins
	for i, f := range b.countries() {
		if f.origin == 0 {
			continue
		}
		code := countries[i].code
		parts := split(f.origin, b.m.originW)
		for j, n := range parts {
			if n == 0 {
				continue
			}
			key := b.h.s("origin-country").s(code).s(origins[j])
			c, ok := b.comp(key)
			if !ok {
				return nil
			}
			bytes := math.Round(f.bytesOrigin * n / f.origin)
			ttfb := f.originTTFB50 * (0.9 + 0.3*float64(j)) // backups are slower
			x := b.originCell(n, bytes, ttfb, b.m.avgBytes/1e6*200, c)
			if x.origin == 0 {
				continue
			}
			out = append(out, leaf{labels: []string{code, origins[j]}, cell: x})
		}
	}
	return out
}

// originFinals returns, per origin and method/type combination, the final
// origin requests of the bucket, and the final edge requests per combination.
func (b *bucketCtx) originFinals() (perOrigin [][]float64, edgeMT []float64) {
	var originTotal, edgeTotal float64
	perOriginTotal := make([]float64, len(b.m.originW))
	for _, f := range b.countries() {
		if f.edge == 0 {
			continue
		}
		edgeTotal += f.edge
		originTotal += f.origin
		for j, n := range split(f.origin, b.m.originW) {
			perOriginTotal[j] += n
		}
	}
	wEdge := make([]float64, len(methodTypes))
	wOrig := make([]float64, len(methodTypes))
	for k, mt := range methodTypes {
		wEdge[k] = mt.weight
		wOrig[k] = mt.weight * mt.miss
	}
	edgeMT = split(edgeTotal, wEdge)
	perOrigin = make([][]float64, len(perOriginTotal))
	for j, n := range perOriginTotal {
		perOrigin[j] = split(n, wOrig)
	}
	return perOrigin, edgeMT
}

func (b *bucketCtx) originUsage(errors bool) []leaf {
	var out []leaf
	origins := b.w.envs[b.env].Origins
	perOrigin, _ := b.originFinals()
	olat := b.m.originMs * math.Exp(0.12*b.h.s("olat").z())
	burst := b.h.s("oburst").u() < 0.03
	for j, row := range perOrigin {
		for k, n := range row {
			if n == 0 {
				continue
			}
			mt := methodTypes[k]
			labels := []string{origins[j], mt.method, mt.ctype}
			key := b.h.s("origin-usage").s(origins[j]).s(mt.method).s(mt.ctype)
			if !errors {
				c, ok := b.comp(key)
				if !ok {
					return nil
				}
				ttfb := olat * (0.9 + 0.3*float64(j)) * (1 + 0.4*b.h.s(mt.ctype).u())
				x := b.originCell(n, math.Round(n*mt.size*0.9), ttfb, mt.size/1e6*200, c)
				if x.origin == 0 {
					continue
				}
				out = append(out, leaf{labels: labels, cell: x})
				continue
			}
			rate := 0.03 + 0.03*key.s("erate").u()
			if burst && j == 0 {
				rate += 0.2
			}
			ne := math.Min(key.s("errors").poisson(n*rate), n)
			if ne == 0 {
				continue
			}
			w := make([]float64, len(originErrorW))
			for q := range w {
				w[q] = originErrorW[q] * (0.3 + key.s("ecode").i(int64(q)).u())
				if burst && j == 0 && q >= 5 {
					w[q] *= 20
				}
			}
			for q, v := range split(ne, w) {
				if v == 0 {
					continue
				}
				c, ok := b.comp(key.s("err").s(originErrorCodes[q]))
				if !ok {
					return nil
				}
				v = scaled(v, c)
				if v == 0 {
					continue
				}
				out = append(out, leaf{labels: append(append([]string(nil), labels...), originErrorCodes[q]), cell: cell{origin: v}})
			}
		}
	}
	return out
}

func (b *bucketCtx) originOffload() []leaf {
	var out []leaf
	perOrigin, edgeMT := b.originFinals()
	for k, e := range edgeMT {
		if e == 0 {
			continue
		}
		mt := methodTypes[k]
		var o float64
		for j := range perOrigin {
			o += perOrigin[j][k]
		}
		o = math.Min(o, e)
		c, ok := b.comp(b.h.s("offload").s(mt.method).s(mt.ctype))
		if !ok {
			return nil
		}
		x := cell{
			edge:        scaled(e, c),
			origin:      scaled(o, c),
			bytesEdge:   scaled(math.Round(e*mt.size), c),
			bytesOrigin: scaled(math.Round(o*mt.size*0.9), c),
		}
		if x.edge == 0 {
			continue
		}
		out = append(out, leaf{labels: []string{mt.method, mt.ctype}, cell: x})
	}
	return out
}

// roundValue rounds a metric value to the precision it is sent with:
// counts to integers, ratios to 6 decimals, everything else to 3.
func roundValue(metric string, v float64) float64 {
	switch {
	case strings.HasSuffix(metric, "_total"):
		return math.Round(v)
	case strings.HasSuffix(metric, "_ratio"):
		return math.Round(v*1e6) / 1e6
	default:
		return math.Round(v*1e3) / 1e3
	}
}

// appendNumber appends the wire form of a metric value, quoted when asString.
func appendNumber(b []byte, metric string, v float64, asString bool) []byte {
	if asString {
		b = append(b, '"')
	}
	b = strconv.AppendFloat(b, roundValue(metric, v), 'f', -1, 64)
	if asString {
		b = append(b, '"')
	}
	return b
}
