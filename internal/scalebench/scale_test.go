package scalebench

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// leanConfig is the example config the README's table measures.
const leanConfig = "../../examples/lean.yaml"

// run is one measured configuration.
type run struct {
	name string
	// args are the exporter's extra flags (--config.file, …).
	args []string
	// properties and environments size the simulator's organization.
	properties, environments int
	pollInterval             time.Duration
	// cycles are the poll cycles measured after the first (which fetches
	// the whole settle window and creates every series).
	cycles int
	// prometheus has a real Prometheus scrape the exporter every
	// prometheusInterval, to record what its scrapes take.
	prometheus bool
}

// prometheusInterval is the scrape interval and timeout of the measuring
// Prometheus (a common production setting).
const prometheusInterval = 15 * time.Second

// result is what one run measured.
type result struct {
	run
	datasets, envs int
	// requestsPerCycle are the data requests of each measured cycle.
	requestsPerCycle []int
	// pollMean is the mean poll duration over datasets and measured
	// cycles, pollMax the slowest dataset's mean.
	pollMean, pollMax time.Duration
	series            int     // dataset series in a scrape (isDatasetFamily)
	dropped           float64 // edgepipe_series_limit_dropped_total, summed
	scrape            time.Duration
	wireBytes, bytes  int
	rss, peakRSS      int64
	rowsPerCycle      float64 // ClickHouse rows written per cycle
	firstPoll         time.Duration
	// promScrape is Prometheus's slowest scrape_duration_seconds of the
	// exporter over the measured cycles, promSamples its samples.
	promScrape  time.Duration
	promSamples int
}

