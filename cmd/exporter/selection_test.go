package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/sinks/otel/otlptest"
	promsink "github.com/edgepipe/edgepipe/internal/sinks/prometheus"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// writeConfig writes a config file for the test and returns its path.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "edgepipe.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// selection is what a config file keeps of one dataset, for the truth.
type selection struct {
	keep        []string // label dimensions kept
	percentiles []string // percentiles kept (nil: all)
	metric      func(string) bool
}

// aggregated is the truth of an exporter that exports datasets as sel says:
// per exported series the counter (the simulator's leaf rows summed over the
// dimensions left out, over every bucket of the range), or for gauges the
// smallest and largest leaf value of the series' newest bucket (an exact
// aggregate of a ratio or percentile lies between them).
type aggregated struct {
	counters   map[string]float64
	gauges     map[string][2]float64
	labelSets  map[string]map[string]bool // dataset → label set keys
	percentile map[string]map[string]bool // dataset → percentiles exported
}

func aggregatedTruth(t *testing.T, sim *platformsim.Server, envs []string, sel map[string]selection, from, to, at time.Time) aggregated {
	t.Helper()
	a := aggregated{counters: map[string]float64{}, gauges: map[string][2]float64{},
		labelSets: map[string]map[string]bool{}, percentile: map[string]map[string]bool{}}
	for ds, s := range sel {
		labels := sim.DatasetLabels(ds)
		metrics := sim.DatasetMetrics(ds)
		pos := make([]int, len(s.keep))
		for i, k := range s.keep {
			pos[i] = slices.Index(labels, k)
			if pos[i] < 0 {
				t.Fatalf("%s has no dimension %s", ds, k)
			}
		}
		a.labelSets[ds], a.percentile[ds] = map[string]bool{}, map[string]bool{}
		type gauge struct {
			t        time.Time
			min, max float64
		}
		newest := map[string]gauge{}
		var dsNewest time.Time
		for _, env := range envs {
			rows, err := sim.Rows(ds, env, metricsapi.FiveMinutes, from, to, at)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				lbl := map[string]string{"environment_id": env}
				for i, k := range s.keep {
					lbl[k] = r.Labels[pos[i]]
				}
				a.labelSets[ds][seriesKey("", lbl)] = true
				if r.Time.After(dsNewest) {
					dsNewest = r.Time
				}
				for i, m := range metrics {
					info := metricsapi.Classify(m)
					if s.metric != nil && !s.metric(m) ||
						info.Kind == metricsapi.KindPercentile && s.percentiles != nil && !slices.Contains(s.percentiles, info.Percentile) {
						continue
					}
					v := r.Values[i]
					if math.IsNaN(v) {
						continue
					}
					name, pct := promsink.Name(promsink.DefaultPrefix, ds, m)
					ml := lbl
					if pct != "" {
						a.percentile[ds][pct] = true
						ml = map[string]string{"percentile": pct}
						for k, v := range lbl {
							ml[k] = v
						}
					}
					key := seriesKey(name, ml)
					switch info.Kind {
					case metricsapi.KindCount:
						a.counters[key] += v
						continue
					case metricsapi.KindPercentile:
						v /= 1000
					case metricsapi.KindRate:
						if strings.HasPrefix(m, "bits_") {
							v /= 8
						}
					}
					g, ok := newest[key]
					switch {
					case !ok || r.Time.After(g.t):
						newest[key] = gauge{r.Time, v, v}
					case r.Time.Equal(g.t):
						newest[key] = gauge{g.t, math.Min(g.min, v), math.Max(g.max, v)}
					}
				}
			}
		}
		for k, g := range newest {
			if !g.t.Before(dsNewest.Add(-promsink.DefaultGaugeMaxAge)) {
				a.gauges[k] = [2]float64{g.min, g.max}
			}
		}
	}
	return a
}

