package prometheus

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/schedule"
)

// textGatherer is a prometheus.Gatherer of a Collector's WriteText output,
// parsed: the tests read the collector as Prometheus would.
type textGatherer struct{ c *Collector }

func (g textGatherer) Gather() ([]*dto.MetricFamily, error) {
	var b bytes.Buffer
	if err := g.c.WriteText(&b); err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(&b)
	if err != nil {
		return nil, err
	}
	out := make([]*dto.MetricFamily, 0, len(mfs))
	for _, mf := range mfs {
		out = append(out, mf)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out, nil
}

// constMetrics is the collector's state as client_golang const metrics, the
// way a plain prometheus.Collector would expose it: the reference WriteText
// must agree with, byte for byte once lines are sorted.
type constMetrics struct{ c *Collector }

func (constMetrics) Describe(chan<- *prometheus.Desc) {}

func (r constMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, d := range r.c.datasets {
		names := labelNames(d.resultLbls)
		p := len(d.plans)
		gaugeFloor := d.dsNewest - int64(r.c.opts.GaugeMaxAge.Seconds())
		for j, pl := range d.plans {
			var constLabels prometheus.Labels
			if pl.percentile != "" {
				constLabels = prometheus.Labels{LabelPercentile: pl.percentile}
			}
			desc := prometheus.NewDesc(pl.name, pl.help, names, constLabels)
			for i := range d.newest {
				lbls := d.labels[i*d.k : (i+1)*d.k]
				v := d.vals[i*p+j]
				if lbls[0] == "" || math.IsNaN(v) {
					continue
				}
				if pl.kind == kindCounter {
					ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, lbls...)
				} else if d.newest[i] >= gaugeFloor {
					ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v*pl.scale, lbls...)
				}
			}
		}
	}
}

func sortedLines(b []byte) []string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	sort.Strings(lines)
	return lines
}