// measure starts the simulator (in this process, so its cost does not count
// as the exporter's) and the exporter binary with ClickHouse, waits for the
// first poll of every dataset and r.cycles more, reads every poll from the
// exporter's debug log (requests, duration, buckets published), then
// scrapes three times and reads the exporter's memory.
func measure(tb testing.TB, r run) result {
	tb.Helper()
	bin := testenv.GoBuild(tb, "github.com/edgepipe/edgepipe/cmd/exporter")
	ch := testenv.ClickHouse(tb)
	db := ch.NewDatabase(tb)
	sim, err := platformsim.New(platformsim.Config{Seed: 1, Properties: r.properties, Environments: r.environments})
	if err != nil {
		tb.Fatal(err)
	}
	base, err := sim.Start("127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { sim.Close() })
	res := result{run: r, datasets: len(sim.DatasetNames()), envs: len(sim.EnvironmentIDs())}

	addr := testenv.FreeAddr(tb)
	args := append([]string{"--api.url=" + base, "--organization-id=" + platformsim.DemoOrganizationID,
		"--web.listen-address=" + addr, "--poll-interval=" + r.pollInterval.String(), "--poll.jitter=0s",
		"--clickhouse.dsn=" + ch.DSN(db), "--log.level=debug", "--log.format=json",
		// As the chart runs it: a first start counts its first poll in full
		// (and the state is saved after every poll, which this measures too).
		"--state.dir=" + filepath.Join(tb.TempDir(), "state")}, r.args...)
	env := append(os.Environ(), "EDGEPIPE_CLIENT_ID="+platformsim.DemoClientID, "EDGEPIPE_CLIENT_SECRET="+platformsim.DemoClientSecret,
		"EDGEPIPE_ENVIRONMENT_ID=", "EDGEPIPE_ORGANIZATION_ID=", "EDGEPIPE_CLICKHOUSE_DSN=")
	started := time.Now()
	pid, logPath := startExporter(tb, bin, env, args)
	url := "http://" + addr
	var prom *testenv.PrometheusServer
	if r.prometheus {
		prom = testenv.PrometheusScrape(tb, testenv.ScrapeJob{Name: "exporter", Targets: []string{addr}, ScrapeInterval: prometheusInterval})
	}

	// Ready: discovery and a first successful poll of every dataset.
	waitFor(tb, 15*time.Minute, func() error {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz %d", resp.StatusCode)
		}
		return nil
	})
	res.firstPoll = time.Since(started)

	// r.cycles further poll cycles of every dataset, from the debug log;
	// their data requests as the simulator received them.
	var polls map[string][]poll
	var cycles []time.Time
	waitFor(tb, time.Duration(r.cycles+1)*r.pollInterval+15*time.Minute, func() error {
		polls = readPolls(tb, logPath)
		var err error
		cycles, err = measuredCycles(polls, sim.DatasetNames(), r.cycles)
		return err
	})
	checkCycles(tb, polls)
	stats := sim.Stats()
	sent := simRequests(stats.Data, polls)
	var took time.Duration
	var rows int
	slowest := map[string]time.Duration{}
	for _, c := range cycles {
		n := 0
		for ds, ps := range polls {
			for i, p := range ps { // one poll, or more when the loop polled the cycle again
				if !p.cycle.Equal(c) {
					continue
				}
				if p.envs != res.envs {
					tb.Errorf("poll of %s in cycle %s covered %d environments, the organization has %d", ds, c.Format(time.TimeOnly), p.envs, res.envs)
				}
				if sent[ds][i] != p.requests {
					tb.Errorf("cycle %s of %s: the simulator received %d data requests where the poll planned %d (retries, or requests of a failed poll)",
						c.Format(time.TimeOnly), ds, sent[ds][i], p.requests)
				}
				n += sent[ds][i]
				took += p.took
				slowest[ds] += p.took
				rows += p.new + p.revisions
			}
		}
		res.requestsPerCycle = append(res.requestsPerCycle, n)
	}
	for _, t := range slowest {
		res.pollMax = max(res.pollMax, t/time.Duration(r.cycles))
	}
	for _, d := range stats.Data {
		if d.Status != http.StatusOK {
			tb.Errorf("the simulator answered a data request of %s with %d", d.Dataset, d.Status)
		}
	}
	res.pollMean = took / time.Duration(r.cycles*len(polls))
	res.rowsPerCycle = float64(rows) / float64(r.cycles)
	if prom != nil {
		window := model.Duration(max(time.Duration(r.cycles)*r.pollInterval, 2*prometheusInterval))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		waitFor(tb, 2*prometheusInterval, func() error { // a scrape with the series
			v, err := prom.Query(ctx, `scrape_samples_scraped{job="exporter"} > 1000`)
			if err != nil {
				return fmt.Errorf("query the exporter's scrapes: %w", err)
			}
			if vec, ok := v.(model.Vector); !ok || len(vec) == 0 {
				return errors.New("no scrape of the exporter's series yet")
			}
			return nil
		})
		for _, q := range []struct {
			expr string
			into func(float64)
		}{
			{fmt.Sprintf(`max_over_time(scrape_duration_seconds{job="exporter"}[%s])`, window),
				func(v float64) { res.promScrape = time.Duration(v * float64(time.Second)) }},
			{`scrape_samples_scraped{job="exporter"}`, func(v float64) { res.promSamples = int(v) }},
			{`up{job="exporter"}`, func(v float64) {
				if v != 1 {
					tb.Errorf("Prometheus's last scrape of the exporter failed (up %v)", v)
				}
			}},
		} {
			v, err := prom.Query(ctx, q.expr)
			if err != nil {
				tb.Fatal(err)
			}
			vec, ok := v.(model.Vector)
			if !ok || len(vec) != 1 {
				tb.Fatalf("%s: %v", q.expr, v)
			}
			q.into(float64(vec[0].Value))
		}
	}

	// What ClickHouse wrote, once its queue is empty: never more than the
	// rows published.
	var self selfMetrics
	waitFor(tb, 5*time.Minute, func() error {
		self = scrapeSelf(tb, url)
		if q := self.value("edgepipe_clickhouse_queue_rows"); q != 0 || self.sum("edgepipe_clickhouse_rows_written_total") == 0 {
			return fmt.Errorf("%v rows queued, %v written", q, self.sum("edgepipe_clickhouse_rows_written_total"))
		}
		return nil
	})
	published := 0
	for _, ps := range readPolls(tb, logPath) {
		for _, p := range ps {
			published += p.new + p.revisions + p.baseline + p.replayed
		}
	}
	if w := self.sum("edgepipe_clickhouse_rows_written_total"); w > float64(published) {
		tb.Errorf("ClickHouse wrote %v rows, more than the %d published", w, published)
	}
	res.dropped = self.sum("edgepipe_series_limit_dropped_total")

	// Three scrapes as Prometheus makes them (gzip); the median counts.
	var times []time.Duration
	for range 3 {
		sc := scrape(tb, url)
		times = append(times, sc.took)
		res.series, res.wireBytes, res.bytes = sc.series, sc.wire, sc.raw
	}
	slices.Sort(times)
	res.scrape = times[1]
	res.rss, res.peakRSS = memory(tb, pid)
	return res
}

