package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	promsink "github.com/edgepipe/edgepipe/internal/sinks/prometheus"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

const dataRoute = "POST /metrics/v1/datasets/{name}/data"

// TestEveryDatasetMetricAndEnvironment runs the exporter against an
// organization of 45 environments in 4 properties and checks the whole
// exposition against the simulator's own rows: all six datasets, every
// metric under its contract name, every environment; counters equal the
// bucket sums, gauges the newest bucket; promtool finds nothing; each poll
// cycle takes datasets × ceil(45/20) data requests.
func TestEveryDatasetMetricAndEnvironment(t *testing.T) {
	te := startExporter(t, testOptions{sim: platformsim.Config{Properties: 4, Environments: 45}})
	envs := te.sim.EnvironmentIDs()
	datasets := te.sim.DatasetNames()
	if len(envs) != 45 || len(te.sim.Properties()) != 4 || len(datasets) != 6 {
		t.Fatalf("world: %d environments, %d properties, %d datasets", len(envs), len(te.sim.Properties()), len(datasets))
	}
	if code, body := te.get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz %d %s after the first polls", code, body)
	}

	// One cycle at 10:05:00: the data requests of one poll of each dataset.
	te.sim.ResetStats()
	te.advance(2*time.Minute + 30*time.Second)
	st := te.sim.Stats()
	per := map[string]int{}
	for _, d := range st.Data {
		per[d.Dataset]++
		if len(d.Environments) > metricsapi.MaxFilterValues {
			t.Errorf("a request filtered %d environments", len(d.Environments))
		}
		if d.Status != http.StatusOK {
			t.Errorf("data request answered %d", d.Status)
		}
	}
	want := ceilDiv(len(envs), metricsapi.MaxFilterValues)
	if len(st.Data) != len(datasets)*want {
		t.Errorf("%d data requests in one poll cycle, want datasets × ceil(envs/20) = %d × %d", len(st.Data), len(datasets), want)
	}
	for _, ds := range datasets {
		if per[ds] != want {
			t.Errorf("dataset %s: %d requests per poll, want %d", ds, per[ds], want)
		}
	}
	if st.Requests[dataRoute][http.StatusOK] != len(st.Data) {
		t.Errorf("route counts %v disagree with %d data requests", st.Requests[dataRoute], len(st.Data))
	}

	te.advance(3 * time.Minute) // 10:08: revisions of late data
	body, got := te.scrape()
	testenv.CheckMetrics(t, body)
	at := te.clock.Now()
	exp := truth(t, te.sim, envs, datasets, te.firstFrom, metricsapi.FiveMinutes.Truncate(at), at)
	exp.check(t, got)
	// Every environment has traffic (edge_usage_by_country); sparser
	// datasets (errors) have rows for some, and the check above proved
	// those are exported exactly.
	if n := len(exp.envs["edge_usage_by_country"]); n != len(envs) {
		t.Errorf("edge_usage_by_country has rows for %d of %d environments", n, len(envs))
	}
	for _, env := range envs {
		if !strings.Contains(string(body), `environment_id="`+env+`"`) {
			t.Errorf("environment %s not in the exposition", env)
		}
	}
	for _, ds := range datasets {
		// Every metric of the descriptor appears under its contract name.
		for _, m := range te.sim.DatasetMetrics(ds) {
			name, _ := promsink.Name(promsink.DefaultPrefix, ds, m)
			if !strings.Contains(string(body), "\n"+name+"{") {
				t.Errorf("metric %s of %s not exposed as %s", m, ds, name)
			}
		}
	}
	if got[`edgepipe_environments{}`] != 45 {
		t.Errorf("edgepipe_environments = %v", got[`edgepipe_environments{}`])
	}
	if got[`edgepipe_revisions_total{dataset=edge_usage_by_country}`] == 0 {
		t.Error("no revisions counted although the simulator has late data")
	}
	if code, body := te.get("/"); code != http.StatusOK || !strings.Contains(string(body), "/metrics") {
		t.Errorf("landing page: %d", code)
	}
	if code, _ := te.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
}

