package platformsim_test

import (
	"fmt"
	"math"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platformsim"
)

func query(envs []string, dims, metrics []string, start, end time.Time, g string) map[string]any {
	q := map[string]any{
		"dimensions": dims,
		"metrics":    metrics,
		"filters":    map[string]any{"environment_id": envs},
		"date_range": map[string]any{"start": start.Format(time.RFC3339), "end": end.Format(time.RFC3339)},
	}
	if g != "" {
		q["time_granularity"] = g
	}
	return q
}

// key of a row by its dimension values.
func rowKey(r wireRow, dims []string) string {
	var b strings.Builder
	for _, d := range dims {
		fmt.Fprintf(&b, "%v|", r[d])
	}
	return b.String()
}

func allDims(srv *platformsim.Server, ds string) []string {
	return append([]string{"time", "environment_id"}, srv.DatasetLabels(ds)...)
}

func TestDataDeterministicAndSplittable(t *testing.T) {
	clk := newClock(testNow)
	cfg := platformsim.Config{Seed: 42, Now: clk.Now}
	srv, base := startSim(t, cfg)
	tok := token(t, base, "app.metrics")
	envs := srv.EnvironmentIDs()[:20]
	// A settled range and one that reaches into late data and the present.
	for _, tc := range []struct {
		g          metricsapi.Granularity
		start, end time.Time
	}{
		{metricsapi.FiveMinutes, testNow.Add(-5 * time.Hour).Truncate(time.Hour), testNow.Add(-4 * time.Hour).Truncate(time.Hour)},
		{metricsapi.FiveMinutes, testNow.Add(-40 * time.Minute).Truncate(time.Hour), testNow.Add(time.Hour).Truncate(time.Hour)},
		{metricsapi.Hour, testNow.Add(-6 * time.Hour).Truncate(time.Hour), testNow.Add(time.Hour).Truncate(time.Hour)},
		{metricsapi.Day, testNow.Add(-4 * 24 * time.Hour).Truncate(24 * time.Hour), testNow.Add(24 * time.Hour).Truncate(24 * time.Hour)},
	} {
		for _, ds := range srv.DatasetNames() {
			t.Run(fmt.Sprintf("%s/%s/%s", tc.g, tc.start.Format("0102T15"), ds), func(t *testing.T) {
				dims := allDims(srv, ds)
				metrics := srv.DatasetMetrics(ds)
				_, whole := dataRows(t, dataQuery(t, base, tok, ds, query(envs, dims, metrics, tc.start, tc.end, string(tc.g))))
				mid := tc.start.Add(tc.end.Sub(tc.start) / 2).Truncate(tc.g.Duration())
				parts := map[string]wireRow{}
				for _, e := range [][]string{envs[:7], envs[7:]} {
					for _, r := range [][2]time.Time{{tc.start, mid}, {mid, tc.end}} {
						_, rows := dataRows(t, dataQuery(t, base, tok, ds, query(e, dims, metrics, r[0], r[1], string(tc.g))))
						for _, row := range rows {
							k := rowKey(row, dims)
							if _, dup := parts[k]; dup {
								t.Fatalf("row %s in two split answers", k)
							}
							parts[k] = row
						}
					}
				}
				if len(whole) == 0 || len(whole) != len(parts) {
					t.Fatalf("one request: %d rows; split: %d rows", len(whole), len(parts))
				}
				for _, row := range whole {
					other, ok := parts[rowKey(row, dims)]
					if !ok {
						t.Fatalf("row %v missing when split", row)
					}
					for _, m := range metrics {
						if other.f(m) != row.f(m) {
							t.Fatalf("%s of row %v differs when split: %v", m, row, other)
						}
					}
				}
				// The truth function returns exactly the wire rows.
				var truth int
				for _, env := range envs {
					rows, err := srv.Rows(ds, env, tc.g, tc.start, tc.end, clk.Now())
					if err != nil {
						t.Fatal(err)
					}
					for _, tr := range rows {
						truth++
						w := wireRow{"time": tr.Time.Format(time.RFC3339), "environment_id": tr.Environment}
						for i, l := range srv.DatasetLabels(ds) {
							w[l] = tr.Labels[i]
						}
						got, ok := parts[rowKey(w, dims)]
						if !ok {
							t.Fatalf("truth row %v not on the wire", w)
						}
						for i, m := range metrics {
							if got.f(m) != tr.Values[i] {
								t.Fatalf("%s of %v: wire %v, truth %v", m, w, got.f(m), tr.Values[i])
							}
						}
					}
				}
				if truth != len(whole) {
					t.Fatalf("truth has %d rows, wire %d", truth, len(whole))
				}
			})
		}
	}
	t.Run("same seed, same data; other seed, other data", func(t *testing.T) {
		start := testNow.Add(-6 * time.Hour).Truncate(time.Hour)
		same, err := platformsim.New(platformsim.Config{Seed: 42})
		if err != nil {
			t.Fatal(err)
		}
		defer same.Close()
		other, err := platformsim.New(platformsim.Config{Seed: 43})
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		a, _ := srv.Rows("origin_usage", envs[0], metricsapi.FiveMinutes, start, start.Add(time.Hour), testNow)
		b, _ := same.Rows("origin_usage", envs[0], metricsapi.FiveMinutes, start, start.Add(time.Hour), testNow)
		if len(a) == 0 || mustJSON(a) != mustJSON(b) {
			t.Fatal("same seed gave other rows")
		}
		c, _ := other.Rows("origin_usage", other.EnvironmentIDs()[0], metricsapi.FiveMinutes, start, start.Add(time.Hour), testNow)
		if len(c) > 0 && len(a) > 0 && mustJSON(a[0].Values) == mustJSON(c[0].Values) {
			t.Fatal("other seed gave the same values")
		}
	})
}