// poll is one "polled" line of the exporter's debug log.
type poll struct {
	// cycle is the start of the poll cycle the poll was due in; end is
	// when it ended (the line's time).
	cycle, end                     time.Time
	requests, envs, new, revisions int
	baseline, replayed             int // buckets published but not counted (a start without --state.dir)
	took                           time.Duration
}

// readPolls returns the polls logged so far, per dataset in order.
func readPolls(tb testing.TB, path string) map[string][]poll {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	out := map[string][]poll{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if !bytes.Contains(sc.Bytes(), []byte(`"msg":"polled"`)) {
			continue
		}
		var l struct {
			Time      time.Time `json:"time"`
			Dataset   string    `json:"dataset"`
			Cycle     time.Time `json:"cycle"`
			Envs      int       `json:"envs"`
			Requests  int       `json:"requests"`
			New       int       `json:"new"`
			Revisions int       `json:"revisions"`
			Baseline  int       `json:"baseline"`
			Replayed  int       `json:"replayed"`
			Took      string    `json:"took"` // promslog writes durations as "1.5s"
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			tb.Fatalf("log line %s: %v", sc.Bytes(), err)
		}
		took, err := time.ParseDuration(l.Took)
		if err != nil {
			tb.Fatalf("log line %s: took: %v", sc.Bytes(), err)
		}
		if l.Time.IsZero() || l.Cycle.IsZero() {
			tb.Fatalf("log line %s: no time or cycle", sc.Bytes())
		}
		out[l.Dataset] = append(out[l.Dataset], poll{cycle: l.Cycle, end: l.Time, requests: l.Requests, envs: l.Envs,
			new: l.New, revisions: l.Revisions, baseline: l.Baseline, replayed: l.Replayed, took: took})
	}
	return out
}

// measuredCycles returns the first n poll cycles after the first polls in
// which every dataset of datasets polled, or an error while there are fewer.
// A cycle a dataset's poll overran is left out: the dataset polls again
// in the cycle after.
func measuredCycles(polls map[string][]poll, datasets []string, n int) ([]time.Time, error) {
	var first time.Time
	for _, ds := range datasets {
		if len(polls[ds]) == 0 {
			return nil, fmt.Errorf("no poll of %s yet", ds)
		}
		if c := polls[ds][0].cycle; c.After(first) {
			first = c
		}
	}
	in := map[time.Time]int{}
	for _, ds := range datasets {
		for _, p := range polls[ds] {
			if p.cycle.After(first) {
				in[p.cycle]++
			}
		}
	}
	var out []time.Time
	for c, k := range in {
		if k >= len(datasets) {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, time.Time.Compare)
	if len(out) < n {
		return nil, fmt.Errorf("%d of %d poll cycles of every dataset", len(out), n)
	}
	return out[:n], nil
}

// checkCycles fails when a dataset polled one cycle twice: each poll
// cycle's requests are one poll's.
func checkCycles(tb testing.TB, polls map[string][]poll) {
	tb.Helper()
	for ds, ps := range polls {
		for i := 1; i < len(ps); i++ {
			if !ps[i].cycle.After(ps[i-1].cycle) {
				tb.Errorf("%s polled cycle %s again (poll %d)", ds, ps[i].cycle.Format(time.TimeOnly), i)
			}
		}
	}
}

// simRequests counts, for each poll of polls (per dataset, in log order),
// the data requests the simulator received for its dataset after the
// dataset's previous logged poll ended, up to the poll's end: the poll's
// own, the retried ones included, and those of any poll that failed in
// between (a failed poll logs no "polled" line). That is the honest measure
// of requests per cycle; the log's own count is what the poll planned.
func simRequests(data []platformsim.DataRequest, polls map[string][]poll) map[string][]int {
	out := map[string][]int{}
	for ds, ps := range polls {
		out[ds] = make([]int, len(ps))
	}
	for _, d := range data {
		ps := polls[d.Dataset]
		if i := sort.Search(len(ps), func(i int) bool { return !ps[i].end.Before(d.At) }); i < len(ps) {
			out[d.Dataset][i]++
		}
	}
	return out
}

func waitFor(tb testing.TB, timeout time.Duration, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("waited %s: %v", timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// startExporter runs the exporter binary until the test ends and returns
// its process ID and log file; the log's end is shown if the test fails.
func startExporter(tb testing.TB, bin string, env, args []string) (int, string) {
	tb.Helper()
	logPath := filepath.Join(tb.TempDir(), "exporter.log")
	logf, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tb.Cleanup(func() {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			tb.Errorf("stop the exporter: %v", err)
		}
		select {
		case err := <-exited:
			if err != nil {
				tb.Errorf("the exporter exited with %v", err)
			}
		case <-time.After(30 * time.Second):
			tb.Error("the exporter did not stop within 30s of SIGTERM; killed")
			_ = cmd.Process.Kill() // it exits either way
			tb.Logf("killed: %v", <-exited)
		}
		logf.Close()
		if tb.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				tb.Logf("exporter log:\n%s", tail(b, 4000))
			}
		}
	})
	return cmd.Process.Pid, logPath
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// selfMetrics are the edgepipe_ samples of a scrape, by name{labels} as
// the text format writes them.
type selfMetrics map[string]float64

func (s selfMetrics) value(key string) float64 { return s[key] }

// sum adds the samples of metric name over all label values.
func (s selfMetrics) sum(name string) float64 {
	var n float64
	for k, v := range s {
		if k == name || strings.HasPrefix(k, name+"{") {
			n += v
		}
	}
	return n
}

// scrapeSelf reads /metrics and keeps the edgepipe_ samples, streaming past
// the rest.
func scrapeSelf(tb testing.TB, url string) selfMetrics {
	tb.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	out := selfMetrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "edgepipe_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			tb.Fatalf("sample %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// scraped is one scrape's cost.
type scraped struct {
	took      time.Duration
	wire, raw int
	series    int
}

// prometheusAccept is what Prometheus 2.42 asks for.
const prometheusAccept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"

// scrape fetches /metrics as Prometheus does (gzip) and counts the bytes on
// the wire and unpacked, and the cdn series, which it also parses, so a
// malformed exposition fails here.
func scrape(tb testing.TB, url string) scraped {
	tb.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/metrics", nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Accept", prometheusAccept)
	req.Header.Set("Accept-Encoding", "gzip")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if err != nil || resp.StatusCode != http.StatusOK {
		tb.Fatalf("scrape: %d %v", resp.StatusCode, err)
	}
	raw := body
	if resp.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			tb.Fatal(err)
		}
		if raw, err = io.ReadAll(zr); err != nil {
			tb.Fatal(err)
		}
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		tb.Fatalf("parse the exposition: %v", err)
	}
	s := scraped{took: took, wire: len(body), raw: len(raw)}
	for name, mf := range mfs {
		if isDatasetFamily(name) {
			s.series += len(mf.Metric)
		}
	}
	return s
}