// TestRevisionMovesCounterByItsDifference polls a bucket while it is still
// filling, then again a minute later: every counter moves by exactly the
// difference of the simulator's values between the two times.
func TestRevisionMovesCounterByItsDifference(t *testing.T) {
	te := startExporter(t, testOptions{sim: platformsim.Config{Environments: 3}, run: func(f *runFlags) {
		f.datasets = []string{"origin_offload", "edge_errors"}
	}})
	envs := te.sim.EnvironmentIDs()
	ds := []string{"origin_offload", "edge_errors"}
	te.advance(2*time.Minute + 30*time.Second) // 10:05: bucket 10:00 is new and still filling
	t1 := te.clock.Now()
	_, c1 := te.scrape()
	te.advance(time.Minute) // 10:06: bucket 10:00 revised
	t2 := te.clock.Now()
	_, c2 := te.scrape()
	to := metricsapi.FiveMinutes.Truncate(t1)
	e1 := truth(t, te.sim, envs, ds, te.firstFrom, to, t1)
	e2 := truth(t, te.sim, envs, ds, te.firstFrom, to, t2)
	moved := 0
	for k := range e2.counters {
		want := e2.values[k] - e1.values[k]
		if got := c2[k] - c1[k]; got != want {
			t.Errorf("%s moved by %v, the revision's difference is %v", k, got, want)
		}
		if want != 0 {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no counter was revised: the test proves nothing")
	}
	e2.check(t, c2)
	if c2["edgepipe_revisions_total{dataset=origin_offload}"] == 0 {
		t.Error("edgepipe_revisions_total did not count the revisions")
	}
}

// TestRestartedLoopsDoNotDoubleCount changes every dataset's descriptor
// (its retention) between two discoveries, as the platform may: discovery
// restarts every poll loop, the new loops re-fetch the settle window at
// once, and the counters still equal the simulator's sums.
func TestRestartedLoopsDoNotDoubleCount(t *testing.T) {
	var changed atomic.Bool
	te := startExporter(t, testOptions{
		sim: platformsim.Config{Environments: 22},
		common: func(c *commonFlags) {
			c.apiURL = descriptorProxy(t, c.apiURL, &changed)
		},
		// Discovery every 20s of simulated time, between the minutes the
		// polls are aligned to.
		run: func(f *runFlags) { f.discoveryInterval = 20 * time.Second },
	})
	envs := te.sim.EnvironmentIDs()
	datasets := te.sim.DatasetNames()
	te.advance(20 * time.Minute) // 10:22:30, all late data of [.., 10:10) settled
	te.advance(20 * time.Minute) // 10:42:30
	changed.Store(true)
	te.advance(20 * time.Second) // 10:42:50: a discovery, and no poll is due
	restarted := map[string]bool{}
	for _, d := range te.sim.Stats().Data {
		if d.At.Equal(te.clock.Now()) {
			restarted[d.Dataset] = true
		}
	}
	for _, ds := range datasets {
		if !restarted[ds] {
			t.Errorf("%s: no poll at %s: the changed descriptor did not restart its loop", ds, te.clock.Now())
		}
	}
	_, got := te.scrape()
	at := te.clock.Now()
	truth(t, te.sim, envs, datasets, te.firstFrom, metricsapi.FiveMinutes.Truncate(at), at).check(t, got)
}

// descriptorProxy serves the platform API at target through a proxy that,
// once changed is set, lists every dataset with a day more of DAY retention.
func descriptorProxy(t *testing.T, target string, changed *atomic.Bool) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Header.Del("Accept-Encoding") // a body this proxy can edit
		},
		ModifyResponse: func(resp *http.Response) error {
			if !changed.Load() || resp.Request.Method != http.MethodGet || !strings.HasSuffix(resp.Request.URL.Path, "/metrics/v1/datasets") {
				return nil
			}
			var list map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
				return fmt.Errorf("decode the dataset list: %w", err)
			}
			if err := resp.Body.Close(); err != nil {
				return err
			}
			items, _ := list["items"].([]any)
			for _, it := range items {
				ds, _ := it.(map[string]any)
				retention, _ := ds["data_retention_policy"].(map[string]any)
				day, ok := retention["day"].(float64)
				if !ok {
					return fmt.Errorf("dataset %v has no DAY retention", ds["name"])
				}
				retention["day"] = day + 86400
			}
			body, err := json.Marshal(list)
			if err != nil {
				return err
			}
			resp.Body = io.NopCloser(bytes.NewReader(body))
			resp.ContentLength = int64(len(body))
			resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
			return nil
		},
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestPollOverrunningABoundary makes every poll take longer than the time
// to the next bucket boundary: the range is fixed when a poll starts and
// the next poll starts from the high-water mark, so nothing is skipped.
func TestPollOverrunningABoundary(t *testing.T) {
	te := startExporter(t, testOptions{sim: platformsim.Config{Environments: 4}})
	envs := te.sim.EnvironmentIDs()
	datasets := te.sim.DatasetNames()
	te.advance(time.Minute + 30*time.Second) // 10:04:00
	// The polls at 10:05:00 ask for [.., 10:05) and are slow: while their
	// requests are in flight the clock passes 10:10.
	te.sim.SetFaults(platformsim.Faults{Latency: 500 * time.Millisecond})
	te.sim.ResetStats()
	te.clock.Advance(time.Minute)
	time.Sleep(150 * time.Millisecond)
	te.clock.Advance(6 * time.Minute) // 10:11:00
	te.settle()
	overran := 0
	for _, d := range te.sim.Stats().Data {
		if d.End.Equal(time.Date(2026, 11, 23, 10, 5, 0, 0, time.UTC)) && !d.At.Before(time.Date(2026, 11, 23, 10, 11, 0, 0, time.UTC)) {
			overran++
		}
	}
	if overran == 0 {
		t.Fatal("no poll overran the boundary: the test proves nothing")
	}
	te.sim.SetFaults(platformsim.Faults{})
	te.advance(time.Minute) // 10:12:00: to = 10:10
	at := te.clock.Now()
	_, got := te.scrape()
	truth(t, te.sim, envs, datasets, te.firstFrom, metricsapi.FiveMinutes.Truncate(at), at).check(t, got)
	// The high-water marks are at 10:10: the next polls reach back the
	// settle window from there, not from 10:05.
	te.sim.ResetStats()
	te.advance(time.Minute) // 10:13:00
	from := map[string]time.Time{}
	for _, d := range te.sim.Stats().Data {
		if d.Status == http.StatusOK {
			from[d.Dataset] = d.Start
		}
	}
	for _, ds := range datasets {
		if want := time.Date(2026, 11, 23, 9, 40, 0, 0, time.UTC); !from[ds].Equal(want) {
			t.Errorf("%s: the poll after the overrun asked from %s, want %s (high-water mark 10:10 minus the settle window)", ds, from[ds], want)
		}
	}
}

