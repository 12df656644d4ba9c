package prometheus

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
)

// benchDataset has the shape of edge_usage_by_country: 19 metrics plus 12
// percentiles, i.e. 31 series per (environment, country) label set.
var benchDataset = func() *metricsapi.Dataset {
	ds := &metricsapi.Dataset{Name: "edge_usage_by_country", Dimensions: edgeDataset.Dimensions}
	for _, m := range []string{"requests_edge_total", "requests_per_second_edge", "requests_hit_total", "requests_cache_hit_ratio",
		"requests_miss_total", "requests_stale_total", "requests_prefetch_total", "requests_prefetch_cache_hit_ratio",
		"requests_cachable_total", "requests_2xx_total", "requests_3xx_total", "requests_4xx_total", "requests_5xx_total",
		"requests_error_ratio", "bytes_edge_total", "bytes_hit_total", "bytes_miss_total", "bytes_stale_total", "bits_per_second_edge"} {
		ds.Metrics = append(ds.Metrics, metricsapi.Metric{Name: m})
	}
	for _, stem := range []string{"ttfb_edge", "response_time_edge"} {
		for _, p := range []string{"5", "25", "50", "75", "95", "99"} {
			ds.Metrics = append(ds.Metrics, metricsapi.Metric{Name: stem + "_ms_" + p + "_percentile"})
		}
	}
	return ds
}()

// benchErrors has the shape of edge_errors: one metric per label set
// (environment, country, status), the worst case for per-series memory.
var benchErrors = &metricsapi.Dataset{
	Name: "edge_errors",
	Dimensions: []metricsapi.Dimension{{Name: "time"}, {Name: "environment_id"}, {Name: "country_code"},
		{Name: "http_status_code", Type: metricsapi.TypeNumber}},
	Metrics: []metricsapi.Metric{{Name: "requests_edge_total"}},
}

// labelSets returns n label sets of ds: UUID-like environments times
// two-letter countries (times status codes for a third dimension).
func labelSets(ds *metricsapi.Dataset, n int) [][]string {
	out := make([][]string, 0, n)
	dims := len(ds.Dimensions) - 2
	for i := 0; len(out) < n; i++ {
		env := fmt.Sprintf("%08x-5d1e-4c3b-9a2f-%012x", i, i*2654435761)
		for c := 0; c < 250 && len(out) < n; c++ {
			country := string([]byte{'a' + byte(c/26), 'a' + byte(c%26)})
			if dims == 1 {
				out = append(out, []string{env, country})
				continue
			}
			for s := 0; s < 40 && len(out) < n; s++ {
				out = append(out, []string{env, country, fmt.Sprint(500 + s)})
			}
		}
	}
	return out
}

// fill publishes one bucket for every label set, in batches of 10k.
func fill(c *Collector, ds *metricsapi.Dataset, sets [][]string) {
	var labels []string
	for _, d := range ds.Labels() {
		labels = append(labels, d.Name)
	}
	metrics := ds.MetricNames()
	t := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for start := 0; start < len(sets); start += 10000 {
		end := min(start+10000, len(sets))
		b := &schedule.Batch{Dataset: ds, Granularity: metricsapi.FiveMinutes, Labels: labels, Metrics: metrics}
		for _, ls := range sets[start:end] {
			vals := make([]float64, len(metrics))
			totals := make([]float64, len(metrics))
			for i := range vals {
				vals[i] = float64(i*7 + len(ls[1]))
				totals[i] = math.NaN()
				if metricsapi.Classify(metrics[i]).Kind == metricsapi.KindCount {
					totals[i] = vals[i]
				}
			}
			lbls := append([]string(nil), ls[1:]...)
			b.Updates = append(b.Updates, schedule.Update{Row: metricsapi.Row{
				Time: t, Environment: ls[0], Labels: lbls, Values: vals}})
			b.Counts = append(b.Counts, schedule.SeriesCounts{Environment: ls[0], Labels: lbls, Totals: totals, Newest: t})
		}
		c.Publish(context.Background(), b)
	}
}

// baseline is a bare client_golang collector of the same series: one entry
// per metric series holding its Desc, labels and value, turned into const
// metrics at scrape time.
type baseline struct{ series []baseSeries }

type baseSeries struct {
	desc   *prometheus.Desc
	vt     prometheus.ValueType
	v      float64
	labels []string
}

func (b *baseline) Describe(chan<- *prometheus.Desc) {}

func (b *baseline) Collect(ch chan<- prometheus.Metric) {
	for i := range b.series {
		s := &b.series[i]
		ch <- prometheus.MustNewConstMetric(s.desc, s.vt, s.v, s.labels...)
	}
}

func newBaseline(ds *metricsapi.Dataset, sets [][]string) *baseline {
	var labels []string
	for _, d := range ds.Labels() {
		labels = append(labels, d.Name)
	}
	names := labelNames(labels)
	var descs []*prometheus.Desc
	var kinds []valueKind
	for _, m := range ds.MetricNames() {
		p := plan(DefaultPrefix, ds, m)
		var constLabels prometheus.Labels
		if p.percentile != "" {
			constLabels = prometheus.Labels{LabelPercentile: p.percentile}
		}
		descs = append(descs, prometheus.NewDesc(p.name, p.help, names, constLabels))
		kinds = append(kinds, p.kind)
	}
	b := &baseline{}
	for _, ls := range sets {
		lv := append([]string(nil), ls...)
		for j, desc := range descs {
			vt := prometheus.GaugeValue
			if kinds[j] == kindCounter {
				vt = prometheus.CounterValue
			}
			b.series = append(b.series, baseSeries{desc: desc, vt: vt, v: float64(j), labels: lv})
		}
	}
	return b
}

