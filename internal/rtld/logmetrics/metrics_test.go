package logmetrics

import (
	"bytes"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// newMetrics returns Metrics with cfg on a fresh registry and a clock the
// test moves.
func newMetrics(t *testing.T, cfg Config) (*Metrics, *prometheus.Registry, *time.Time) {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	m.now = func() time.Time { return now }
	m.nextRoll = now.Add(m.cfg.TopNWindow)
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	return m, reg, &now
}

// batch is a json batch of env with identity (agent, seq) holding recs.
func batch(t *testing.T, env, agent string, seq int64, recs ...string) *accesslog.Batch {
	t.Helper()
	body := fmt.Sprintf(`{"account_number":"A","agent_id":%q,"datestamp":"20261123","platform":"p","profile_id":1,"seq_num":%d,"logs":[%s]}`,
		agent, seq, strings.Join(recs, ","))
	b, err := accesslog.DecodeBytes(env, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rec is a record with the fields the metrics read (empty arguments are
// left out).
func rec(status, cache, pop string, bytesOut, totalTime string) string {
	var parts []string
	for _, kv := range [][2]string{{"status_code", status}, {"cache_status", cache}, {"pop", pop}, {"bytes_out", bytesOut}, {"total_time", totalTime}} {
		if kv[1] != "" {
			parts = append(parts, fmt.Sprintf("%q:%s", kv[0], kv[1]))
		}
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// values returns the samples of a counter or gauge family by their labels
// rendered as name=value pairs in label-name order.
func values(mfs map[string]*dto.MetricFamily, name string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range mfs[name].GetMetric() {
		var ls []string
		for _, l := range m.GetLabel() {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
		out[strings.Join(ls, ",")] += v
	}
	return out
}

func TestCountsRecords(t *testing.T) {
	m, reg, _ := newMetrics(t, Config{})
	m.ObserveSpooled(batch(t, "env1", "a", 0,
		rec("200", `"TCP_HIT"`, `"FRA"`, "1000", "0.002"),
		rec("200", `"TCP_HIT"`, `"FRA"`, "500", "0.004"),
		rec("404", `"TCP_MISS"`, `"FRA"`, "100", "0.2"),
		rec("", `"TCP_MISS"`, `"AMS"`, "", ""),           // no status, bytes or time
		rec("799", `"TCP_MISS"`, `"AMS"`, `"n/a"`, "-1"), // invalid ones
	))
	m.ObserveSpooled(batch(t, "env2", "a", 0, rec("503", `"TCP_MISS"`, `"AMS"`, "10", "1.5")))
	mfs := gather(t, reg)
	wantReq := map[string]float64{
		"cache_status=TCP_HIT,environment_id=env1,pop=FRA,status_class=2xx":      2,
		"cache_status=TCP_MISS,environment_id=env1,pop=FRA,status_class=4xx":     1,
		"cache_status=TCP_MISS,environment_id=env1,pop=AMS,status_class=unknown": 2,
		"cache_status=TCP_MISS,environment_id=env2,pop=AMS,status_class=5xx":     1,
	}
	wantBytes := map[string]float64{
		"cache_status=TCP_HIT,environment_id=env1,pop=FRA,status_class=2xx":      1500,
		"cache_status=TCP_MISS,environment_id=env1,pop=FRA,status_class=4xx":     100,
		"cache_status=TCP_MISS,environment_id=env1,pop=AMS,status_class=unknown": 0,
		"cache_status=TCP_MISS,environment_id=env2,pop=AMS,status_class=5xx":     10,
	}
	if got := values(mfs, RequestsName); fmt.Sprint(got) != fmt.Sprint(wantReq) {
		t.Errorf("requests %v\nwant %v", got, wantReq)
	}
	if got := values(mfs, ResponseBytesName); fmt.Sprint(got) != fmt.Sprint(wantBytes) {
		t.Errorf("bytes %v\nwant %v", got, wantBytes)
	}
	hists := map[string]*dto.Histogram{}
	for _, mm := range mfs[TotalTimeName].GetMetric() {
		var ls []string
		for _, l := range mm.GetLabel() {
			ls = append(ls, l.GetValue())
		}
		hists[strings.Join(ls, "/")] = mm.GetHistogram()
	}
	if h := hists["env1/FRA"]; h.GetSampleCount() != 3 || math.Abs(h.GetSampleSum()-0.206) > 1e-12 {
		t.Errorf("env1/FRA histogram: count %d sum %v, want 3 and 0.206", h.GetSampleCount(), h.GetSampleSum())
	}
	if h := hists["env1/AMS"]; h.GetSampleCount() != 0 {
		t.Errorf("env1/AMS histogram counts %d records without a valid total_time", h.GetSampleCount())
	}
	h := hists["env2/AMS"]
	if h.GetSampleCount() != 1 || h.GetSchema() != 3 || len(h.GetPositiveSpan()) == 0 {
		t.Errorf("env2/AMS: count %d, native schema %d, spans %v: want a native histogram beside the classic buckets", h.GetSampleCount(), h.GetSchema(), h.GetPositiveSpan())
	}
	if len(h.GetBucket()) != len(defaultBuckets()) {
		t.Errorf("%d classic buckets, want %d", len(h.GetBucket()), len(defaultBuckets()))
	}
	invalid := values(mfs, InvalidName)
	if invalid["field=status_code"] != 1 || invalid["field=bytes_out"] != 1 || invalid["field=total_time"] != 1 {
		t.Errorf("invalid values %v, want one of each", invalid)
	}
	if s := values(mfs, SeriesName)[""]; s != 4*2+3*16 {
		t.Errorf("series %v, want 4 label sets × 2 + 3 histograms × 16", s)
	}
}

// TestCountsEveryBatchObserved: every batch ingest reports is counted, a
// batch without identity at every delivery (ingest cannot tell its
// resends, so it stores and reports each).
func TestCountsEveryBatchObserved(t *testing.T) {
	m, reg, _ := newMetrics(t, Config{})
	m.ObserveSpooled(batch(t, "env", "a", 7, rec("200", `"TCP_HIT"`, `"FRA"`, "10", "0.1"), rec("200", `"TCP_HIT"`, `"FRA"`, "10", "0.1")))
	m.ObserveSpooled(batch(t, "env", "b", 7, rec("200", `"TCP_HIT"`, `"FRA"`, "10", "0.1")))
	lines, err := accesslog.DecodeBytes("env", []byte(rec("200", `"TCP_HIT"`, `"FRA"`, "10", "0.1")+"\n"))
	if err != nil || lines.HasIdentity() {
		t.Fatalf("json_lines batch: %v, identity %v", err, lines.HasIdentity())
	}
	m.ObserveSpooled(lines)
	m.ObserveSpooled(lines)
	mfs := gather(t, reg)
	if got := values(mfs, RequestsName)["cache_status=TCP_HIT,environment_id=env,pop=FRA,status_class=2xx"]; got != 5 {
		t.Errorf("requests %v, want 2 + 1 + 2×1", got)
	}
}

// TestLabels: the configured label sets, top-N values and "other".
func TestLabels(t *testing.T) {
	r := func(host, country string) string {
		return fmt.Sprintf(`{"status_code":200,"cache_status":"TCP_HIT","pop":"FRA","host":%q,"client_country_code":%q,"bytes_out":1,"total_time":0.01}`, host, country)
	}
	for _, tc := range []struct {
		name   string
		labels []string
		want   map[string]float64
		hist   []string
	}{
		{"no pop", []string{}, map[string]float64{"cache_status=TCP_HIT,environment_id=env,status_class=2xx": 4}, []string{"environment_id"}},
		{"host top 2", []string{LabelHost}, map[string]float64{
			"cache_status=TCP_HIT,environment_id=env,host=a.example,status_class=2xx": 2,
			"cache_status=TCP_HIT,environment_id=env,host=b.example,status_class=2xx": 1,
			"cache_status=TCP_HIT,environment_id=env,host=other,status_class=2xx":     1,
		}, []string{"environment_id", "host"}},
		{"country and pop", []string{LabelCountry, LabelPOP}, map[string]float64{
			"cache_status=TCP_HIT,client_country_code=DE,environment_id=env,pop=FRA,status_class=2xx":    2,
			"cache_status=TCP_HIT,client_country_code=FR,environment_id=env,pop=FRA,status_class=2xx":    1,
			"cache_status=TCP_HIT,client_country_code=other,environment_id=env,pop=FRA,status_class=2xx": 1,
		}, []string{"client_country_code", "environment_id", "pop"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, reg, _ := newMetrics(t, Config{Labels: tc.labels, TopN: 2})
			m.ObserveSpooled(batch(t, "env", "a", 0, r("a.example", "DE"), r("b.example", "FR"), r("c.example", "US"), r("a.example", "DE")))
			mfs := gather(t, reg)
			if got := values(mfs, RequestsName); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("requests %v\nwant %v", got, tc.want)
			}
			var names []string
			for _, l := range mfs[TotalTimeName].GetMetric()[0].GetLabel() {
				names = append(names, l.GetName())
			}
			if fmt.Sprint(names) != fmt.Sprint(tc.hist) {
				t.Errorf("histogram labels %v, want %v", names, tc.hist)
			}
		})
	}
}

// TestSeriesBudget: label sets beyond the budget are refused, their
// records counted as dropped per environment (so the two add up to the
// records accepted), the label sets held keep counting, and a refused label
// set gets in once expired ones made room.
func TestSeriesBudget(t *testing.T) {
	var logs bytes.Buffer
	// Room for one histogram (16) and two label sets of the counters (4).
	m, reg, now := newMetrics(t, Config{MaxSeries: 20, SeriesTTL: time.Hour, TopNWindow: time.Minute, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	m.ObserveSpooled(batch(t, "env", "a", 0,
		rec("200", `"HIT"`, `"FRA"`, "1", "0.1"),
		rec("404", `"HIT"`, `"FRA"`, "1", "0.1"),
		rec("500", `"HIT"`, `"FRA"`, "1", "0.1"), // a third label set: refused
		rec("200", `"HIT"`, `"AMS"`, "1", "0.1"), // a second histogram: refused
		rec("200", `"HIT"`, `"FRA"`, "1", "0.1"), // held: counts
	))
	mfs := gather(t, reg)
	req := values(mfs, RequestsName)
	if len(req) != 2 || req["cache_status=HIT,environment_id=env,pop=FRA,status_class=2xx"] != 2 {
		t.Errorf("requests %v: want the two label sets held, 2xx twice", req)
	}
	dropped := values(mfs, DroppedName)["environment_id=env"]
	total := dropped
	for _, v := range req {
		total += v
	}
	if dropped != 2 || total != 5 {
		t.Errorf("dropped %v, counted + dropped %v: want 2 and the 5 records", dropped, total)
	}
	if s, l := values(mfs, SeriesName)[""], values(mfs, SeriesLimitName)[""]; s != 20 || l != 20 {
		t.Errorf("series %v limit %v, want 20 and 20", s, l)
	}
	if !strings.Contains(logs.String(), "series budget reached") || strings.Count(logs.String(), "\n") != 1 {
		t.Errorf("want one warning, logged:\n%s", logs.String())
	}

	// An hour later the 404 label set has had no record: it expires and
	// the 500 one gets its place.
	*now = now.Add(time.Hour - time.Minute)
	m.ObserveSpooled(batch(t, "env", "a", 1, rec("200", `"HIT"`, `"FRA"`, "1", "0.1")))
	*now = now.Add(2 * time.Minute)
	m.ObserveSpooled(batch(t, "env", "a", 2, rec("500", `"HIT"`, `"FRA"`, "1", "0.1")))
	req = values(gather(t, reg), RequestsName)
	want := map[string]float64{
		"cache_status=HIT,environment_id=env,pop=FRA,status_class=2xx": 3,
		"cache_status=HIT,environment_id=env,pop=FRA,status_class=5xx": 1,
	}
	if fmt.Sprint(req) != fmt.Sprint(want) {
		t.Errorf("after expiry: %v\nwant %v", req, want)
	}
}

// TestSeriesExpire: label sets and histograms without records for
// SeriesTTL leave the exposition and the series count.
func TestSeriesExpire(t *testing.T) {
	m, reg, now := newMetrics(t, Config{SeriesTTL: 30 * time.Minute, TopNWindow: time.Minute})
	m.ObserveSpooled(batch(t, "env", "a", 0, rec("200", `"HIT"`, `"FRA"`, "1", "0.1"), rec("200", `"HIT"`, `"AMS"`, "1", "0.1")))
	*now = now.Add(20 * time.Minute)
	m.ObserveSpooled(batch(t, "env", "a", 1, rec("200", `"HIT"`, `"AMS"`, "1", "0.1")))
	*now = now.Add(15 * time.Minute) // FRA idle for 35 minutes, AMS for 15
	mfs := gather(t, reg)
	if req := values(mfs, RequestsName); len(req) != 1 || req["cache_status=HIT,environment_id=env,pop=AMS,status_class=2xx"] != 2 {
		t.Errorf("requests %v: want AMS only", req)
	}
	if n := len(mfs[TotalTimeName].GetMetric()); n != 1 {
		t.Errorf("%d histograms, want 1", n)
	}
	if s := values(mfs, SeriesName)[""]; s != 2+16 {
		t.Errorf("series %v, want 18", s)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		errs []string
	}{
		{"defaults", Config{}, nil},
		{"every label", Config{Labels: []string{LabelPOP, LabelHost, LabelCountry}}, nil},
		{"unknown label", Config{Labels: []string{"path"}}, []string{`label "path"`}},
		{"label twice", Config{Labels: []string{LabelPOP, LabelPOP}}, []string{`label "pop" given twice`}},
		{"negatives", Config{TopN: -1, TopNWindow: -time.Second, MaxSeries: -1, SeriesTTL: -time.Second},
			[]string{"TopN -1", "TopNWindow -1s", "MaxSeries -1", "SeriesTTL -1s"}},
		{"buckets", Config{Buckets: []float64{0.1, 0.1}}, []string{"histogram buckets"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			testenv.CheckErr(t, err, tc.errs)
		})
	}
}

func TestFields(t *testing.T) {
	for _, tc := range []struct {
		labels []string
		want   string
	}{
		{nil, "[status_code cache_status bytes_out total_time pop]"},
		{[]string{}, "[status_code cache_status bytes_out total_time]"},
		{[]string{LabelCountry, LabelHost}, "[status_code cache_status bytes_out total_time host client_country_code]"},
	} {
		if got := fmt.Sprint(Fields(tc.labels)); got != tc.want {
			t.Errorf("Fields(%v) = %s, want %s", tc.labels, got, tc.want)
		}
	}
}

// TestExpositionPassesPromtool: the text exposition of every metric,
// label set and the budget's self-metrics passes promtool check metrics.
func TestExpositionPassesPromtool(t *testing.T) {
	m, reg, _ := newMetrics(t, Config{Labels: []string{LabelPOP, LabelHost}, MaxSeries: 100})
	var recs []string
	for i := range 40 {
		recs = append(recs, fmt.Sprintf(`{"status_code":%d,"cache_status":"TCP_%d","pop":"P%d","host":"h%d.example","bytes_out":%d,"total_time":%g}`,
			[]int{200, 304, 404, 503}[i%4], i%3, i%5, i%7, i*100, float64(i)/100))
	}
	m.ObserveSpooled(batch(t, "env", "a", 0, recs...))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	testenv.CheckMetrics(t, buf.Bytes())
}