var countryRe = regexp.MustCompile(`^([a-z]{2}|-)$`)

// rowContext names a row in failure messages.
type rowContext wireRow

func (r rowContext) String() string { return fmt.Sprintf("row %v", wireRow(r)) }

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestEdgeUsageRealism(t *testing.T) {
	clk := newClock(testNow)
	srv, base := startSim(t, platformsim.Config{Seed: 7, Now: clk.Now})
	tok := token(t, base, "app.metrics")
	ds := "edge_usage_by_country"
	metrics := srv.DatasetMetrics(ds)
	dims := allDims(srv, ds)
	start := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC) // a settled Sunday
	envs := srv.EnvironmentIDs()
	var rows, hourRows []wireRow
	for _, chunk := range [][]string{envs[:20], envs[20:]} {
		_, r := dataRows(t, dataQuery(t, base, tok, ds, query(chunk, dims, metrics, start, start.Add(8*time.Hour), "FIVE_MINUTES")))
		rows = append(rows, r...)
		_, r = dataRows(t, dataQuery(t, base, tok, ds, query(chunk, []string{"time", "environment_id"}, []string{"requests_edge_total"}, start, start.Add(24*time.Hour), "HOUR")))
		hourRows = append(hourRows, r...)
	}
	ps := []string{"5", "25", "50", "75", "95", "99"}
	envTotal := map[string]float64{}
	envHits := map[string]float64{}
	envEdge := map[string]float64{}
	perSeries := map[string]int{}
	hourly := map[string]map[int]float64{}
	var errRatios []float64
	unsorted := false
	for i, r := range rows {
		ctx := rowContext(r)
		if !countryRe.MatchString(r.s("country_code")) {
			t.Fatalf("%s: country code", ctx)
		}
		e := r.f("requests_edge_total")
		if e <= 0 {
			t.Fatalf("%s: a row without traffic", ctx)
		}
		if r.f("requests_hit_total")+r.f("requests_miss_total")+r.f("requests_stale_total") != e {
			t.Fatalf("%s: hit+miss+stale != edge", ctx)
		}
		if r.f("requests_2xx_total")+r.f("requests_3xx_total")+r.f("requests_4xx_total")+r.f("requests_5xx_total") != e {
			t.Fatalf("%s: 2xx..5xx != edge", ctx)
		}
		if r.f("bytes_hit_total")+r.f("bytes_miss_total")+r.f("bytes_stale_total") != r.f("bytes_edge_total") {
			t.Fatalf("%s: bytes do not add up", ctx)
		}
		if !near(r.f("requests_cache_hit_ratio"), (r.f("requests_hit_total")+r.f("requests_stale_total"))/e, 1e-6) {
			t.Fatalf("%s: cache hit ratio", ctx)
		}
		if !near(r.f("requests_error_ratio"), r.f("requests_5xx_total")/e, 1e-6) {
			t.Fatalf("%s: error ratio", ctx)
		}
		if !near(r.f("requests_per_second_edge"), e/300, 1e-3) || !near(r.f("bits_per_second_edge"), r.f("bytes_edge_total")*8/300, 1e-3) {
			t.Fatalf("%s: per-second rates", ctx)
		}
		if pr := r.f("requests_prefetch_cache_hit_ratio"); pr < 0 || pr > 1 || r.f("requests_prefetch_total") > e {
			t.Fatalf("%s: prefetch", ctx)
		}
		if r.f("requests_cachable_total") < r.f("requests_hit_total")+r.f("requests_stale_total") || r.f("requests_cachable_total") > e {
			t.Fatalf("%s: cachable", ctx)
		}
		for j, p := range ps {
			tt, rt := r.f("ttfb_edge_ms_"+p+"_percentile"), r.f("response_time_edge_ms_"+p+"_percentile")
			if tt <= 0 || rt < tt {
				t.Fatalf("%s: P%s ttfb %v response time %v", ctx, p, tt, rt)
			}
			if j > 0 {
				q := ps[j-1]
				if tt < r.f("ttfb_edge_ms_"+q+"_percentile") || rt < r.f("response_time_edge_ms_"+q+"_percentile") {
					t.Fatalf("%s: percentiles not ordered at P%s", ctx, p)
				}
			}
		}
		env := r.s("environment_id")
		envHits[env] += r.f("requests_hit_total") + r.f("requests_stale_total")
		envEdge[env] += e
		perSeries[env+r.s("country_code")]++
		ts, err := time.Parse(time.RFC3339, r.s("time"))
		if err != nil || ts.Before(start) || !ts.Before(start.Add(8*time.Hour)) || ts.Sub(start)%(5*time.Minute) != 0 {
			t.Fatalf("%s: time %v", ctx, err)
		}
		if e > 1000 {
			errRatios = append(errRatios, r.f("requests_error_ratio"))
		}
		if i > 0 && r.s("time") < rows[i-1].s("time") {
			unsorted = true
		}
	}
	if !unsorted {
		t.Error("rows come sorted by time")
	}
	for _, r := range hourRows {
		env := r.s("environment_id")
		ts, _ := time.Parse(time.RFC3339, r.s("time"))
		envTotal[env] += r.f("requests_edge_total")
		if hourly[env] == nil {
			hourly[env] = map[int]float64{}
		}
		hourly[env][ts.Hour()] += r.f("requests_edge_total")
	}
	missing := 0
	for _, n := range perSeries {
		if n > 96 {
			t.Fatalf("a series has %d five-minute buckets in 8 hours", n)
		}
		if n < 96 {
			missing++
		}
	}
	if missing == 0 {
		t.Error("no series has missing buckets")
	}
	var totals []float64
	for env, tot := range envTotal {
		totals = append(totals, tot)
		if tot > 1e6 {
			if hr := envHits[env] / envEdge[env]; hr < 0.78 || hr > 0.99 {
				t.Errorf("environment %s: cache hit ratio %.3f", env, hr)
			}
			var lo, hi float64 = math.Inf(1), 0
			for _, v := range hourly[env] {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
			if hi < 1.5*lo { // countries in many time zones flatten the curve
				t.Errorf("environment %s: no daily curve (hourly min %v max %v)", env, lo, hi)
			}
		}
	}
	sort.Float64s(totals)
	if len(totals) < 20 || totals[len(totals)-1] < 100*totals[0] {
		t.Errorf("environment sizes do not differ enough: %v", totals)
	}
	sort.Float64s(errRatios)
	if med, top := errRatios[len(errRatios)/2], errRatios[len(errRatios)-1]; top < 10*med || top < 0.01 {
		t.Errorf("no 5xx bursts: median error ratio %v, max %v", med, top)
	}
}