// TestEveryBucketArrivesDespite429AndShortTokens answers 20% of API calls
// with 429 and lets tokens live 5 s (of simulated time, so every cycle
// finds its token expired): the counters still equal the simulator's sums.
// The certificate inventory is off: its retries would stretch the cycles
// in real time past the client's early token refresh, and no 401 would
// come (TestInventoryDespite429 is its own test).
func TestEveryBucketArrivesDespite429AndShortTokens(t *testing.T) {
	te := startExporter(t, testOptions{sim: platformsim.Config{
		Environments: 21, TokenLifetime: 5 * time.Second,
		Faults: platformsim.Faults{Rate429: 0.2, RetryAfter: time.Second},
	}, run: func(f *runFlags) { f.inventoryInterval = 0 }})
	envs := te.sim.EnvironmentIDs()
	datasets := te.sim.DatasetNames()
	for range 2 {
		te.advance(5 * time.Minute)
	}
	st := te.sim.Stats()
	n429, n401 := 0, 0
	for _, byStatus := range st.Requests {
		n429 += byStatus[http.StatusTooManyRequests]
		n401 += byStatus[http.StatusUnauthorized]
	}
	if n429 == 0 || n401 == 0 {
		t.Fatalf("faults not exercised: %d answers 429, %d answers 401", n429, n401)
	}
	// One more poll with faults still on, so a final failure would show.
	te.advance(time.Minute)
	at := te.clock.Now()
	_, got := te.scrape()
	truth(t, te.sim, envs, datasets, te.firstFrom, metricsapi.FiveMinutes.Truncate(at), at).check(t, got)
	t.Logf("%d answers 429, %d answers 401 (expired tokens)", n429, n401)
}