// isDatasetFamily reports whether the metric family name is one of the
// datasets' series, which --prometheus.max-series bounds: not a
// self-metric, nor the inventory's environment and certificate series,
// which come on top of the budget.
func isDatasetFamily(name string) bool {
	for _, p := range []string{"edgepipe_", "go_", "process_", "promhttp_", "cdn_environment_info", "cdn_tls_certificate_"} {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	return true
}

// memory returns the process's resident and peak resident memory.
func memory(tb testing.TB, pid int) (rss, peak int64) {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	if rss == 0 {
		tb.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	return rss, peak
}

// check asserts what must hold at any size: every measured cycle took
// datasets × ceil(environments/20) data requests at the simulator, and
// there are series.
func (r result) check(tb testing.TB) {
	tb.Helper()
	want := r.datasets * ((r.envs + metricsapi.MaxFilterValues - 1) / metricsapi.MaxFilterValues)
	if len(r.requestsPerCycle) != r.cycles {
		tb.Errorf("%s: %d cycles measured, want %d", r.name, len(r.requestsPerCycle), r.cycles)
	}
	for i, n := range r.requestsPerCycle {
		if n != want {
			tb.Errorf("%s: cycle %d took %d data requests at the simulator, want datasets × ceil(envs/20) = %d", r.name, i, n, want)
		}
	}
	if r.series == 0 || r.pollMean <= 0 || r.rowsPerCycle <= 0 || r.rss <= 0 {
		tb.Errorf("%s: nothing measured: %+v", r.name, r)
	}
}

// row formats r as a row of the README's table.
func (r result) row() string {
	perSeries := "–"
	if r.series > 0 {
		perSeries = fmt.Sprintf("%d B", r.rss/int64(r.series))
	}
	promScrape := "–"
	if r.prometheus {
		promScrape = fmt.Sprintf("%s (%s samples)", round(r.promScrape), thousands(r.promSamples))
	}
	return fmt.Sprintf("| %s | %s | %s | %s / %s | %s | %s | %s | %s | %s / %s | %s (peak %s) | %s | %s |",
		thousands(r.envs), r.name, requests(r.requestsPerCycle), round(r.pollMean), round(r.pollMax), round(r.firstPoll),
		thousands(r.series), round(r.scrape), promScrape, mib(r.wireBytes), mib(r.bytes), mib64(r.rss), mib64(r.peakRSS), perSeries,
		thousands(int(math.Round(r.rowsPerCycle))))
}

// requests formats the data requests of the measured cycles.
func requests(perCycle []int) string {
	s := make([]string, len(perCycle))
	for i, n := range perCycle {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

const tableHeader = "| environments | configuration | data requests per cycle (at the simulator) | poll mean / slowest dataset | first poll (ready) | series | scrape | Prometheus's slowest scrape | scrape bytes gzip / text | exporter RSS | RSS / series | ClickHouse rows / cycle |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|"

func round(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second).String()
	case d >= 100*time.Millisecond:
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

func mib(n int) string     { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
func mib64(n int64) string { return mib(int(n)) }

func thousands(n int) string {
	s := strconv.Itoa(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// TestScaleSmoke runs the measurement on 60 environments in 3 properties
// with a 5 s poll interval, for the lean config and the default selection
// under a small budget: data requests per cycle at the simulator stay
// datasets × ceil(envs/20), and every figure of the table is measured.
func TestScaleSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the exporter and ClickHouse")
	}
	for _, r := range []run{
		{name: "lean", args: []string{"--config.file=" + leanConfig}, prometheus: true},
		{name: "default, --prometheus.max-series=20000", args: []string{"--prometheus.max-series=20000"}},
	} {
		r.properties, r.environments, r.pollInterval, r.cycles = 3, 60, 5*time.Second, 2
		res := measure(t, r)
		res.check(t)
		if r.name != "lean" && (res.series > 20000 || res.dropped == 0) {
			t.Errorf("%s: %d series, %v dropped: the budget did not hold", r.name, res.series, res.dropped)
		}
		t.Logf("%s\n%s", tableHeader, res.row())
	}
}

// BenchmarkScale is make bench-scale: 1,000 environments in 10 properties,
// the default selection (without a budget, to measure it whole; and with the
// default budget) and the lean example config, and 200 environments in 10
// properties with the default selection and budget; two measured cycles of
// the default 1m poll interval each. Every cycle must take datasets ×
// ceil(environments/20) data requests at the simulator. It prints the
// README's table; EDGEPIPE_SCALE_RUN=<part of a run's name> runs only the
// runs it names.
//
//	go test -run '^$' -bench BenchmarkScale -benchtime 1x -timeout 90m ./internal/scalebench
func BenchmarkScale(b *testing.B) {
	runs := []run{
		// Without a budget, to measure the default selection whole (a
		// Prometheus for a million series would not fit here beside it).
		{name: "default selection, --prometheus.max-series=0", environments: 1000, args: []string{"--prometheus.max-series=0"}},
		{name: "default selection, default budget", environments: 1000, prometheus: true},
		{name: "examples/lean.yaml", environments: 1000, args: []string{"--config.file=" + leanConfig}, prometheus: true},
		{name: "default selection, default budget", environments: 200, prometheus: true},
	}
	if only := os.Getenv("EDGEPIPE_SCALE_RUN"); only != "" {
		runs = slices.DeleteFunc(runs, func(r run) bool { return !strings.Contains(fmt.Sprintf("%d %s", r.environments, r.name), only) })
	}
	var rows []string
	for _, r := range runs {
		r.properties, r.pollInterval, r.cycles = 10, time.Minute, 2
		b.Run(strings.NewReplacer(" ", "_", ",", "").Replace(fmt.Sprintf("%d %s", r.environments, r.name)), func(b *testing.B) {
			var res result
			for b.Loop() {
				res = measure(b, r)
			}
			res.check(b)
			b.ReportMetric(float64(res.series), "series")
			b.ReportMetric(res.scrape.Seconds(), "scrape-s")
			b.ReportMetric(float64(res.rss)/float64(max(res.series, 1)), "rss-B/series")
			b.ReportMetric(float64(slices.Max(res.requestsPerCycle)), "max-requests/cycle")
			rows = append(rows, res.row())
		})
	}
	sort.Strings(rows)
	fmt.Printf("\nEnvironments in 10 properties, poll interval 1m:\n\n%s\n%s\n", tableHeader, strings.Join(rows, "\n"))
}