// check compares the scraped cdn_ series of the selected datasets with the
// truth: the same series, counters exactly, gauges within their leaves'
// range. Rates are left out of the range check: an aggregated rate is the
// sum of the leaves' rates, not between them.
func (a aggregated) check(t *testing.T, got map[string]float64, datasets []string) {
	t.Helper()
	bad := 0
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format, args...)
		if bad++; bad > 10 {
			t.Fatal("too many mismatches")
		}
	}
	for k, want := range a.counters {
		if v, ok := got[k]; !ok || v != want {
			fail("counter %s = %v (present %v), simulator's sum over the kept dimensions is %v", k, v, ok, want)
		}
	}
	for k, r := range a.gauges {
		v, ok := got[k]
		switch {
		case !ok:
			fail("missing gauge %s", k)
		case strings.Contains(k, "_per_second_"):
		case v < r[0]-1e-9 || v > r[1]+1e-9:
			fail("gauge %s = %v, outside its leaves' range [%v, %v]", k, v, r[0], r[1])
		}
	}
	for k := range got {
		if slices.Contains(datasets, datasetOf(k)) {
			_, c := a.counters[k]
			_, g := a.gauges[k]
			if !c && !g {
				fail("unexpected series %s", k)
			}
		}
	}
}

// allDatasets are the simulator's datasets.
var allDatasets = func() []string {
	sim, err := platformsim.New(platformsim.Config{})
	if err != nil {
		panic(err)
	}
	defer sim.Close()
	return sim.DatasetNames()
}()

// datasetOf returns the dataset of a cdn_ series key: the longest dataset
// name it starts with (origin_usage_by_country, not origin_usage).
func datasetOf(key string) string {
	best := ""
	for _, ds := range allDatasets {
		if strings.HasPrefix(key, "cdn_"+ds+"_") && len(ds) > len(best) {
			best = ds
		}
	}
	return best
}

// labelSetsOf returns the label sets (environment and dimensions, without
// percentile) of dataset's counters in got.
func labelSetsOf(got map[string]float64, dataset string) map[string]bool {
	out := map[string]bool{}
	for k := range got {
		if datasetOf(k) == dataset && strings.Contains(k, "_requests_") && strings.Contains(k, "_total{") {
			out[k[strings.IndexByte(k, '{'):]] = true
		}
	}
	return out
}