// sums groups rows by the given dimensions and sums metric.
func sums(rows []wireRow, metric string, dims ...string) map[string]float64 {
	out := map[string]float64{}
	for _, r := range rows {
		out[rowKey(r, dims)] += r.f(metric)
	}
	return out
}

func TestDatasetsConsistent(t *testing.T) {
	clk := newClock(testNow)
	srv, base := startSim(t, platformsim.Config{Seed: 11, Now: clk.Now})
	tok := token(t, base, "app.metrics")
	envs := srv.EnvironmentIDs()[:10]
	start := time.Date(2026, 11, 21, 6, 0, 0, 0, time.UTC)
	end := start.Add(12 * time.Hour)
	get := func(ds string) []wireRow {
		_, rows := dataRows(t, dataQuery(t, base, tok, ds, query(envs, allDims(srv, ds), srv.DatasetMetrics(ds), start, end, "HOUR")))
		if len(rows) == 0 {
			t.Fatalf("%s: no rows", ds)
		}
		return rows
	}
	edge := get("edge_usage_by_country")
	edgeErrors := get("edge_errors")
	byCountry := get("origin_usage_by_country")
	usage := get("origin_usage")
	originErrors := get("origin_errors")
	offload := get("origin_offload")

	t.Run("edge_errors adds up to requests_5xx_total", func(t *testing.T) {
		a := sums(edge, "requests_5xx_total", "time", "environment_id", "country_code")
		b := sums(edgeErrors, "requests_edge_total", "time", "environment_id", "country_code")
		for k, v := range b {
			if a[k] != v {
				t.Fatalf("%s: edge_errors %v, 5xx %v", k, v, a[k])
			}
		}
		for k, v := range a {
			if v > 0 && b[k] != v {
				t.Fatalf("%s: 5xx %v, edge_errors %v", k, v, b[k])
			}
		}
		for _, r := range edgeErrors {
			if c := r.f("http_status_code"); c < 500 || c > 599 {
				t.Fatalf("edge error status %v", c)
			}
		}
	})
	t.Run("origin requests follow misses", func(t *testing.T) {
		miss := sums(edge, "requests_miss_total", "time", "environment_id", "country_code")
		stale := sums(edge, "requests_stale_total", "time", "environment_id", "country_code")
		orig := sums(byCountry, "requests_origin_total", "time", "environment_id", "country_code")
		for k, o := range orig {
			if o < miss[k] || o > miss[k]+stale[k] {
				t.Fatalf("%s: origin %v, miss %v, stale %v", k, o, miss[k], stale[k])
			}
		}
	})
	t.Run("origin breakdowns agree", func(t *testing.T) {
		a := sums(byCountry, "requests_origin_total", "time", "environment_id", "origin_name")
		b := sums(usage, "requests_origin_total", "time", "environment_id", "origin_name")
		if len(a) != len(b) {
			t.Fatalf("%d vs %d series", len(a), len(b))
		}
		for k, v := range a {
			if b[k] != v {
				t.Fatalf("%s: by country %v, by method/type %v", k, v, b[k])
			}
		}
		errs := sums(originErrors, "requests_origin_total", "time", "environment_id", "origin_name", "http_method", "content_type")
		all := sums(usage, "requests_origin_total", "time", "environment_id", "origin_name", "http_method", "content_type")
		for k, v := range errs {
			if v > all[k] {
				t.Fatalf("%s: %v origin errors of %v requests", k, v, all[k])
			}
		}
		for _, r := range originErrors {
			if c := r.f("http_status_code"); c < 400 || c > 599 {
				t.Fatalf("origin error status %v", c)
			}
		}
	})
	t.Run("offload is consistent", func(t *testing.T) {
		e := sums(edge, "requests_edge_total", "time", "environment_id")
		oe := sums(offload, "requests_edge_total", "time", "environment_id")
		for k, v := range e {
			if oe[k] != v {
				t.Fatalf("%s: offload edge %v, edge usage %v", k, oe[k], v)
			}
		}
		u := sums(usage, "requests_origin_total", "time", "environment_id")
		oo := sums(offload, "requests_origin_total", "time", "environment_id")
		for k, v := range u {
			if oo[k] > v || oo[k] < 0.98*v {
				t.Fatalf("%s: offload origin %v, origin usage %v", k, oo[k], v)
			}
		}
		methods := map[string]float64{}
		for _, r := range offload {
			if r.f("requests_origin_total") > r.f("requests_edge_total") {
				t.Fatalf("origin above edge: %v", r)
			}
			methods[r.s("http_method")] += r.f("requests_edge_total")
		}
		if methods["GET"] < 5*(methods["HEAD"]+methods["POST"]) || methods["HEAD"] == 0 || methods["POST"] == 0 {
			t.Fatalf("method mix %v", methods)
		}
		var edgeSum, originSum float64
		for k := range e {
			edgeSum += e[k]
			originSum += oo[k]
		}
		if off := 1 - originSum/edgeSum; off < 0.75 || off > 0.99 {
			t.Fatalf("origin offload %.3f", off)
		}
	})
	t.Run("origin percentiles ordered", func(t *testing.T) {
		for _, rows := range [][]wireRow{byCountry, usage} {
			for _, r := range rows {
				prev, prevRT := 0.0, 0.0
				for _, p := range []string{"5", "25", "50", "75", "95", "99"} {
					tt, rt := r.f("ttfb_origin_ms_"+p+"_percentile"), r.f("response_time_origin_ms_"+p+"_percentile")
					if tt < prev || rt < prevRT || rt < tt || tt <= 0 {
						t.Fatalf("percentiles of %v", r)
					}
					prev, prevRT = tt, rt
				}
			}
		}
	})
}

