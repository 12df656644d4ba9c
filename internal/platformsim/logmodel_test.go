package platformsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// The tests of this file check the one traffic model: the records the
// simulator posts (received over loopback HTTPS by a test receiver) against
// the simulator's own Metrics API answers over HTTP, bucket by bucket.

// logTestStart is the simulated time the tests create their profiles at:
// 30 s before the FIVE_MINUTES bucket logTestB0, so that bucket is the first
// one the profiles cover whole.
var (
	logTestB0    = time.Date(2026, 11, 23, 14, 0, 0, 0, time.UTC)
	logTestStart = logTestB0.Add(-30 * time.Second)
)

// logTestLateData is the simulator's LateData in these tests: buckets settle
// a minute after their end.
const logTestLateData = time.Minute

// logSim is a simulator on a settable clock that delivers to a test
// receiver, with profiles created through the API.
type logSim struct {
	t        *testing.T
	clock    *fakeClock
	sim      *rtldSim
	rcv      *testReceiver
	envs     []string         // every environment of the world
	envOf    map[int64]string // profile ID → environment ID
	percents map[int64]float64
}

func newLogSim(t *testing.T, cfg Config) *logSim {
	t.Helper()
	clock := &fakeClock{t: logTestStart}
	rcv := newTestReceiver(t, nil)
	cfg.Now = clock.Now
	cfg.LateData = logTestLateData
	cfg.Delivery.TLSConfig = rcv.tlsConfig()
	cfg.Delivery.RetryInterval = 5 * time.Millisecond
	cfg.Delivery.FlushInterval = 10 * time.Millisecond
	sim := newRTLDSim(t, cfg)
	return &logSim{t: t, clock: clock, sim: sim, rcv: rcv, envs: sim.srv.EnvironmentIDs(),
		envOf: map[int64]string{}, percents: map[int64]float64{}}
}

// testLogFields are the fields the tests' profiles ask for.
var testLogFields = []any{"timestamp", "uuid", "status_code", "cache_status", "client_country_code", "bytes_out",
	"total_time", "time_to_first_byte", "pop", "host", "method", "path", "content_type"}

// addProfile creates a json profile in environment env with the
// downsampling percent (100: none) and returns its ID.
func (ls *logSim) addProfile(env string, name string, percent float64) int64 {
	ls.t.Helper()
	p := validProfile(env)
	p["profile_name"] = name
	p["fields"] = testLogFields
	p["delivery_method"].(map[string]any)["destination_endpoint"] = ls.rcv.srv.URL + "/ingest/" + env
	if percent != 100 {
		p["downsampling_percent"] = percent
	}
	status, body := ls.sim.do("POST", "/rtld/v1/accesslogs/profiles", p)
	if status != 201 {
		ls.t.Fatalf("create profile: %d %s", status, body)
	}
	var v profileView
	if err := json.Unmarshal(body, &v); err != nil {
		ls.t.Fatal(err)
	}
	ls.envOf[v.ID] = env
	ls.percents[v.ID] = percent
	return v.ID
}