// TestConfigFileSelection runs the exporter with a config file that keeps
// only country_code (and percentiles 50 and 99) for edge_usage_by_country,
// only country_code of origin_usage_by_country (origin aggregated) and only
// http_status_code of edge_errors (country aggregated), against the
// simulator: the exposition has exactly the label sets and percentiles the
// selection keeps, every counter equals the simulator's sum over the kept
// dimensions, gauges lie within their leaves' range, the poll cycle still
// takes datasets × ceil(environments/20) requests (each naming only the kept
// dimensions and metrics), and the ClickHouse tables follow the selection.
func TestConfigFileSelection(t *testing.T) {
	ch := testenv.ClickHouse(t)
	db := ch.NewDatabase(t)
	path := writeConfig(t, `
datasets:
  edge_usage_by_country:
    dimensions: [country_code]
    percentiles: [50, 99]
  origin_usage_by_country:
    dimensions: [country_code]
    metrics:
      exclude: ["response_time_.*"]
    percentiles: [50, 99]
  edge_errors:
    dimensions: [http_status_code]
`)
	chExt := &clickhouseExtension{flags: &clickhouseFlags{dsn: ch.DSN(db), queueRows: 1_000_000, maxBackfill: model.Duration(24 * time.Hour)}}
	te := startExporter(t, testOptions{
		sim:    platformsim.Config{Properties: 2, Environments: 30},
		common: func(c *commonFlags) { c.configFile = path },
		exts:   []extension{chExt},
	})
	envs := te.sim.EnvironmentIDs()
	datasets := te.sim.DatasetNames()

	te.sim.ResetStats()
	te.advance(2*time.Minute + 30*time.Second) // one poll cycle, at 10:05
	st := te.sim.Stats()
	want := len(datasets) * ceilDiv(len(envs), metricsapi.MaxFilterValues)
	if len(st.Data) != want {
		t.Errorf("%d data requests per cycle with the selection, want datasets × ceil(envs/20) = %d", len(st.Data), want)
	}
	wantDims := map[string][]string{
		"edge_usage_by_country":   {"time", "environment_id", "country_code"},
		"origin_usage_by_country": {"time", "environment_id", "country_code"},
		"edge_errors":             {"time", "environment_id", "http_status_code"},
		"origin_usage":            {"time", "environment_id", "origin_name", "http_method", "content_type"},
	}
	for _, d := range st.Data {
		if d.Status != http.StatusOK {
			t.Errorf("%s: answered %d", d.Dataset, d.Status)
		}
		if w, ok := wantDims[d.Dataset]; ok && !slices.Equal(d.Dimensions, w) {
			t.Errorf("%s asked for dimensions %v, want %v", d.Dataset, d.Dimensions, w)
		}
		for _, m := range d.Metrics {
			if d.Dataset == "origin_usage_by_country" && strings.HasPrefix(m, "response_time_") ||
				strings.HasSuffix(m, "_percentile") && (d.Dataset == "edge_usage_by_country" || d.Dataset == "origin_usage_by_country") &&
					!strings.Contains(m, "_50_") && !strings.Contains(m, "_99_") {
				t.Errorf("%s asked for metric %s, which the selection leaves out", d.Dataset, m)
			}
		}
	}

	te.advance(3 * time.Minute) // 10:08: revisions of late data too
	body, got := te.scrape()
	testenv.CheckMetrics(t, body)
	at := te.clock.Now()
	to := metricsapi.FiveMinutes.Truncate(at)
	sel := map[string]selection{
		"edge_usage_by_country":   {keep: []string{"country_code"}, percentiles: []string{"50", "99"}},
		"origin_usage_by_country": {keep: []string{"country_code"}, percentiles: []string{"50", "99"}, metric: func(m string) bool { return !strings.HasPrefix(m, "response_time_") }},
		"edge_errors":             {keep: []string{"http_status_code"}},
	}
	truth := aggregatedTruth(t, te.sim, envs, sel, te.firstFrom, to, at)
	truth.check(t, got, []string{"edge_usage_by_country", "origin_usage_by_country", "edge_errors"})
	for ds := range sel {
		if exposed := labelSetsOf(got, ds); !mapsEqual(exposed, truth.labelSets[ds]) {
			t.Errorf("%s: %d label sets exposed, the selection has %d", ds, len(exposed), len(truth.labelSets[ds]))
		}
		var pcts []string
		for k := range got {
			if datasetOf(k) == ds && strings.Contains(k, "percentile=") {
				p := k[strings.Index(k, "percentile=")+len("percentile="):]
				p = p[:strings.IndexAny(p, ",}")]
				if !slices.Contains(pcts, p) {
					pcts = append(pcts, p)
				}
			}
		}
		sort.Strings(pcts)
		if ds != "edge_errors" && !slices.Equal(pcts, []string{"50", "99"}) {
			t.Errorf("%s exposes percentiles %v, want [50 99]", ds, pcts)
		}
	}
	for k := range got {
		if strings.HasPrefix(k, "cdn_edge_errors_") && strings.Contains(k, "country_code=") ||
			strings.HasPrefix(k, "cdn_origin_usage_by_country_") && strings.Contains(k, "origin_name=") {
			t.Errorf("an aggregated dimension is still a label: %s", k)
		}
	}
	if !strings.Contains(string(body), "# HELP cdn_edge_errors_requests_edge_total") ||
		!strings.Contains(string(body), "Over every country_code (aggregated by the API") {
		t.Error("the help text does not say which dimension was aggregated")
	}
	// A dataset the file does not name is exported whole.
	whole := aggregatedTruth(t, te.sim, envs, map[string]selection{
		"origin_usage": {keep: te.sim.DatasetLabels("origin_usage")}}, te.firstFrom, to, at)
	whole.check(t, got, []string{"origin_usage"})

	// ClickHouse: the aggregated datasets have tables of their own, whose
	// FINAL rows sum to the simulator's sums over the kept dimensions.
	conn := ch.Conn(t)
	ctx := context.Background()
	wantSums := map[string]float64{}
	for _, env := range envs {
		rows, err := te.sim.Rows("edge_errors", env, metricsapi.FiveMinutes, te.firstFrom, to, at)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			wantSums[env+"/"+r.Labels[1]] += r.Values[0]
		}
	}
	table := fmt.Sprintf("`%s`.`edge_errors__by_http_status_code`", db)
	deadline := time.Now().Add(30 * time.Second)
	for {
		gotSums := map[string]float64{}
		rows, err := conn.Query(ctx, "SELECT environment_id, toString(http_status_code), toFloat64(sum(requests_edge_total)) FROM "+table+" FINAL"+
			fmt.Sprintf(" WHERE time >= toDateTime(%d) AND time < toDateTime(%d) GROUP BY environment_id, http_status_code", te.firstFrom.Unix(), to.Unix()))
		if err == nil {
			for rows.Next() {
				var env, status string
				var v float64
				if err = rows.Scan(&env, &status, &v); err != nil {
					break
				}
				gotSums[env+"/"+status] = v
			}
			rows.Close()
		}
		if err == nil && mapsEqualFloat(gotSums, wantSums) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d (env, status) sums, want %d equal to the simulator's (err %v)", table, len(gotSums), len(wantSums), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, tc := range []struct {
		table  string
		column string
		want   bool
	}{
		{"edge_errors__by_http_status_code", "country_code", false},
		{"edge_errors__by_http_status_code", "http_status_code", true},
		{"edge_errors", "requests_edge_total", false}, // no table at all
		{"edge_usage_by_country", "ttfb_edge_ms_99_percentile", true},
		{"edge_usage_by_country", "ttfb_edge_ms_95_percentile", false},
		{"origin_usage_by_country__by_country_code", "origin_name", false},
		{"origin_usage_by_country__by_country_code", "response_time_origin_ms_50_percentile", false},
		{"origin_usage", "origin_name", true},
	} {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = ? AND table = ? AND name = ?",
			db, tc.table, tc.column).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if (n == 1) != tc.want {
			t.Errorf("table %s has column %s: %v, want %v", tc.table, tc.column, n == 1, tc.want)
		}
	}
}