func TestAggregation(t *testing.T) {
	clk := newClock(testNow)
	srv, base := startSim(t, platformsim.Config{Seed: 5, Now: clk.Now})
	tok := token(t, base, "app.metrics")
	envs := srv.EnvironmentIDs()[:3]
	ds := "edge_usage_by_country"
	start := time.Date(2026, 11, 22, 6, 0, 0, 0, time.UTC)
	end := start.Add(6 * time.Hour)
	_, full := dataRows(t, dataQuery(t, base, tok, ds, query(envs, allDims(srv, ds), srv.DatasetMetrics(ds), start, end, "HOUR")))

	t.Run("country aggregated away", func(t *testing.T) {
		_, rows := dataRows(t, dataQuery(t, base, tok, ds, query(envs, []string{"environment_id", "time"},
			[]string{"requests_edge_total", "requests_cache_hit_ratio", "requests_per_second_edge", "ttfb_edge_ms_50_percentile", "ttfb_edge_ms_99_percentile"}, start, end, "HOUR")))
		edge := sums(full, "requests_edge_total", "environment_id", "time")
		hits := sums(full, "requests_hit_total", "environment_id", "time")
		stale := sums(full, "requests_stale_total", "environment_id", "time")
		if len(rows) != len(edge) {
			t.Fatalf("%d rows, want %d", len(rows), len(edge))
		}
		for _, r := range rows {
			k := rowKey(r, []string{"environment_id", "time"})
			if r.f("requests_edge_total") != edge[k] {
				t.Fatalf("%s: edge %v, sum %v", k, r.f("requests_edge_total"), edge[k])
			}
			if !near(r.f("requests_cache_hit_ratio"), (hits[k]+stale[k])/edge[k], 1e-6) {
				t.Fatalf("%s: ratio not recomputed from counts", k)
			}
			if !near(r.f("requests_per_second_edge"), edge[k]/3600, 1e-3) {
				t.Fatalf("%s: rate", k)
			}
			lo, hi := math.Inf(1), 0.0
			for _, f := range full {
				if rowKey(f, []string{"environment_id", "time"}) == k {
					lo, hi = math.Min(lo, f.f("ttfb_edge_ms_50_percentile")), math.Max(hi, f.f("ttfb_edge_ms_50_percentile"))
				}
			}
			if p := r.f("ttfb_edge_ms_50_percentile"); p < lo-0.01 || p > hi+0.01 || r.f("ttfb_edge_ms_99_percentile") < p {
				t.Fatalf("%s: P50 %v outside [%v, %v]", k, p, lo, hi)
			}
		}
	})
	t.Run("summary without time", func(t *testing.T) {
		_, rows := dataRows(t, dataQuery(t, base, tok, ds, query(envs, []string{"environment_id"},
			[]string{"requests_edge_total", "requests_error_ratio", "bits_per_second_edge", "bytes_edge_total"}, start, end, "HOUR")))
		edge := sums(full, "requests_edge_total", "environment_id")
		if len(rows) != len(envs) {
			t.Fatalf("%d summary rows", len(rows))
		}
		for _, r := range rows {
			k := rowKey(r, []string{"environment_id"})
			if r.f("requests_edge_total") != edge[k] {
				t.Fatalf("summary %v, sum %v", r.f("requests_edge_total"), edge[k])
			}
			if !near(r.f("bits_per_second_edge"), r.f("bytes_edge_total")*8/(6*3600), 1e-3) {
				t.Fatalf("summary rate %v", r)
			}
		}
	})
	t.Run("optional filter", func(t *testing.T) {
		q := query(envs, []string{"country_code"}, []string{"requests_edge_total"}, start, end, "HOUR")
		q["filters"].(map[string]any)["country_code"] = []string{"us", "de"}
		_, rows := dataRows(t, dataQuery(t, base, tok, ds, q))
		want := sums(full, "requests_edge_total", "country_code")
		if len(rows) != 2 {
			t.Fatalf("%d rows for two countries", len(rows))
		}
		for _, r := range rows {
			if r.f("requests_edge_total") != want[rowKey(r, []string{"country_code"})] {
				t.Fatalf("filtered %v", r)
			}
		}
	})
	t.Run("default granularity", func(t *testing.T) {
		for _, tc := range []struct {
			d    time.Duration
			want metricsapi.Granularity
		}{
			{3 * time.Minute, metricsapi.FiveMinutes},
			{30 * time.Minute, metricsapi.FiveMinutes},
			{3 * time.Hour, metricsapi.Hour},
			{25 * time.Hour, metricsapi.Day},
			{20 * 24 * time.Hour, metricsapi.Day},
		} {
			srv.ResetStats()
			s := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
			_, rows := dataRows(t, dataQuery(t, base, tok, ds, query(envs[:1], []string{"time"}, []string{"requests_edge_total"}, s, s.Add(tc.d), "")))
			st := srv.Stats()
			if len(st.Data) != 1 || st.Data[0].Granularity != tc.want || st.Data[0].GranularitySent != "" {
				t.Fatalf("range %s: %+v, want %s", tc.d, st.Data, tc.want)
			}
			for _, r := range rows {
				ts, _ := time.Parse(time.RFC3339, r.s("time"))
				if ts.Sub(s)%tc.want.Duration() != 0 {
					t.Fatalf("range %s: bucket %v not on a %s boundary", tc.d, ts, tc.want)
				}
			}
		}
	})
}