// advance sets the clock to t and waits until the engine drew every record
// due by then (live delivery) and every batch is acknowledged.
func (ls *logSim) advance(t time.Time) {
	ls.t.Helper()
	ls.clock.Set(t)
	deadline := time.Now().Add(30 * time.Second)
	for ls.sim.srv.cfg.Delivery.Live && !caughtUp(ls.sim.srv.rtld.engine, t) {
		if time.Now().After(deadline) {
			ls.t.Fatalf("the engine did not catch up with %s: %+v", t, ls.sim.srv.Delivered())
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitDelivered(ls.t, ls.sim)
}

// caughtUp reports whether every live profile's stream has drawn and
// batched every record due at now.
func caughtUp(e *deliveryEngine, now time.Time) bool {
	for _, tg := range e.targets() {
		late := e.envFaults(tg.profile.EnvironmentID).Late
		ps := e.state(tg.profile.ID)
		ps.mu.Lock()
		st := ps.stream
		ok := st != nil && len(ps.pending) == 0
		switch {
		case !ok:
		case st.plan == nil:
			ok = st.bucket.After(now)
		case st.next < st.plan.records:
			ok = !due(st.plan, st.next, now, late)
		default:
			ok = st.bucket.Add(logBucketWidth).After(now)
		}
		ps.mu.Unlock()
		if !ok {
			return false
		}
	}
	return true
}

// gotRecord is a delivered record, as the tests read it.
type gotRecord struct {
	profile   int64
	ts        int64 // Unix microseconds
	status    int64
	cache     string
	country   string // as the Metrics API writes it (lower case)
	bytes     int64
	total     float64
	ttfb      float64
	pop, host string
	uuid      string
}

// received returns the distinct records the receiver accepted, by profile.
func (ls *logSim) received() map[int64][]gotRecord {
	ls.t.Helper()
	out := map[int64][]gotRecord{}
	for _, post := range ls.rcv.accepted() {
		_, b := decodeRecords(ls.t, "json", gunzip(ls.t, post.body))
		for _, raw := range b.Logs {
			out[b.ProfileID] = append(out[b.ProfileID], parseRecord(ls.t, b.ProfileID, raw))
		}
	}
	return out
}

func parseRecord(t *testing.T, profile int64, raw map[string]json.RawMessage) gotRecord {
	t.Helper()
	r := gotRecord{profile: profile}
	str := func(k string) string {
		var s string
		if err := json.Unmarshal(raw[k], &s); err != nil {
			t.Fatalf("%s = %s: %v", k, raw[k], err)
		}
		return s
	}
	num := func(k string) float64 {
		f, err := strconv.ParseFloat(string(raw[k]), 64)
		if err != nil {
			t.Fatalf("%s = %s: %v", k, raw[k], err)
		}
		return f
	}
	sec, frac, ok := strings.Cut(string(raw["timestamp"]), ".")
	s, err1 := strconv.ParseInt(sec, 10, 64)
	us, err2 := strconv.ParseInt(frac, 10, 64)
	if !ok || len(frac) != 6 || err1 != nil || err2 != nil {
		t.Fatalf("timestamp %s: want seconds with six decimals", raw["timestamp"])
	}
	r.ts = s*1e6 + us
	r.status = int64(num("status_code"))
	r.cache = str("cache_status")
	r.country = strings.ToLower(str("client_country_code"))
	r.bytes = int64(num("bytes_out"))
	r.total, r.ttfb = num("total_time"), num("time_to_first_byte")
	r.pop, r.host, r.uuid = str("pop"), str("host"), str("uuid")
	return r
}

// bucketOfRecord returns the start of the record's FIVE_MINUTES bucket.
func (r gotRecord) bucket() time.Time {
	return time.UnixMicro(r.ts).UTC().Truncate(logBucketWidth)
}

// counts are a bucket's requests or records by the cells the tests compare.
type counts struct {
	total   float64
	country map[string]float64
	class   map[[2]string]float64 // (country, "2xx")
	cache   map[[2]string]float64 // (country, "hit" | "miss" | "stale")
	bytes   map[[2]string]float64 // (country, cache category), and (country, "") for all
	codes   map[[2]string]float64 // (country, 5xx code)
}

func newCounts() *counts {
	return &counts{country: map[string]float64{}, class: map[[2]string]float64{}, cache: map[[2]string]float64{},
		bytes: map[[2]string]float64{}, codes: map[[2]string]float64{}}
}

// logCounts counts records by bucket.
func logCounts(recs []gotRecord) map[time.Time]*counts {
	out := map[time.Time]*counts{}
	for _, r := range recs {
		c := out[r.bucket()]
		if c == nil {
			c = newCounts()
			out[r.bucket()] = c
		}
		cat := CacheStatusCategory(r.cache)
		c.total++
		c.country[r.country]++
		c.class[[2]string{r.country, fmt.Sprintf("%dxx", r.status/100)}]++
		c.cache[[2]string{r.country, cat}]++
		c.bytes[[2]string{r.country, cat}] += float64(r.bytes)
		c.bytes[[2]string{r.country, ""}] += float64(r.bytes)
		if r.status >= 500 {
			c.codes[[2]string{r.country, strconv.FormatInt(r.status, 10)}]++
		}
	}
	return out
}

// apiCounts asks the simulator's Metrics API over HTTP for
// edge_usage_by_country and edge_errors of env in [from, to), by bucket.
func (ls *logSim) apiCounts(env string, from, to time.Time) map[time.Time]*counts {
	ls.t.Helper()
	tok := ls.sim.fetchToken(DemoClientID, DemoClientSecret, ScopeMetrics)
	query := func(dataset string, dims, metrics []string) []map[string]any {
		status, body := ls.sim.doWith(tok, "POST", "/metrics/v1/datasets/"+dataset+"/data", map[string]any{
			"date_range":       map[string]string{"start": from.Format(time.RFC3339), "end": to.Format(time.RFC3339)},
			"dimensions":       dims,
			"metrics":          metrics,
			"filters":          map[string][]string{"environment_id": {env}},
			"time_granularity": "FIVE_MINUTES",
		})
		if status != 200 {
			ls.t.Fatalf("%s: %d %s", dataset, status, body)
		}
		return decodeDataRows(ls.t, body)
	}
	out := map[time.Time]*counts{}
	at := func(row map[string]any) *counts {
		tm, err := time.Parse(time.RFC3339, row["time"].(string))
		if err != nil {
			ls.t.Fatal(err)
		}
		if out[tm] == nil {
			out[tm] = newCounts()
		}
		return out[tm]
	}
	for _, row := range query(DatasetEdgeUsageByCountry, []string{"time", "country_code"}, []string{"requests_edge_total",
		"requests_2xx_total", "requests_3xx_total", "requests_4xx_total", "requests_5xx_total",
		"requests_hit_total", "requests_miss_total", "requests_stale_total",
		"bytes_edge_total", "bytes_hit_total", "bytes_miss_total", "bytes_stale_total"}) {
		c, cc := at(row), row["country_code"].(string)
		v := func(m string) float64 { return row[m].(float64) }
		c.total += v("requests_edge_total")
		c.country[cc] += v("requests_edge_total")
		for _, class := range []string{"2xx", "3xx", "4xx", "5xx"} {
			c.class[[2]string{cc, class}] = v("requests_" + class + "_total")
		}
		for _, cat := range []string{"hit", "miss", "stale"} {
			c.cache[[2]string{cc, cat}] = v("requests_" + cat + "_total")
			c.bytes[[2]string{cc, cat}] = v("bytes_" + cat + "_total")
		}
		c.bytes[[2]string{cc, ""}] = v("bytes_edge_total")
	}
	for _, row := range query(DatasetEdgeErrors, []string{"time", "country_code", "http_status_code"}, []string{"requests_edge_total"}) {
		at(row).codes[[2]string{row["country_code"].(string), fmt.Sprint(row["http_status_code"])}] = row["requests_edge_total"].(float64)
	}
	return out
}

// decodeDataRows decodes a data answer into rows keyed by field name;
// numbers (JSON numbers or numeric strings) become float64.
func decodeDataRows(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var resp struct {
		Fields []struct {
			Name     string `json:"name"`
			DataType string `json:"data_type"`
		} `json:"data_fields"`
		Rows [][]any `json:"data_rows"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&resp); err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, raw := range resp.Rows {
		row := map[string]any{}
		for i, f := range resp.Fields {
			if f.DataType != "NUMBER" {
				row[f.Name] = raw[i]
				continue
			}
			n, err := strconv.ParseFloat(strings.Trim(fmt.Sprint(raw[i]), `"`), 64)
			if err != nil {
				t.Fatalf("%s = %v", f.Name, raw[i])
			}
			row[f.Name] = n
		}
		out = append(out, row)
	}
	return out
}

// compareBucket checks a bucket's records against the API's requests under
// the sampling rule: the total exactly SampledCount(N, percent); each
// country, each (country, status class) and each (country, 5xx code)
// within one of its requests × share; each (country, cache status) within
// four (one per status class); without downsampling every cell and every
// byte count exactly.
func compareBucket(t *testing.T, name string, api, logs *counts, percent float64) {
	t.Helper()
	if logs == nil {
		logs = newCounts()
	}
	share := percent / 100
	if want := accesslog.SampledCount(int64(api.total), percent); int64(logs.total) != want {
		t.Errorf("%s: %v records for %v requests at %v%%, want %d", name, logs.total, api.total, percent, want)
	}
	within := func(what string, api, logs map[[2]string]float64, tol float64) {
		for _, k := range unionKeys(api, logs) {
			if d := math.Abs(logs[k] - api[k]*share); d >= tol || (percent == 100 && d != 0) {
				t.Errorf("%s: %s %v: %v records for %v requests at %v%%", name, what, k, logs[k], api[k], percent)
			}
		}
	}
	countries := map[[2]string]float64{}
	logCountries := map[[2]string]float64{}
	for k, v := range api.country {
		countries[[2]string{k}] = v
	}
	for k, v := range logs.country {
		logCountries[[2]string{k}] = v
	}
	within("country", countries, logCountries, 1)
	within("status class", api.class, logs.class, 1)
	within("cache status", api.cache, logs.cache, 4)
	within("5xx code", api.codes, logs.codes, 1)
	if percent == 100 {
		within("bytes", api.bytes, logs.bytes, 1)
	}
}

func unionKeys[V any](a, b map[[2]string]V) [][2]string {
	var out [][2]string
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// checkFields checks what the counts do not: every record lies in a bucket
// the profile covers, its host is one of the environment's, its POP serves
// its country, and its first byte comes before its last.
func (ls *logSim) checkFields(recs []gotRecord) {
	ls.t.Helper()
	uuids := map[string]bool{}
	for _, r := range recs {
		env := ls.envOf[r.profile]
		if uuids[r.uuid] {
			ls.t.Fatalf("uuid %s delivered twice", r.uuid)
		}
		uuids[r.uuid] = true
		g := geos[r.country]
		if g == nil || !slices.Contains(g.pops, r.pop) {
			ls.t.Fatalf("record of country %q from POP %q", r.country, r.pop)
		}
		if !slices.Contains(ls.sim.srv.EnvironmentHosts(env), r.host) {
			ls.t.Fatalf("host %q is not one of environment %s's", r.host, env)
		}
		if !(r.ttfb > 0 && r.ttfb <= r.total) || r.bytes < 0 {
			ls.t.Fatalf("ttfb %v, total %v, bytes %v", r.ttfb, r.total, r.bytes)
		}
		if r.ts < logTestStart.UnixMicro() {
			ls.t.Fatalf("record at %v, before the profile existed", time.UnixMicro(r.ts).UTC())
		}
	}
}

// logCase is one profile of TestLogsMatchMetrics.
type logCase struct {
	env     int     // index in the world's environments
	percent float64 // downsampling_percent, 100 for none
}

// TestLogsMatchMetrics: for several environments, sampling percents and
// fault settings, the records delivered live for each FIVE_MINUTES bucket
// match the Metrics API's edge_usage_by_country (and edge_errors) of that
// bucket once it settled, by the sampling rule; the records of a bucket
// arrive while it runs, not only after it settled.
func TestLogsMatchMetrics(t *testing.T) {
	for _, tc := range []struct {
		name     string
		scale    float64
		profiles []logCase
		faults   DeliveryFaults
	}{
		{"no downsampling", 0.005, []logCase{{0, 100}, {1, 100}, {3, 100}}, DeliveryFaults{}},
		{"25, 50 and 75 percent", 0.02, []logCase{{0, 25}, {3, 50}, {1, 75}}, DeliveryFaults{}},
		{"a tenth of a percent and one percent", 1, []logCase{{0, 0.1}, {3, 1}}, DeliveryFaults{}},
		{"two profiles of one environment", 0.01, []logCase{{0, 100}, {0, 25}}, DeliveryFaults{}},
		{"duplicate deliveries", 0.005, []logCase{{0, 100}, {3, 25}}, DeliveryFaults{DropAckPercent: 30}},
		{"late buckets", 0.005, []logCase{{0, 100}, {3, 50}}, DeliveryFaults{Environments: map[string]EnvironmentFaults{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ls := newLogSim(t, Config{Seed: 31, Properties: 1, Environments: 5, TrafficScale: tc.scale,
				Delivery: DeliveryConfig{Live: true, BatchSize: 500}})
			faults := tc.faults
			if faults.Environments != nil {
				// Every environment's buckets are held back 2 minutes after
				// their end.
				for _, env := range ls.envs {
					faults.Environments[env] = EnvironmentFaults{Late: 2 * time.Minute}
				}
			}
			ls.sim.srv.SetDeliveryFaults(faults)
			var ids []int64
			for i, p := range tc.profiles {
				ids = append(ids, ls.addProfile(ls.envs[p.env], fmt.Sprintf("edgepipe-%d", i), p.percent))
			}
			// Half-way through the first whole bucket: its records so far
			// (none where buckets are held back), none from the future.
			mid := logTestB0.Add(150 * time.Second)
			ls.advance(mid)
			for _, id := range ids {
				var n int
				for _, r := range ls.received()[id] {
					if r.ts > mid.UnixMicro() {
						t.Fatalf("profile %d: a record of %v delivered at %v", id, time.UnixMicro(r.ts).UTC(), mid)
					}
					if r.bucket().Equal(logTestB0) {
						n++
					}
				}
				b := logBucketAt(t, ls.sim.srv.LogBuckets(id), logTestB0)
				if tc.faults.Environments != nil && n != 0 {
					t.Errorf("profile %d: %d records of a held-back bucket delivered before its end", id, n)
				}
				if tc.faults.Environments == nil && (int64(n) != b.Queued || (b.Sampled > 4 && (n == 0 || int64(n) >= b.Sampled))) {
					t.Errorf("profile %d: %d records of %d half-way through the bucket (%d queued)", id, n, b.Sampled, b.Queued)
				}
			}
			// Three whole buckets, settled.
			end := logTestB0.Add(3 * logBucketWidth)
			ls.advance(end.Add(logTestLateData + 2*time.Minute))
			got := ls.received()
			for i, id := range ids {
				env := ls.envOf[id]
				ls.checkFields(got[id])
				logs := logCounts(got[id])
				api := ls.apiCounts(env, logTestB0, end)
				for b := logTestB0; b.Before(end); b = b.Add(logBucketWidth) {
					if api[b] == nil {
						t.Fatalf("no API data for %s at %v", env, b)
					}
					compareBucket(t, fmt.Sprintf("profile %d (environment %d) bucket %s", id, tc.profiles[i].env, b.Format("15:04")),
						api[b], logs[b], tc.profiles[i].percent)
				}
				if first := logBucketAt(t, ls.sim.srv.LogBuckets(id), logTestStart.Truncate(logBucketWidth)); !first.Partial {
					t.Errorf("profile %d: the bucket it was created in is not marked partial: %+v", id, first)
				}
			}
			if st := ls.sim.srv.Delivered(); tc.faults.DropAckPercent > 0 && st.AcksDropped == 0 {
				t.Errorf("no acknowledgement dropped: %+v", st)
			}
		})
	}
}

// logBucketAt returns the LogBucket starting at start.
func logBucketAt(t *testing.T, bs []LogBucket, start time.Time) LogBucket {
	t.Helper()
	for _, b := range bs {
		if b.Start.Equal(start) {
			return b
		}
	}
	t.Fatalf("no bucket %v in %+v", start, bs)
	return LogBucket{}
}

// TestDeliverRecordsDrawsTheModel: without live delivery, DeliverRecords
// hands out the same stream: delivering enough records to pass two whole
// buckets yields exactly their requests.
func TestDeliverRecordsDrawsTheModel(t *testing.T) {
	ls := newLogSim(t, Config{Seed: 31, Properties: 1, Environments: 5, TrafficScale: 0.02})
	id := ls.addProfile(ls.envs[0], "edgepipe", 100)
	end := logTestB0.Add(2 * logBucketWidth)
	for {
		if err := ls.sim.srv.DeliverRecords(context.Background(), id, 250); err != nil {
			t.Fatal(err)
		}
		bs := ls.sim.srv.LogBuckets(id)
		if bs[len(bs)-1].Start.Equal(end) {
			break
		}
	}
	ls.advance(end.Add(logTestLateData))
	got := ls.received()[id]
	ls.checkFields(got)
	logs := logCounts(got)
	api := ls.apiCounts(ls.envs[0], logTestB0, end)
	for b := logTestB0; b.Before(end); b = b.Add(logBucketWidth) {
		compareBucket(t, "bucket "+b.Format("15:04"), api[b], logs[b], 100)
	}
}

// seqNums returns the seq_nums the receiver accepted for a profile, by agent
// and datestamp.
func (ls *logSim) seqNums(profile int64) map[string][]int64 {
	ls.t.Helper()
	out := map[string][]int64{}
	for _, post := range ls.rcv.accepted() {
		_, b := decodeRecords(ls.t, "json", gunzip(ls.t, post.body))
		if b.ProfileID == profile {
			k := b.AgentID + "/" + b.Datestamp
			out[k] = append(out[k], *b.SeqNum)
		}
	}
	for _, s := range out {
		slices.Sort(s)
	}
	return out
}

// missingSeqs counts the seq_nums missing below each agent's highest.
func missingSeqs(seqs map[string][]int64) int64 {
	var n int64
	for _, s := range seqs {
		n += s[len(s)-1] + 1 - int64(len(s))
	}
	return n
}

// sumBuckets adds up a field of a profile's buckets in [from, to).
func sumBuckets(bs []LogBucket, from, to time.Time, field func(LogBucket) int64) int64 {
	var n int64
	for _, b := range bs {
		if !b.Start.Before(from) && b.Start.Before(to) {
			n += field(b)
		}
	}
	return n
}

// checkComplete compares every bucket of [B0, end) of a profile with the
// Metrics API.
func (ls *logSim) checkComplete(id int64, end time.Time) {
	ls.t.Helper()
	logs := logCounts(ls.received()[id])
	api := ls.apiCounts(ls.envOf[id], logTestB0, end)
	for b := logTestB0; b.Before(end); b = b.Add(logBucketWidth) {
		compareBucket(ls.t, fmt.Sprintf("profile %d bucket %s", id, b.Format("15:04")), api[b], logs[b], ls.percents[id])
	}
}

// newFaultSim starts a live logSim with faults from the start and two
// profiles: bad in environment 0, which the fault tests break, without
// downsampling, and good in environment 3 with goodPercent.
func newFaultSim(t *testing.T, faults DeliveryFaults, goodPercent float64) (ls *logSim, bad, good int64) {
	t.Helper()
	ls = newLogSim(t, Config{Seed: 31, Properties: 1, Environments: 5, TrafficScale: 0.01,
		Delivery: DeliveryConfig{Live: true, BatchSize: 40, Faults: faults}})
	return ls, ls.addProfile(ls.envs[0], "edgepipe", 100), ls.addProfile(ls.envs[3], "edgepipe", goodPercent)
}

// TestDeliveryFaultDropBatches: with DropBatchPercent (set at start) an
// environment loses whole numbered batches: the receiver sees seq_num
// gaps, and what it got plus what was lost is the bucket's records; the
// other environment is complete.
func TestDeliveryFaultDropBatches(t *testing.T) {
	faulty := buildWorld(31, 1, 5).envs[0].ID
	ls, bad, good := newFaultSim(t, DeliveryFaults{Environments: map[string]EnvironmentFaults{faulty: {DropBatchPercent: 20}}}, 25)
	end := logTestB0.Add(2 * logBucketWidth)
	ls.advance(end.Add(logTestLateData))

	st := ls.sim.srv.Delivered()
	bs := ls.sim.srv.LogBuckets(bad)
	lost := sumBuckets(bs, time.Time{}, end.Add(logBucketWidth), func(b LogBucket) int64 { return b.Lost })
	if st.BatchesLost == 0 || st.RecordsLost != lost || lost == 0 {
		t.Fatalf("no batch lost, or the counts disagree: %+v, %d records lost in the buckets", st, lost)
	}
	if gaps := missingSeqs(ls.seqNums(bad)); gaps == 0 || gaps > st.BatchesLost {
		t.Errorf("%d seq_nums missing at the receiver for %d batches lost", gaps, st.BatchesLost)
	}
	if gaps := missingSeqs(ls.seqNums(good)); gaps != 0 {
		t.Errorf("the other environment has %d seq_num gaps", gaps)
	}
	// Received plus lost is the bucket's records, bucket by bucket.
	logs := logCounts(ls.received()[bad])
	api := ls.apiCounts(faulty, logTestB0, end)
	for b := logTestB0; b.Before(end); b = b.Add(logBucketWidth) {
		lb := logBucketAt(t, bs, b)
		var got float64
		if logs[b] != nil {
			got = logs[b].total
		}
		if int64(got)+lb.Lost != int64(api[b].total) || int64(got) != lb.Queued || lb.Skipped != 0 {
			t.Errorf("bucket %s: %v received + %d lost, want the API's %v requests (%+v)", b.Format("15:04"), got, lb.Lost, api[b].total, lb)
		}
	}
	ls.checkComplete(good, end)
}

// TestDeliveryFaultDropRecords: DropRecordPercent, switched on at run time,
// drops records before they are batched: seq_nums stay without a gap, and
// only the comparison with the Metrics API shows the loss, which is exactly
// the records counted as skipped.
func TestDeliveryFaultDropRecords(t *testing.T) {
	ls, bad, good := newFaultSim(t, DeliveryFaults{}, 100)
	faulty := ls.envs[0]
	ls.advance(logTestB0)
	ls.sim.srv.SetDeliveryFaults(DeliveryFaults{Environments: map[string]EnvironmentFaults{faulty: {DropRecordPercent: 10}}})
	end := logTestB0.Add(2 * logBucketWidth)
	ls.advance(end.Add(logTestLateData))

	if gaps := missingSeqs(ls.seqNums(bad)); gaps != 0 {
		t.Errorf("%d seq_num gaps: dropped records must not leave one", gaps)
	}
	logs := logCounts(ls.received()[bad])
	api := ls.apiCounts(faulty, logTestB0, end)
	bs := ls.sim.srv.LogBuckets(bad)
	for b := logTestB0; b.Before(end); b = b.Add(logBucketWidth) {
		lb := logBucketAt(t, bs, b)
		got := int64(logs[b].total)
		want := int64(api[b].total)
		if got+lb.Skipped != want || lb.Lost != 0 || got != lb.Queued {
			t.Errorf("bucket %s: %d received + %d skipped, want the API's %d requests (%+v)", b.Format("15:04"), got, lb.Skipped, want, lb)
		}
		if share := float64(lb.Skipped) / float64(want); share < 0.05 || share > 0.15 {
			t.Errorf("bucket %s: %d of %d records skipped, want about 10%%", b.Format("15:04"), lb.Skipped, want)
		}
	}
	if st := ls.sim.srv.Delivered(); st.RecordsSkipped == 0 || st.BatchesLost != 0 {
		t.Errorf("stats %+v", st)
	}
	ls.checkComplete(good, end)
}

// TestDeliveryFaultLate: Late, switched on at run time, holds a bucket's
// records back until Late after its end, then delivers them; switched off,
// the records held are delivered at once, and every bucket ends complete.
func TestDeliveryFaultLate(t *testing.T) {
	ls, bad, good := newFaultSim(t, DeliveryFaults{}, 100)
	faulty := ls.envs[0]
	inB0 := func(id int64) int {
		n := 0
		for _, r := range ls.received()[id] {
			if r.bucket().Equal(logTestB0) {
				n++
			}
		}
		return n
	}
	ls.advance(logTestB0.Add(time.Minute))
	before := inB0(bad)
	if before == 0 {
		t.Fatal("no record of the first minute delivered")
	}
	ls.sim.srv.SetDeliveryFaults(DeliveryFaults{Environments: map[string]EnvironmentFaults{faulty: {Late: 3 * time.Minute}}})
	ls.advance(logTestB0.Add(logBucketWidth + 2*time.Minute))
	if n, other := inB0(bad), inB0(good); n != before || other <= before/2 {
		t.Fatalf("held back: %d records of the bucket (%d before the fault), the other environment %d", n, before, other)
	}
	ls.advance(logTestB0.Add(logBucketWidth + 3*time.Minute))
	if n, b := inB0(bad), logBucketAt(t, ls.sim.srv.LogBuckets(bad), logTestB0); int64(n) != b.Sampled {
		t.Fatalf("3 minutes after its end %d of the bucket's %d records arrived", n, b.Sampled)
	}
	ls.sim.srv.SetDeliveryFaults(DeliveryFaults{})
	end := logTestB0.Add(3 * logBucketWidth)
	ls.advance(end.Add(logTestLateData))
	ls.checkComplete(bad, end)
	ls.checkComplete(good, end)
}