// TestWriteTextMatchesClientGolang: the text WriteText writes equals
// client_golang's encoding of the same series as const metrics (names, help,
// types, label order and escaping, float format), with label values that
// need escaping, percentiles, hidden gauges, values that are missing, and a
// metric of more label sets than one chunk.
func TestWriteTextMatchesClientGolang(t *testing.T) {
	c := newCollector(t, Options{})
	odd := `quo"te\back` + "\nslash"
	publish(t, c, withTotals(batch(
		upd("e1", "us", 0, nil, 100, 0.5, 8000, 120, 40),
		upd("e1", odd, 1, nil, 7, math.NaN(), 800, 10, 5),
		upd("e2", "de", 9, nil, 1e21, 1.0/3, 0, 1, 1e-7),
	), total("e1", "us", 0, 100), total("e1", odd, 1, 7), total("e2", "de", 9, 1e21)))
	// More label sets than one chunk holds, some without traffic.
	errs := &schedule.Batch{Dataset: benchErrors, Granularity: metricsapi.FiveMinutes,
		Labels: []string{"country_code", "http_status_code"}, Metrics: []string{"requests_edge_total"}}
	for i, ls := range labelSets(benchErrors, 2*chunkLabelSets+100) {
		errs.Updates = append(errs.Updates, schedule.Update{Row: metricsapi.Row{Time: base, Environment: ls[0], Labels: ls[1:],
			Values: []float64{float64(i % 3)}}})
		errs.Counts = append(errs.Counts, schedule.SeriesCounts{Environment: ls[0], Labels: ls[1:],
			Totals: []float64{float64(i % 3)}, Newest: base})
	}
	publish(t, c, errs)

	var ours bytes.Buffer
	if err := c.WriteText(&ours); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(constMetrics{c})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var ref bytes.Buffer
	enc := expfmt.NewEncoder(&ref, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	// The collector's own budget metrics come after the series.
	text := ours.String()
	cut := strings.Index(text, "# HELP edgepipe_series ")
	if cut < 0 {
		t.Fatalf("no edgepipe_series in\n%s", text)
	}
	if got, want := sortedLines([]byte(text[:cut])), sortedLines(ref.Bytes()); !slices.Equal(got, want) {
		t.Errorf("WriteText:\n%s\nclient_golang:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if strings.Contains(text, "cdn_edge_usage_by_country_requests_cache_hit_ratio{country_code=\"quo") {
		t.Error("a metric without a value was written")
	}
	if !strings.Contains(text, `country_code="quo\"te\\back\nslash"`) {
		t.Errorf("label value not escaped:\n%s", text)
	}
}

// TestHandler: /metrics serves the registry's metrics and the collector's
// series, gzipped when asked, lint-clean and parseable.
func TestHandler(t *testing.T) {
	c := newCollector(t, Options{MaxSeries: 1000})
	publish(t, c, withTotals(batch(upd("e1", "us", 0, nil, 100, 0.5, 8000, 120, 40)), total("e1", "us", 0, 100)))
	reg := prometheus.NewPedanticRegistry()
	if _, err := NewSelfMetrics(reg, nil); err != nil {
		t.Fatal(err)
	}
	var errs []error
	h, err := Handler(reg, c, func(err error) { errs = append(errs, err) })
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, gz := range []bool{false, true} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		if gz {
			req.Header.Set("Accept-Encoding", "gzip;q=0.9, identity")
		} else {
			req.Header.Set("Accept-Encoding", "gzip;q=0")
		}
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		var body io.Reader = resp.Body
		if enc := resp.Header.Get("Content-Encoding"); (enc == "gzip") != gz {
			t.Errorf("gzip %v: Content-Encoding %q", gz, enc)
		} else if gz {
			if body, err = gzip.NewReader(resp.Body); err != nil {
				t.Fatal(err)
			}
		}
		b, err := io.ReadAll(body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
			t.Errorf("Content-Type %q", ct)
		}
		p := expfmt.NewTextParser(model.LegacyValidation)
		mfs, err := p.TextToMetricFamilies(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("parse: %v\n%s", err, b)
		}
		for _, name := range []string{"cdn_edge_usage_by_country_requests_edge_total", "cdn_edge_usage_by_country_ttfb_edge_seconds",
			"edgepipe_series", "edgepipe_series_limit", "edgepipe_series_limit_dropped_total", "edgepipe_environments", "go_goroutines",
			"promhttp_metric_handler_errors_total"} {
			if mfs[name] == nil {
				t.Errorf("/metrics lacks %s", name)
			}
		}
		var list []*dto.MetricFamily
		for _, mf := range mfs {
			list = append(list, mf)
		}
		if problems, err := promlint.NewWithMetricFamilies(list).Lint(); err != nil || len(problems) > 0 {
			t.Errorf("promlint: %v %v", problems, err)
		}
	}
	if len(errs) > 0 {
		t.Errorf("errors reported: %v", errs)
	}
}

// TestWriteTextWhilePublishing scrapes while batches (new label sets,
// revisions, a new metric, vanished environments) arrive: every scrape
// parses, and (under -race) nothing races.
func TestWriteTextWhilePublishing(t *testing.T) {
	c := newCollector(t, Options{MaxSeries: 2000})
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.Background()
		for i := range 200 {
			env := string(rune('a' + i%7))
			other := string(rune('A' + i%26))
			b := withTotals(batch(upd(env, "us", i, nil, 1, 0.5, 8, 1, 1), upd(env, other, i, nil, 2, 0.5, 8, 1, 1)),
				total(env, "us", i, float64(i)), total(env, other, i, float64(2*i)))
			if i%50 == 49 {
				b.Metrics = append(append([]string{}, edgeMetrics...), "requests_hit_total")
				for j := range b.Updates {
					b.Updates[j].Row.Values = append(b.Updates[j].Row.Values, 3)
				}
			}
			if err := c.Publish(ctx, b); err != nil {
				t.Error(err)
				return
			}
			if i%40 == 39 {
				c.SetEnvironments([]string{"a", "b", "c"})
			}
		}
	}()
	for {
		select {
		case <-done:
			return
		default:
		}
		var b bytes.Buffer
		if err := c.WriteText(&b); err != nil {
			t.Fatal(err)
		}
		p := expfmt.NewTextParser(model.LegacyValidation)
		if _, err := p.TextToMetricFamilies(&b); err != nil {
			t.Fatalf("a scrape during publishing does not parse: %v", err)
		}
	}
}