func TestNumbersAndStrings(t *testing.T) {
	for _, tc := range []struct {
		style           platformsim.NumberStyle
		strings, number bool
	}{
		{platformsim.NumbersMixed, true, true},
		{platformsim.NumbersOnly, false, true},
		{platformsim.NumbersAsStrings, true, false},
	} {
		srv, base := startSim(t, platformsim.Config{Seed: 1, Now: newClock(testNow).Now, Numbers: tc.style})
		tok := token(t, base, "app.metrics")
		start := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
		r := dataQuery(t, base, tok, "edge_errors", query(srv.EnvironmentIDs()[:5], []string{"time", "environment_id", "http_status_code"}, []string{"requests_edge_total"}, start, start.Add(24*time.Hour), "HOUR"))
		body := string(r.body)
		hasString := regexp.MustCompile(`,"5\d\d",`).MatchString(body)
		hasNumber := regexp.MustCompile(`,5\d\d,`).MatchString(body)
		if hasString != tc.strings || hasNumber != tc.number {
			t.Errorf("style %d: numeric strings %v, numbers %v", tc.style, hasString, hasNumber)
		}
		dataRows(t, r) // both decode
	}
}

func TestLateData(t *testing.T) {
	bucket := time.Date(2026, 11, 23, 14, 0, 0, 0, time.UTC)
	clk := newClock(bucket.Add(150 * time.Second)) // in the middle of the bucket
	srv, base := startSim(t, platformsim.Config{Seed: 9, Now: clk.Now, LateData: 10 * time.Minute})
	envs := srv.EnvironmentIDs()[:20]
	ds := "edge_usage_by_country"
	dims := allDims(srv, ds)
	metrics := []string{"requests_edge_total", "requests_hit_total", "requests_5xx_total", "bytes_edge_total", "ttfb_edge_ms_95_percentile"}
	poll := func() map[string]wireRow {
		tok := token(t, base, "app.metrics") // the clock jumps past token expiry
		_, rows := dataRows(t, dataQuery(t, base, tok, ds, query(envs, dims, metrics, bucket.Add(-time.Hour), bucket.Add(time.Hour), "FIVE_MINUTES")))
		out := map[string]wireRow{}
		for _, r := range rows {
			out[rowKey(r, dims)] = r
		}
		return out
	}
	cur := bucket.Format(time.RFC3339)
	old := bucket.Add(-time.Hour).Format(time.RFC3339)
	first := poll()
	var polls []map[string]wireRow
	times := []time.Duration{150 * time.Second, 5 * time.Minute, 7 * time.Minute, 10 * time.Minute, 14*time.Minute + 59*time.Second, 15 * time.Minute, 20 * time.Minute, time.Hour}
	for _, d := range times {
		clk.Set(bucket.Add(d))
		p := poll()
		polls = append(polls, p)
		for k := range p {
			if strings.HasPrefix(k, bucket.Add(10*time.Minute).Format(time.RFC3339)) && d < 10*time.Minute {
				t.Fatalf("at +%s a bucket that has not started: %s", d, k)
			}
		}
	}
	_ = first
	changed := map[int]bool{}
	for i := 1; i < len(polls); i++ {
		for k, prev := range polls[i-1] {
			now, ok := polls[i][k]
			if !ok {
				t.Fatalf("poll %d: row %s disappeared", i, k)
			}
			for _, m := range metrics[:4] {
				if now.f(m) < prev.f(m) {
					t.Fatalf("poll %d: %s of %s went down from %v to %v", i, m, k, prev.f(m), now.f(m))
				}
			}
			if strings.HasPrefix(k, cur) && mustJSON(now) != mustJSON(prev) {
				changed[i] = true
			}
			if strings.HasPrefix(k, old) && mustJSON(now) != mustJSON(prev) {
				t.Fatalf("settled bucket changed: %s", k)
			}
		}
	}
	// The current bucket grows while in progress and during late data…
	for i := 1; i <= 4; i++ {
		if !changed[i] {
			t.Errorf("bucket did not change between poll %d and %d", i-1, i)
		}
	}
	// …and is final from LateData after its end.
	for i := 6; i < len(polls); i++ {
		if changed[i] {
			t.Errorf("bucket changed after it settled (poll %d)", i)
		}
	}
	// At the end of the bucket, a clear share is still missing.
	var atEnd, final float64
	for k, r := range polls[1] {
		if strings.HasPrefix(k, cur) {
			atEnd += r.f("requests_edge_total")
			final += polls[len(polls)-1][k].f("requests_edge_total")
		}
	}
	if atEnd >= final || atEnd < 0.7*final {
		t.Errorf("at the bucket's end %v of final %v", atEnd, final)
	}
	// Rows truth agrees at a late-data instant.
	clk.Set(bucket.Add(8 * time.Minute))
	p := poll()
	tr, err := srv.Rows(ds, envs[0], metricsapi.FiveMinutes, bucket, bucket.Add(5*time.Minute), clk.Now())
	if err != nil || len(tr) == 0 {
		t.Fatalf("truth: %v, %d rows", err, len(tr))
	}
	for _, r := range tr {
		w := p[rowKey(wireRow{"time": cur, "environment_id": envs[0], "country_code": r.Labels[0]}, dims)]
		if w == nil || w.f("requests_edge_total") != r.Values[0] {
			t.Fatalf("truth %v, wire %v", r, w)
		}
	}
}

