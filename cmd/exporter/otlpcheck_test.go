package main

import (
	"math"
	"sort"
	"strings"
	"time"

	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/sinks/otel"
	"github.com/edgepipe/edgepipe/internal/sinks/otel/otlptest"
)

// otlpSeries identifies an OTLP stream: metric name and attributes.
type otlpSeries struct{ metric, attrs string }

func attrString(attrs map[string]string) string {
	as := make([]string, 0, len(attrs))
	for k, v := range attrs {
		as = append(as, k+"="+v)
	}
	sort.Strings(as)
	return strings.Join(as, ",")
}

// simSeries returns the OTLP stream of metric m of a simulator row.
func (te *testExporter) simSeries(ds, env string, labels []string, m string) otlpSeries {
	name, pct := otel.MetricName(otel.DefaultPrefix, ds, m)
	attrs := map[string]string{otel.AttrEnvironment: env}
	for i, l := range te.sim.DatasetLabels(ds) {
		attrs[l] = labels[i]
	}
	if pct != "" {
		attrs[otel.AttrPercentile] = pct
	}
	return otlpSeries{name, attrString(attrs)}
}

// otlpCheck says how strictly checkOTLP compares.
type otlpCheck struct {
	temporality metricspb.AggregationTemporality
	// every compares every count point with the simulator's sums as read
	// by the poll that made it; otherwise only the newest point of each
	// series (earlier ones may hold values a fault kept out).
	every bool
	// from is where counting began (the first poll's range start).
	from time.Time
}

