package prometheus

import (
	"bufio"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// Handler serves /metrics: the registry's metrics (self-metrics, the Go and
// process collectors) encoded by expfmt, then the collector's series written
// straight from its state (WriteText), in the text format 0.0.4, gzipped
// when the client accepts gzip. A registry that fails to gather is reported
// to onError and what it did gather is served, as promhttp's
// ContinueOnError does; errors are also counted in
// promhttp_metric_handler_errors_total{cause}, as promhttp counts them. A
// failed write (mostly a client that went away) ends the answer and is
// reported to onError too.
func Handler(reg *prometheus.Registry, c *Collector, onError func(error)) (http.Handler, error) {
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "promhttp_metric_handler_errors_total",
		Help: "Total number of internal errors encountered by the promhttp metric handler.",
	}, []string{"cause"})
	if err := reg.Register(errs); err != nil {
		return nil, err
	}
	errs.WithLabelValues("gathering")
	errs.WithLabelValues("encoding")
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mfs, err := reg.Gather()
		if err != nil {
			errs.WithLabelValues("gathering").Inc()
			onError(err)
		}
		h := w.Header()
		h.Set("Content-Type", string(format))
		var out io.Writer = w
		if acceptsGzip(r) {
			h.Set("Content-Encoding", "gzip")
			h.Add("Vary", "Accept-Encoding")
			gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed) // a valid level: no error
			defer gz.Close()
			out = gz
		}
		bw := bufio.NewWriterSize(out, 64<<10)
		enc := expfmt.NewEncoder(bw, format)
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				errs.WithLabelValues("encoding").Inc()
				onError(err)
				return
			}
		}
		err = c.WriteText(bw)
		if err == nil {
			err = bw.Flush()
		}
		if err != nil { // mostly a client that went away
			onError(err)
		}
	}), nil
}

// acceptsGzip reports whether the request's Accept-Encoding allows gzip
// (listed, and not with q=0).
func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, params, _ := strings.Cut(part, ";")
		if !strings.EqualFold(strings.TrimSpace(enc), "gzip") {
			continue
		}
		for _, param := range strings.Split(params, ";") {
			if q, ok := strings.CutPrefix(strings.TrimSpace(param), "q="); ok {
				f, err := strconv.ParseFloat(q, 64)
				return err == nil && f > 0
			}
		}
		return true
	}
	return false
}

// family is one metric family of a dataset: the plans that share a name (the
// percentiles of one stem), identified by API metric name so that a family
// listed under one lock can be found again under the next.
type family struct {
	name string
	apis []string
}

// chunkLabelSets is how many label sets of one metric WriteText renders
// under one hold of a dataset's read lock: about a megabyte of text.
const chunkLabelSets = 8192

// WriteText writes every series the collector holds in the Prometheus text
// format (0.0.4), family by family, straight from its state, then its
// edgepipe_series, edgepipe_series_limit_dropped_total and
// edgepipe_series_limit. Nothing is allocated per series: a scrape of a
// million series costs a buffer of about a megabyte, kept for the next
// scrape, rather than a protobuf object per series. The series are rendered
// in chunks of chunkLabelSets label sets under the dataset's read lock into
// that buffer, and each chunk is written after the lock is released, so a
// slow client never holds up polling. Counters are written always, gauges
// while their label set's newest bucket is within Options.GaugeMaxAge of the
// dataset's newest; a metric without a value is left out, and a family
// without a series too.
func (c *Collector) WriteText(w io.Writer) error {
	c.mu.RLock()
	dss := make([]*datasetState, 0, len(c.datasets))
	for _, d := range c.datasets {
		dss = append(dss, d)
	}
	c.mu.RUnlock()
	slices.SortFunc(dss, func(a, b *datasetState) int { return strings.Compare(a.name, b.name) })
	gaugeAge := int64(c.opts.GaugeMaxAge / time.Second)
	bp, _ := c.textBufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	defer c.textBufs.Put(bp)
	buf := (*bp)[:0]
	defer func() { *bp = buf[:0] }()
	for _, d := range dss {
		d.mu.RLock()
		fams := d.families()
		d.mu.RUnlock()
		for _, f := range fams {
			header := false
			for _, api := range f.apis {
				for from, done := 0, false; !done; {
					d.mu.RLock()
					buf, from, done = d.appendSeries(buf[:0], f.name, api, from, d.dsNewest-gaugeAge, &header)
					d.mu.RUnlock()
					if _, err := w.Write(buf); err != nil {
						return err
					}
				}
			}
		}
	}
	buf = c.budget.appendText(buf[:0], dss)
	_, err := w.Write(buf)
	return err
}

