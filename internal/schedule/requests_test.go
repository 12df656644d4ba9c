package schedule

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/schedule/fakeclock"
)

// simStack is a Scheduler polling the platform simulator over loopback
// through the real platform and metricsapi clients, as the exporter does:
// planned by a PlatformClock that learns the platform's time from the Date
// headers, on top of a fake local clock that the simulator shares.
type simStack struct {
	sim   *platformsim.Server
	clock *fakeclock.Clock
	obs   *recordingObserver
	// loops is the number of sleepers at rest: one per dataset plus the
	// discovery loop.
	loops int
}

// simInterval is the poll interval of the simStack tests.
const simInterval = time.Minute

// startSimStack starts a simulator of envs environments and a scheduler
// polling every dataset of it for all of them, and waits for the first polls.
// wrap, when not nil, wraps the HTTP transport of the platform client.
func startSimStack(t *testing.T, envs int, wrap func(*fakeclock.Clock, http.RoundTripper) http.RoundTripper) *simStack {
	t.Helper()
	clock := fakeclock.New(time.Date(2026, 11, 23, 10, 2, 30, 0, time.UTC))
	sim, err := platformsim.New(platformsim.Config{Seed: 1, Properties: 10, Environments: envs, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	base, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	pc := NewPlatformClock(clock)
	var transport http.RoundTripper = http.DefaultTransport.(*http.Transport).Clone()
	if wrap != nil {
		transport = wrap(clock, transport)
	}
	// Hours of the fake clock pass in seconds: no client-side budget.
	unlimited := platform.Limits{Read: platform.RateLimit{Requests: -1}, Write: platform.RateLimit{Requests: -1}}
	pl, err := platform.New(platform.Config{BaseURL: base, AuthURL: base,
		ClientID: platformsim.DemoClientID, ClientSecret: platformsim.DemoClientSecret,
		HTTPClient: &http.Client{Transport: transport}, DateObserver: pc,
		RateLimits: map[string]platform.Limits{platform.ServiceMetrics: unlimited, platform.ServiceAccounts: unlimited}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pl.CloseIdleConnections)
	api := metricsapi.NewClient(pl.Metrics())
	st := &simStack{sim: sim, clock: clock, obs: &recordingObserver{}, loops: len(sim.DatasetNames()) + 1}
	s, err := New(Config{
		PollInterval:  simInterval,
		DatasetSource: api,
		Environments:  &staticEnvs{envs: sim.EnvironmentIDs()},
		Fetcher:       api,
		Observer:      st.obs,
		Clock:         pc,
		Logger:        quietLogger(),
		Tracker:       NewTracker(FirstStart),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
	st.settle(t)
	return st
}

// settle waits until every loop sleeps.
func (st *simStack) settle(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := st.clock.BlockUntil(ctx, st.loops); err != nil {
		t.Fatalf("loops did not settle at %s (%d of %d sleeping)", st.clock.Now(), st.clock.Sleepers(), st.loops)
	}
}

// runUntil lets the time pass as it does for a running exporter: each loop
// wakes exactly when its sleep ends, one wake-up after the other, until end.
func (st *simStack) runUntil(t *testing.T, end time.Time) {
	t.Helper()
	for {
		st.settle(t)
		w, ok := st.clock.NextWake()
		if !ok || w.After(end) {
			st.clock.Set(end)
			return
		}
		st.clock.Set(w)
	}
}

// checkPolls checks every poll observed: it succeeded, covered every
// environment, took ceil(envs/20) requests, exactly the data requests the
// simulator received for its dataset, and asked from where the one before
// ended minus the settle window; it returns the polls by dataset.
func (st *simStack) checkPolls(t *testing.T) map[string][]PollReport {
	t.Helper()
	envs := len(st.sim.EnvironmentIDs())
	per := (envs + metricsapi.MaxFilterValues - 1) / metricsapi.MaxFilterValues
	st.obs.mu.Lock()
	polls := make(map[string][]PollReport)
	for _, r := range st.obs.polls {
		polls[r.Dataset] = append(polls[r.Dataset], r)
		if r.Err != nil || r.Environments != envs || r.Requests != per {
			t.Errorf("poll of %s at %s: %d environments, %d requests, err %v; want %d, %d, nil",
				r.Dataset, r.Start, r.Environments, r.Requests, r.Err, envs, per)
		}
	}
	st.obs.mu.Unlock()
	sent := make(map[string]int)
	for _, d := range st.sim.Stats().Data {
		sent[d.Dataset]++
		if d.Status != http.StatusOK {
			t.Errorf("a data request of %s was answered %d", d.Dataset, d.Status)
		}
	}
	for _, ds := range st.sim.DatasetNames() {
		if want := per * len(polls[ds]); sent[ds] != want {
			t.Errorf("%s: the simulator received %d data requests for %d polls, want %d", ds, sent[ds], len(polls[ds]), want)
		}
		// Every environment's high-water mark moved with the poll, also
		// where the dataset had no rows for it (the simulator's error
		// datasets have rows for some environments only): no old floor
		// widens the range.
		for i, p := range polls[ds] {
			if i > 0 && !p.From.Equal(polls[ds][i-1].To.Add(-DefaultSettleWindow(metricsapi.FiveMinutes))) {
				t.Errorf("%s: poll at %s asked from %s, want the previous poll's end %s minus the settle window", ds, p.Start, p.From, polls[ds][i-1].To)
			}
		}
	}
	return polls
}

// TestRequestsPerCycleAtTheAPIMinimum is issue 20's request count: at 200
// environments every poll cycle (each minute) makes 6 datasets × ceil(200/20)
// data requests, counted where they arrive, the simulator. The loops wake at
// the minute as the platform's clock estimates it; that estimate (Date
// headers carry whole seconds) moves by up to a second with every answer, so
// a poll woken at 10:03:00 by one estimate may end at 10:02:59.6 by the
// next, which must not make the loop poll the 10:03 cycle a second time.
func TestRequestsPerCycleAtTheAPIMinimum(t *testing.T) {
	st := startSimStack(t, 200, nil)
	first := st.clock.Now()
	end := first.Truncate(simInterval).Add(3*simInterval + simInterval/2) // cycles at 10:02:30, 10:03, 10:04, 10:05
	st.runUntil(t, end)
	polls := st.checkPolls(t)

	cycles := 4
	want := len(st.sim.DatasetNames()) * 10
	perCycle := make(map[time.Time]int)
	for _, d := range st.sim.Stats().Data {
		// The cycle of the minute that starts within a second: a loop
		// wakes when the platform's clock, as estimated, reaches it.
		perCycle[d.At.Add(time.Second).Truncate(simInterval)]++
	}
	for c := range cycles {
		at := first.Truncate(simInterval).Add(time.Duration(c) * simInterval)
		if perCycle[at] != want {
			t.Errorf("cycle %s: %d data requests at the simulator, want 6 datasets × ceil(200/20) = %d", at.Format("15:04"), perCycle[at], want)
		}
		delete(perCycle, at)
	}
	for at, n := range perCycle {
		t.Errorf("%d data requests outside the cycles, at %s", n, at.Format("15:04:05"))
	}
	for ds, ps := range polls {
		if len(ps) != cycles {
			t.Errorf("%s polled %d times in %d cycles", ds, len(ps), cycles)
		}
	}
}

// TestRequestsPerCycleWhenPollsOverrun is the same count when every poll
// takes longer than the poll interval: the simulator answers each data
// request 5 s later (on the shared clock), so a poll of 10 requests, two at a
// time and four polls at once, takes minutes. A loop then skips the cycles it
// missed and its next poll covers the gap, still in ceil(200/20) requests.
func TestRequestsPerCycleWhenPollsOverrun(t *testing.T) {
	slow := &slowData{latency: 5 * time.Second}
	st := startSimStack(t, 200, func(c *fakeclock.Clock, next http.RoundTripper) http.RoundTripper {
		slow.clock, slow.next = c, next
		return slow
	})
	end := st.clock.Now().Add(12 * time.Minute)
	slow.until.Store(end.UnixNano())
	st.runUntil(t, end)
	polls := st.checkPolls(t)
	var overran bool
	for ds, ps := range polls {
		if len(ps) < 3 {
			t.Errorf("%s polled %d times in 12 minutes", ds, len(ps))
		}
		for i, p := range ps {
			overran = overran || p.Duration > simInterval
			if i > 0 && p.Start.Sub(ps[i-1].Start) < ps[i-1].Duration {
				t.Errorf("%s: poll at %s began before the one at %s had ended", ds, p.Start, ps[i-1].Start)
			}
		}
	}
	if !overran {
		t.Error("no poll took longer than the poll interval")
	}
}

// slowData delays each data request by latency on the fake clock, before it
// reaches the simulator (the platform answers it that much later), while
// the clock reads before until (Unix ns; 0, as during the first polls: no
// delay); after it, the polls in flight end and the loops come to rest.
type slowData struct {
	clock   *fakeclock.Clock
	latency time.Duration
	until   atomic.Int64
	next    http.RoundTripper
}

func (s *slowData) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/data") {
		if u := s.until.Load(); u != 0 && s.clock.Now().UnixNano() < u {
			s.clock.Advance(s.latency)
		}
	}
	return s.next.RoundTrip(r)
}

func TestNextCycle(t *testing.T) {
	at := func(hms string) time.Time {
		tm, err := time.Parse("15:04:05.000", hms)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, tt := range []struct {
		name       string
		cycle, now string
		want       string
	}{
		{"poll within its cycle", "10:03:00.000", "10:03:02.000", "10:04:00.000"},
		{"the estimate moved back across the boundary", "10:03:00.000", "10:02:59.600", "10:04:00.000"},
		{"the estimate moved forward", "10:03:00.000", "10:03:00.900", "10:04:00.000"},
		{"poll ended just before the next cycle", "10:03:00.000", "10:03:59.999", "10:04:00.000"},
		{"poll overran into the next cycle", "10:03:00.000", "10:04:00.000", "10:05:00.000"},
		{"poll overran several cycles", "10:03:00.000", "10:06:30.000", "10:07:00.000"},
		{"the clock went back by minutes", "10:03:00.000", "10:00:10.000", "10:01:00.000"},
		{"the clock went back by less than half an interval", "10:03:00.000", "10:02:35.000", "10:04:00.000"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := nextCycle(at(tt.cycle), at(tt.now), time.Minute); !got.Equal(at(tt.want)) {
				t.Errorf("nextCycle(%s, %s) = %s, want %s", tt.cycle, tt.now, got.Format("15:04:05.000"), tt.want)
			}
		})
	}
}