func TestFaults(t *testing.T) {
	srv, base := startSim(t, platformsim.Config{Seed: 1})
	tok := token(t, base, "app.metrics")
	url := base + "/metrics/v1/datasets"
	get := func() response { return do(t, http.MethodGet, url, "Bearer "+tok, "", "") }

	srv.SetFaults(platformsim.Faults{Rate429: 1, RetryAfter: 2500 * time.Millisecond})
	r := get()
	checkError(t, r, 429, "")
	if r.header.Get("Retry-After") != "3" {
		t.Fatalf("Retry-After %q, want 3", r.header.Get("Retry-After"))
	}
	// The token endpoint is not subject to faults.
	if token(t, base, "app.metrics") == "" {
		t.Fatal("no token")
	}

	srv.SetFaults(platformsim.Faults{Rate5xx: 1})
	if r := get(); r.status != 500 && r.status != 503 {
		t.Fatalf("5xx fault: %d", r.status)
	}

	srv.SetFaults(platformsim.Faults{Rate429: 0.3})
	n := 0
	for i := 0; i < 200; i++ {
		if get().status == 429 {
			n++
		}
	}
	if n < 30 || n > 90 {
		t.Fatalf("%d of 200 requests got 429 at rate 0.3", n)
	}

	srv.SetFaults(platformsim.Faults{})
	srv.FailNext(2, 429)
	if a, b, c := get().status, get().status, get().status; a != 429 || b != 429 || c != 200 {
		t.Fatalf("FailNext: %d %d %d", a, b, c)
	}

	srv.SetFaults(platformsim.Faults{Latency: 80 * time.Millisecond})
	began := time.Now()
	if get().status != 200 || time.Since(began) < 80*time.Millisecond {
		t.Fatal("latency not applied")
	}

	// Unauthenticated requests get 401 whatever the faults.
	srv.SetFaults(platformsim.Faults{Rate429: 1})
	checkError(t, do(t, http.MethodGet, url, "", "", ""), 401, "Authorization")

	st := srv.Stats()
	if st.Count("GET /metrics/v1/datasets", 429) < 30 || st.Count("POST /connect/token", 200) != 2 {
		t.Fatalf("stats %v", st.Requests)
	}
}