// families lists the dataset's metric families in name order; d.mu must be
// held.
func (d *datasetState) families() []family {
	var out []family
	for _, p := range d.plans {
		i := slices.IndexFunc(out, func(f family) bool { return f.name == p.name })
		if i < 0 {
			out = append(out, family{name: p.name})
			i = len(out) - 1
		}
		out[i].apis = append(out[i].apis, p.api)
	}
	slices.SortFunc(out, func(a, b family) int { return strings.Compare(a.name, b.name) })
	return out
}

// appendSeries appends to b a line for every label set from slot from on, at
// most chunkLabelSets of them, that has a value of API metric api (gauges
// only if the label set's newest bucket is not older than gaugeFloor), with
// the family's HELP and TYPE lines before the first line of family name
// (header says whether they were written). It returns where to go on from
// and whether the metric is done. A metric that is no longer one of the
// family's (the state changed since the families were listed) is done at
// once. d.mu must be held.
func (d *datasetState) appendSeries(b []byte, name, api string, from int, gaugeFloor int64, header *bool) ([]byte, int, bool) {
	j, ok := d.byName[api]
	if !ok || j >= len(d.plans) || d.plans[j].name != name {
		return b, 0, true
	}
	pl := d.plans[j]
	counter := pl.kind == kindCounter
	names := labelNames(d.resultLbls)
	order := labelOrder(names, pl.percentile != "")
	k, p := d.k, len(d.plans)
	end := min(from+chunkLabelSets, len(d.newest))
	for i := from; i < end; i++ {
		lbls := d.labels[i*k : (i+1)*k : (i+1)*k]
		if lbls[0] == "" {
			continue
		}
		v := d.vals[i*p+j]
		if math.IsNaN(v) {
			continue
		}
		if !counter {
			if d.newest[i] < gaugeFloor {
				continue
			}
			v *= pl.scale
		}
		if !*header {
			b = appendHeader(b, pl.name, pl.help, counter)
			*header = true
		}
		b = append(b, pl.name...)
		for n, src := range order {
			if n == 0 {
				b = append(b, '{')
			} else {
				b = append(b, ',')
			}
			if src < 0 {
				b = append(b, LabelPercentile...)
				b = append(b, `="`...)
				b = appendLabelValue(b, pl.percentile)
			} else {
				b = append(b, names[src]...)
				b = append(b, `="`...)
				b = appendLabelValue(b, lbls[src])
			}
			b = append(b, '"')
		}
		b = append(b, '}', ' ')
		b = appendFloat(b, v)
		b = append(b, '\n')
	}
	return b, end, end >= len(d.newest)
}

// labelOrder returns the sources of a series' labels in name order, as
// client_golang writes them: an index into names (the series' label
// values), or -1 for the percentile label.
func labelOrder(names []string, percentile bool) []int {
	order := make([]int, 0, len(names)+1)
	for i := range names {
		order = append(order, i)
	}
	if percentile {
		order = append(order, -1)
	}
	name := func(src int) string {
		if src < 0 {
			return LabelPercentile
		}
		return names[src]
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(name(a), name(b)) })
	return order
}

// appendHeader appends a family's HELP and TYPE lines.
func appendHeader(b []byte, name, help string, counter bool) []byte {
	b = append(b, "# HELP "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = appendHelp(b, help)
	b = append(b, "\n# TYPE "...)
	b = append(b, name...)
	if counter {
		return append(b, " counter\n"...)
	}
	return append(b, " gauge\n"...)
}

// appendHelp appends help text escaped as the text format wants: \ and
// newline.
func appendHelp(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b = append(b, `\\`...)
		case '\n':
			b = append(b, `\n`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// appendLabelValue appends a label value escaped as the text format wants:
// \, newline and ".
func appendLabelValue(b []byte, s string) []byte {
	if !strings.ContainsAny(s, "\\\n\"") {
		return append(b, s...)
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b = append(b, `\\`...)
		case '\n':
			b = append(b, `\n`...)
		case '"':
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// appendFloat appends v as expfmt writes it.
func appendFloat(b []byte, v float64) []byte {
	switch {
	case v == 1:
		return append(b, '1')
	case v == 0:
		return append(b, '0')
	case v == -1:
		return append(b, "-1"...)
	case math.IsNaN(v):
		return append(b, "NaN"...)
	case math.IsInf(v, +1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}