// checkOTLP checks the OTLP points received, in arrival order, against the
// simulator:
//   - every stream's points are in strictly increasing time order (so no
//     two share a timestamp), counts are monotonic sums of the temporality
//     asked for, cumulative starts never move and deltas never overlap;
//   - the newest count point of every series the simulator has is at the
//     newest poll end and equals the sum of its buckets as the simulator
//     read at that poll (for a delta: the sum of the deltas), and with
//     c.every so does every earlier point;
//   - every gauge point is a value the simulator had for its bucket.
//
// It returns the number of count and gauge points checked.
func (te *testExporter) checkOTLP(label string, pts []otlptest.Point, c otlpCheck) (counts, gauges int) {
	t := te.t
	t.Helper()
	type seen struct {
		last, start time.Time
		sum         float64 // running total (delta: sum of deltas)
	}
	streams := map[otlpSeries]*seen{}
	// value of every count stream at each point time
	atTime := map[time.Time]map[otlpSeries]float64{}
	bad := 0
	fail := func(format string, a ...any) {
		t.Helper()
		if bad++; bad <= 10 {
			t.Errorf(label+": "+format, a...)
		}
	}
	var newest time.Time
	type gaugePoint struct {
		s     otlpSeries
		ds    string
		env   string
		attrs map[string]string
		end   time.Time
		v     float64
	}
	var gps []gaugePoint
	for _, p := range pts {
		if math.IsNaN(p.Value) || math.IsInf(p.Value, 0) || p.Value < 0 {
			fail("%s %v: value %v", p.Metric, p.Attributes, p.Value)
		}
		k := otlpSeries{p.Metric, attrString(p.Attributes)}
		tm, start := time.Unix(0, int64(p.Time)).UTC(), time.Unix(0, int64(p.Start)).UTC()
		st := streams[k]
		if st == nil {
			st = &seen{start: start}
			streams[k] = st
		} else if !tm.After(st.last) {
			fail("%s %s: point at %s after one at %s", k.metric, k.attrs, tm, st.last)
		}
		if !p.Sum {
			parts := strings.SplitN(p.Metric, ".", 3)
			gps = append(gps, gaugePoint{k, parts[1], p.Attributes[otel.AttrEnvironment], p.Attributes, tm, p.Value})
			gauges++
			st.last = tm
			continue
		}
		counts++
		if !p.Monotonic || p.Temporality != c.temporality {
			fail("%s: monotonic %v temporality %v, want %v", p.Metric, p.Monotonic, p.Temporality, c.temporality)
		}
		switch c.temporality {
		case metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE:
			if !start.Equal(st.start) {
				fail("%s %s: cumulative start moved from %s to %s", k.metric, k.attrs, st.start, start)
			}
			st.sum = p.Value
		default:
			if !st.last.IsZero() && !start.Equal(st.last) {
				fail("%s %s: delta [%s, %s) does not start at the previous point %s", k.metric, k.attrs, start, tm, st.last)
			}
			st.sum += p.Value
		}
		if !start.Before(tm) {
			fail("%s %s: point [%s, %s)", k.metric, k.attrs, start, tm)
		}
		st.last = tm
		if atTime[tm] == nil {
			atTime[tm] = map[otlpSeries]float64{}
		}
		atTime[tm][k] = st.sum
		if tm.After(newest) {
			newest = tm
		}
	}
	if counts == 0 {
		t.Fatalf("%s: no OTLP count points: the check proves nothing", label)
	}

	// Counts against the simulator's sums at the poll that made each point.
	ends := []time.Time{newest}
	if c.every {
		ends = ends[:0]
		for e := range atTime {
			ends = append(ends, e)
		}
	}
	envs := te.sim.EnvironmentIDs()
	for _, end := range ends {
		at, ok := te.pollAt(end)
		if !ok {
			t.Fatalf("%s: no poll reached %s", label, end)
		}
		want := map[otlpSeries]float64{}
		for _, ds := range te.sim.DatasetNames() {
			metrics := te.sim.DatasetMetrics(ds)
			for _, env := range envs {
				rows, err := te.sim.Rows(ds, env, metricsapi.FiveMinutes, c.from, end, at)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rows {
					for i, m := range metrics {
						if metricsapi.Classify(m).Kind == metricsapi.KindCount {
							want[te.simSeries(ds, env, r.Labels, m)] += r.Values[i]
						}
					}
				}
			}
		}
		// Every live series has a point at every end (all of them at the
		// newest one).
		got := atTime[end]
		for k, w := range want {
			g, ok := got[k]
			if !ok || g != w {
				fail("%s %s at %s: %v (point there: %v), simulator's sum as read at %s: %v", k.metric, k.attrs,
					end.Format(time.TimeOnly), g, ok, at.Format(time.TimeOnly), w)
			}
		}
		for k, g := range got {
			if _, ok := want[k]; !ok && g != 0 {
				fail("%s %s at %s: %v, the simulator has no such series", k.metric, k.attrs, end.Format(time.TimeOnly), g)
			}
		}
	}

	// Gauges: each a value the simulator had for that bucket at one of the
	// polls that could have sent it.
	type rowKey struct {
		ds, env string
		end     time.Time
		at      time.Time
	}
	cache := map[rowKey]map[string][]float64{}
	rowsAt := func(ds, env string, end, at time.Time) map[string][]float64 {
		k := rowKey{ds, env, end, at}
		if m, ok := cache[k]; ok {
			return m
		}
		rows, err := te.sim.Rows(ds, env, metricsapi.FiveMinutes, end.Add(-5*time.Minute), end, at)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string][]float64{}
		for _, r := range rows {
			m[strings.Join(r.Labels, "\xff")] = r.Values
		}
		cache[k] = m
		return m
	}
	// metricIndex finds the simulator's metric of an OTLP metric name and
	// percentile.
	metricIndex := map[string]int{}
	for _, ds := range te.sim.DatasetNames() {
		for i, m := range te.sim.DatasetMetrics(ds) {
			name, pct := otel.MetricName(otel.DefaultPrefix, ds, m)
			metricIndex[name+"|"+pct] = i
		}
	}
	for _, g := range gps {
		labels := te.sim.DatasetLabels(g.ds)
		lv := make([]string, len(labels))
		for i, l := range labels {
			lv[i] = g.attrs[l]
		}
		idx, ok := metricIndex[g.s.metric+"|"+g.attrs[otel.AttrPercentile]]
		if !ok {
			fail("gauge %s: not a metric of the simulator", g.s.metric)
			continue
		}
		key := strings.Join(lv, "\xff")
		found := false
		for _, at := range te.polls {
			if at.Before(g.end) || at.After(g.end.Add(time.Hour)) {
				continue
			}
			if vals, ok := rowsAt(g.ds, g.env, g.end, at)[key]; ok && vals[idx] == g.v {
				found = true
				break
			}
		}
		if !found {
			fail("gauge %s %s @%s = %v: not a value the simulator had for that bucket", g.s.metric, g.s.attrs, g.end.Format(time.TimeOnly), g.v)
		}
	}
	if gauges == 0 {
		t.Errorf("%s: no OTLP gauge points", label)
	}
	return counts, gauges
}