// TestGranularitiesAgree checks that coarser buckets tell the same story as
// finer ones: they are drawn independently from the same curves, so a day's
// total agrees closely, not exactly.
func TestGranularitiesAgree(t *testing.T) {
	srv, err := platformsim.New(platformsim.Config{Seed: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	day := time.Date(2026, 11, 19, 0, 0, 0, 0, time.UTC)
	at := day.Add(48 * time.Hour)
	total := func(env string, g metricsapi.Granularity) float64 {
		rows, err := srv.Rows("edge_usage_by_country", env, g, day, day.Add(24*time.Hour), at)
		if err != nil {
			t.Fatal(err)
		}
		var s float64
		for _, r := range rows {
			s += r.Values[0]
		}
		return s
	}
	checked := 0
	for _, env := range srv.EnvironmentIDs() {
		five := total(env, metricsapi.FiveMinutes)
		if five < 1e6 {
			continue // small environments are noisy
		}
		checked++
		for _, g := range []metricsapi.Granularity{metricsapi.Hour, metricsapi.Day} {
			if v := total(env, g); math.Abs(v-five) > 0.05*five {
				t.Errorf("%s: day total %v at %s, %v at FIVE_MINUTES", env, v, g, five)
			}
		}
	}
	if checked < 5 {
		t.Fatalf("only %d large environments", checked)
	}
}