func mapsEqual(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

func mapsEqualFloat(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestConfigFileEnvironments: environments excluded by name, property and
// ID, or included by property and name, are exactly the ones the exporter
// does not (or does) poll and expose.
func TestConfigFileEnvironments(t *testing.T) {
	world := platformsim.Config{Seed: 7, Properties: 4, Environments: 45}
	sim, err := platformsim.New(world)
	if err != nil {
		t.Fatal(err)
	}
	envs, props := sim.Environments(), sim.Properties()
	sim.Close()
	slug := map[string]string{}
	for _, p := range props {
		slug[p.ID] = p.Slug
	}
	for _, tc := range []struct {
		name string
		yaml string
		keep func(e platformsim.Environment) bool
	}{
		{"exclude by name, property and ID", fmt.Sprintf(`
environments:
  exclude:
    - name: staging|qa
    - property: %s
    - id: %s
`, props[1].Slug, envs[0].ID), func(e platformsim.Environment) bool {
			return e.Name != "staging" && e.Name != "qa" && e.PropertyID != props[1].ID && e.ID != envs[0].ID
		}},
		{"include by property ID, and by name within a property slug", fmt.Sprintf(`
environments:
  include:
    - property: %s
    - property: %s
      name: ".*production"
`, props[0].ID, props[2].Slug), func(e platformsim.Environment) bool {
			return e.PropertyID == props[0].ID || slug[e.PropertyID] == props[2].Slug && strings.HasSuffix(e.Name, "production")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.yaml)
			want := map[string]bool{}
			for _, e := range envs {
				if tc.keep(e) {
					want[e.ID] = true
				}
			}
			if len(want) == 0 || len(want) == len(envs) {
				t.Fatalf("the case keeps %d of %d environments: not a test", len(want), len(envs))
			}
			te := startExporter(t, testOptions{sim: world, common: func(c *commonFlags) { c.configFile = path }})
			te.sim.ResetStats()
			te.advance(2*time.Minute + 30*time.Second)
			polled := map[string]bool{}
			st := te.sim.Stats()
			for _, d := range st.Data {
				for _, e := range d.Environments {
					polled[e] = true
				}
			}
			if !mapsEqual(polled, want) {
				t.Errorf("polled %d environments, want exactly the %d the filter keeps", len(polled), len(want))
			}
			if n, w := len(st.Data), len(te.sim.DatasetNames())*ceilDiv(len(want), metricsapi.MaxFilterValues); n != w {
				t.Errorf("%d data requests per cycle, want %d", n, w)
			}
			_, got := te.scrape()
			exposed := map[string]bool{}
			for k := range got {
				if i := strings.Index(k, "environment_id="); i >= 0 && strings.HasPrefix(k, "cdn_") {
					id := k[i+len("environment_id="):]
					exposed[id[:strings.IndexAny(id, ",}")]] = true
				}
			}
			if !mapsEqual(exposed, want) {
				t.Errorf("exposed %d environments, want exactly the %d the filter keeps", len(exposed), len(want))
			}
			if v := got["edgepipe_environments{}"]; v != float64(len(want)) {
				t.Errorf("edgepipe_environments = %v, want %d", v, len(want))
			}
		})
	}
}

// TestConfigFileInvalid: a config file that does not fit fails the exporter
// at start, with a message naming the key: what the file alone shows before
// contacting the platform, what the descriptors show at the first discovery.
func TestConfigFileInvalid(t *testing.T) {
	_, base := startSim(t, platformsim.Config{Seed: 3})
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown dataset", "datasets:\n  edge_usage:\n    dimensions: []\n",
			[]string{"datasets.edge_usage: unknown dataset (the platform offers edge_usage_by_country, edge_errors,"}},
		{"unknown dimension", "datasets:\n  edge_errors:\n    dimensions: [contry_code]\n",
			[]string{`datasets.edge_errors.dimensions[0]: unknown dimension "contry_code" of dataset edge_errors (it has country_code, http_status_code)`}},
		{"unknown percentile", "datasets:\n  origin_usage:\n    percentiles: [90]\n",
			[]string{"datasets.origin_usage.percentiles[0]: dataset origin_usage has no percentile 90 (it has 5, 25, 50, 75, 95, 99)"}},
		{"bad regex", "datasets:\n  edge_errors:\n    metrics:\n      exclude: [\"requests_(\"]\n",
			[]string{"--config.file: config file", "datasets.edge_errors.metrics.exclude[0] (line 4): bad regular expression"}},
		{"bad environment regex", "environments:\n  include:\n    - name: \"*prod\"\n",
			[]string{"environments.include[0].name (line 3): bad regular expression"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.yaml)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
			if err != nil {
				t.Fatal(err)
			}
			err = run(ctx, []string{"--api.url=" + base, "--organization-id=" + platformsim.DemoOrganizationID,
				"--web.listen-address=" + testenv.FreeAddr(t), "--log.level=warn", "--config.file=" + path}, io.Discard, stderr)
			if ctx.Err() != nil {
				t.Fatal("the exporter kept running with an invalid config file")
			}
			if err == nil {
				t.Fatal("the exporter accepted the config file")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

// TestSeriesBudgetBelowTheNeed runs the exporter with --prometheus.max-series
// far below what the organization needs: /metrics keeps serving at most that
// many cdn series, lint-clean; the refused series are counted per dataset;
// edgepipe_series shows where the series go; and across later polls no
// counter held goes backwards or disappears.
func TestSeriesBudgetBelowTheNeed(t *testing.T) {
	const budget = 3000
	te := startExporter(t, testOptions{run: func(f *runFlags) { f.maxSeries = budget }})
	body, got := te.scrape()
	testenv.CheckMetrics(t, body)
	cdn := countCDN(got)
	held, dropped := 0.0, 0.0
	for k, v := range got {
		switch {
		case strings.HasPrefix(k, "edgepipe_series{"):
			held += v
		case strings.HasPrefix(k, "edgepipe_series_limit_dropped_total{"):
			dropped += v
		}
	}
	if cdn == 0 || cdn > budget || held > budget || float64(cdn) > held {
		t.Errorf("%d cdn series exposed, %v held by edgepipe_series, budget %d", cdn, held, budget)
	}
	if dropped == 0 {
		t.Error("edgepipe_series_limit_dropped_total counted nothing although the budget is far below the need")
	}
	if got["edgepipe_series_limit{}"] != budget {
		t.Errorf("edgepipe_series_limit = %v", got["edgepipe_series_limit{}"])
	}
	if code, _ := te.get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz %d with the budget reached", code)
	}

	for range 3 {
		te.advance(time.Minute)
		body2, got2 := te.scrape()
		testenv.CheckMetrics(t, body2)
		for k, v := range got {
			if !strings.HasPrefix(k, "cdn_") || !strings.Contains(k, "_total{") {
				continue
			}
			if v2, ok := got2[k]; !ok || v2 < v {
				t.Errorf("counter %s went from %v to %v (present %v)", k, v, v2, ok)
			}
		}
		if n := countCDN(got2); n > budget {
			t.Errorf("%d cdn series exposed, budget %d", n, budget)
		}
		d2 := 0.0
		for k, v := range got2 {
			if strings.HasPrefix(k, "edgepipe_series_limit_dropped_total{") {
				d2 += v
			}
		}
		if d2 <= dropped {
			t.Errorf("dropped stayed at %v although new buckets of refused label sets came", d2)
		}
		got, dropped = got2, d2
	}
}

// countCDN counts the dataset series (cdn_, not the inventory's), what
// --prometheus.max-series bounds.
func countCDN(got map[string]float64) int {
	n := 0
	for k := range got {
		if strings.HasPrefix(k, "cdn_") && !inventorySeries(k) {
			n++
		}
	}
	return n
}

// TestConfigFilePrefix: the config file's prefix names the Prometheus and
// the OTLP metrics; self-metrics keep edgepipe_.
func TestConfigFilePrefix(t *testing.T) {
	path := writeConfig(t, "prefix: acme_cdn\n")
	rcv, otlpAddr := otlptest.StartGRPC(t)
	te := startExporter(t, testOptions{sim: platformsim.Config{Environments: 3}, common: func(c *commonFlags) { c.configFile = path },
		run: func(f *runFlags) {
			f.datasets = []string{"edge_errors"}
			f.otlpEndpoint, f.otlpProtocol = "http://"+otlpAddr, "grpc"
		}})
	body, got := te.scrape()
	testenv.CheckMetrics(t, body)
	n, info := 0, 0
	for k := range got {
		switch {
		case strings.HasPrefix(k, "acme_cdn_edge_errors_requests_edge_total{"):
			n++
		case strings.HasPrefix(k, "acme_cdn_environment_info{"):
			info++
		case strings.HasPrefix(k, "cdn_"):
			t.Errorf("unprefixed series %s", k)
		}
	}
	if n == 0 || info != 3 || got["edgepipe_environments{}"] != 3 {
		t.Errorf("%d acme_cdn_ series, %d acme_cdn_environment_info; edgepipe_environments %v", n, info, got["edgepipe_environments{}"])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pts := rcv.WaitPoints(ctx, 1)
	if len(pts) == 0 {
		t.Fatal("no OTLP points")
	}
	for _, p := range pts {
		if !strings.HasPrefix(p.Metric, "acme_cdn.edge_errors.") {
			t.Errorf("OTLP metric %s lacks the prefix", p.Metric)
		}
	}
}