func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// scraper performs one scrape and returns the number of series.
type scraper func(b *testing.B) int

// textScrape writes the collector's exposition, as /metrics does, and counts
// its cdn series.
func textScrape(c *Collector) scraper {
	return func(b *testing.B) int {
		var w sampleCounter
		if err := c.WriteText(&w); err != nil {
			b.Fatal(err)
		}
		return w.n
	}
}

// sampleCounter discards what is written and counts the lines starting
// with "cdn_" (WriteText writes whole lines).
type sampleCounter struct{ n int }

func (w *sampleCounter) Write(p []byte) (int, error) {
	w.n += bytes.Count(p, []byte("\ncdn_"))
	if bytes.HasPrefix(p, []byte("cdn_")) {
		w.n++
	}
	return len(p), nil
}

// registryScrape gathers reg and encodes the text exposition, as a
// client_golang exporter's /metrics does.
func registryScrape(reg *prometheus.Registry) scraper {
	return func(b *testing.B) int { return scrape(b, reg) }
}

// scrape gathers reg and encodes the text exposition.
func scrape(b *testing.B, reg *prometheus.Registry) int {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	enc := expfmt.NewEncoder(io.Discard, expfmt.NewFormat(expfmt.TypeTextPlain))
	n := 0
	for _, mf := range mfs {
		n += len(mf.Metric)
		if err := enc.Encode(mf); err != nil {
			b.Fatal(err)
		}
	}
	return n
}

// BenchmarkScrape measures one scrape of the collector (WriteText, as
// /metrics serves it) and of a bare client_golang const-metric collector
// holding the same series (Gather plus text encoding), what a scrape
// allocates, and the resident heap per series of each (HeapInuse delta
// around building the state). Run: go test -run '^$' -bench BenchmarkScrape -benchtime 3x ./internal/sinks/prometheus
func BenchmarkScrape(b *testing.B) {
	for _, shape := range []struct {
		name string
		ds   *metricsapi.Dataset
	}{{"usage", benchDataset}, {"errors", benchErrors}} {
		perSet := len(shape.ds.Metrics)
		for _, size := range []struct {
			name string
			n    int
		}{{"100k", 100_000}, {"1M", 1_000_000}} {
			sets := labelSets(shape.ds, (size.n+perSet-1)/perSet)
			b.Run(shape.name+"/"+size.name+"/edgepipe", func(b *testing.B) {
				before := heapInuse()
				c := NewCollector(Options{})
				fill(c, shape.ds, sets)
				after := heapInuse()
				benchScrape(b, textScrape(c), before, after)
				runtime.KeepAlive(c)
			})
			b.Run(shape.name+"/"+size.name+"/baseline", func(b *testing.B) {
				before := heapInuse()
				bl := newBaseline(shape.ds, sets)
				after := heapInuse()
				reg := prometheus.NewRegistry()
				reg.MustRegister(bl)
				benchScrape(b, registryScrape(reg), before, after)
				runtime.KeepAlive(bl)
			})
		}
	}
}

func benchScrape(b *testing.B, scrape scraper, before, after uint64) {
	b.ReportAllocs()
	b.ResetTimer()
	series := 0
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	for b.Loop() {
		series = scrape(b)
	}
	runtime.ReadMemStats(&ms1)
	b.StopTimer()
	if series == 0 {
		b.Fatal("nothing scraped")
	}
	b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(b.N)/float64(series), "alloc-B/series")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(series), "ns/series")
	b.ReportMetric(math.Max(0, float64(int64(after)-int64(before)))/float64(series), "bytes/series")
	b.ReportMetric(float64(series), "series")
}

// BenchmarkScrapeRatio scrapes the collector (WriteText) and the bare
// client_golang baseline of the same series alternately in every iteration,
// so both see the same machine load, and reports each one's ns/series and
// their ratio (goal: ≤ 1.3).
// Run: go test -run '^$' -bench BenchmarkScrapeRatio -benchtime 3x ./internal/sinks/prometheus
func BenchmarkScrapeRatio(b *testing.B) {
	for _, shape := range []struct {
		name string
		ds   *metricsapi.Dataset
	}{{"usage", benchDataset}, {"errors", benchErrors}} {
		perSet := len(shape.ds.Metrics)
		for _, size := range []struct {
			name string
			n    int
		}{{"100k", 100_000}, {"1M", 1_000_000}} {
			b.Run(shape.name+"/"+size.name, func(b *testing.B) {
				sets := labelSets(shape.ds, (size.n+perSet-1)/perSet)
				c := NewCollector(Options{})
				fill(c, shape.ds, sets)
				ours := textScrape(c)
				reg := prometheus.NewRegistry()
				reg.MustRegister(newBaseline(shape.ds, sets))
				base := registryScrape(reg)
				var tOurs, tBase time.Duration
				series := 0
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					// Alternate which goes first, so neither always scrapes
					// right after the other's garbage.
					first, second := ours, base
					if i%2 == 1 {
						first, second = base, ours
					}
					t0 := time.Now()
					series = first(b)
					t1 := time.Now()
					second(b)
					t2 := time.Now()
					if i%2 == 0 {
						tOurs += t1.Sub(t0)
						tBase += t2.Sub(t1)
					} else {
						tBase += t1.Sub(t0)
						tOurs += t2.Sub(t1)
					}
				}
				n := float64(b.N) * float64(series)
				b.ReportMetric(float64(tOurs.Nanoseconds())/n, "edgepipe-ns/series")
				b.ReportMetric(float64(tBase.Nanoseconds())/n, "baseline-ns/series")
				b.ReportMetric(float64(tOurs)/float64(tBase), "ratio")
			})
		}
	}
}
