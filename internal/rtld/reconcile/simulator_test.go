package reconcile

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
)

// TestTickChunksEnvironmentsAgainstSimulator reconciles 25 environments
// through the real Metrics API client against the simulator over HTTP. The
// API takes at most 20 environment_id values per request, so every window
// of due buckets is fetched in ⌈25/20⌉ = 2 requests, which together cover
// every environment once; each environment's buckets are compared with its
// own requests (one environment of the second chunk is one record short,
// and only it shows the loss).
func TestTickChunksEnvironmentsAgainstSimulator(t *testing.T) {
	const envCount = 25
	var mu sync.Mutex
	simNow := t0
	sim, err := platformsim.New(platformsim.Config{Seed: 19, Properties: 2, Environments: envCount, TrafficScale: 0.01,
		LateData: time.Minute, Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return simNow }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	base, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	unlimited := platform.Limits{Read: platform.RateLimit{Requests: -1}, Write: platform.RateLimit{Requests: -1}}
	pc, err := platform.New(platform.Config{BaseURL: base, AuthURL: base, ClientID: platformsim.DemoClientID,
		ClientSecret: platformsim.DemoClientSecret, RateLimits: map[string]platform.Limits{platform.ServiceMetrics: unlimited}})
	if err != nil {
		t.Fatal(err)
	}
	envs := sim.EnvironmentIDs()
	if len(envs) != envCount {
		t.Fatalf("the simulator has %d environments, want %d", len(envs), envCount)
	}
	w := newWorldWith(t, metricsapi.NewClient(pc.Metrics()), envs...)
	at := func(d time.Duration) {
		w.at(d)
		mu.Lock()
		simNow = t0.Add(d)
		mu.Unlock()
	}

	// The simulator's requests per environment and bucket of the first 20
	// minutes, as it will have settled them when they are due.
	col := slices.Index(sim.DatasetMetrics(dataset), metric)
	want := map[string]map[int64]int64{}
	for _, env := range envs {
		rows, err := sim.Rows(dataset, env, metricsapi.FiveMinutes, t0, t0.Add(20*time.Minute), t0.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		want[env] = map[int64]int64{}
		for _, row := range rows {
			want[env][row.Time.Unix()] += int64(row.Values[col])
		}
	}
	// One environment asked in the second request (the environments are
	// asked in order) is one record short in its bucket of 10:05.
	sorted := slices.Sorted(slices.Values(envs))
	short := ""
	for _, env := range sorted[metricsapi.MaxFilterValues:] {
		if want[env][t0.Add(step).Unix()] > 0 {
			short = env
			break
		}
	}
	if short == "" {
		t.Fatal("no environment of the second request has traffic at 10:05")
	}
	for _, env := range envs {
		w.steady(env, full, -2*time.Minute, 40*time.Minute)
		for d := time.Duration(0); d < 20*time.Minute; d += step {
			n := want[env][t0.Add(d).Unix()]
			if env == short && d == step {
				n--
			}
			if n > 0 {
				w.count(env, d, int(n))
			}
		}
	}

	w.tick() // started at t0
	checkWindow := func(name string, from, to time.Time) {
		t.Helper()
		var reqs []platformsim.DataRequest
		for _, d := range sim.Stats().Data {
			if d.Dataset == dataset {
				reqs = append(reqs, d)
			}
		}
		sim.ResetStats()
		if len(reqs) != 2 {
			t.Fatalf("%s: %d requests of %s, want ⌈%d/20⌉ = 2: %+v", name, len(reqs), dataset, envCount, reqs)
		}
		var asked []string
		for _, d := range reqs {
			if d.Status != 200 || len(d.Environments) > metricsapi.MaxFilterValues || !d.Start.Equal(from) || !d.End.Equal(to) {
				t.Errorf("%s: request status %d for %d environments over [%s, %s), want 200, at most %d, over [%s, %s)", name, d.Status,
					len(d.Environments), d.Start.Format("15:04"), d.End.Format("15:04"), metricsapi.MaxFilterValues, from.Format("15:04"), to.Format("15:04"))
			}
			asked = append(asked, d.Environments...)
		}
		if slices.Sort(asked); !slices.Equal(asked, sorted) {
			t.Errorf("%s: the requests asked for %v, want every environment once: %v", name, asked, sorted)
		}
	}
	// Due at 15, 20 and 25 minutes: the first three buckets in one window.
	at(26 * time.Minute)
	sim.ResetStats()
	w.tick()
	checkWindow("the first three buckets", t0, t0.Add(15*time.Minute))
	at(31 * time.Minute)
	w.tick()
	checkWindow("the fourth bucket", t0.Add(15*time.Minute), t0.Add(20*time.Minute))

	var total int64
	for _, env := range envs {
		var api int64
		for _, n := range want[env] {
			api += n
		}
		total += api
		records := api
		if env == short {
			records--
		}
		got := []float64{w.metric("buckets", env), w.metric("api", env), w.metric("records", env)}
		if got[0] != 4 || got[1] != float64(api) || got[2] != float64(records) {
			t.Errorf("%s: buckets, api, records = %v; want 4, %d, %d", env, got, api, records)
		}
	}
	if total == 0 {
		t.Fatal("the simulator counted no requests: nothing was compared")
	}
}
