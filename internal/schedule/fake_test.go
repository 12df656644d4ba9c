package schedule

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

var testDataset = metricsapi.Dataset{
	Name:              "edge_errors",
	TimeGranularities: []metricsapi.Granularity{metricsapi.FiveMinutes, metricsapi.Hour},
	Dimensions: []metricsapi.Dimension{
		{Name: "time", Type: metricsapi.TypeDate},
		{Name: "environment_id", Type: metricsapi.TypeString},
		{Name: "country_code", Type: metricsapi.TypeString},
	},
	Metrics: []metricsapi.Metric{{Name: "requests_edge_total", Type: metricsapi.TypeNumber}},
}

// fakeAPI is a Fetcher whose data is a mutable table of bucket values, so
// tests can revise buckets, fail calls and block a call in flight.
type fakeAPI struct {
	mu       sync.Mutex
	g        metricsapi.Granularity
	values   map[string]float64 // key env|country|unixnano
	queries  []metricsapi.Query
	requests int
	failNext int
	block    chan struct{} // when non-nil, Data waits on it after recording the query
	entered  chan struct{} // receives when a blocked call has started
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{g: metricsapi.FiveMinutes, values: make(map[string]float64)}
}

func bucketKey(env, country string, t time.Time) string {
	return fmt.Sprintf("%s|%s|%d", env, country, t.UnixNano())
}

// fill sets value v for every bucket in [from, to) of each env and country.
func (f *fakeAPI) fill(envs, countries []string, from, to time.Time, v func(env, country string, t time.Time) float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for t := f.g.Truncate(from); t.Before(to); t = t.Add(f.g.Duration()) {
		for _, e := range envs {
			for _, c := range countries {
				f.values[bucketKey(e, c, t)] = v(e, c, t)
			}
		}
	}
}

func (f *fakeAPI) set(env, country string, t time.Time, v float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.values[bucketKey(env, country, t)] = v
}

func (f *fakeAPI) Datasets(context.Context) ([]metricsapi.Dataset, error) {
	return []metricsapi.Dataset{testDataset}, nil
}

func (f *fakeAPI) Data(ctx context.Context, q metricsapi.Query) (*metricsapi.Result, error) {
	f.mu.Lock()
	f.queries = append(f.queries, q)
	n := (len(q.Environments) + metricsapi.MaxFilterValues - 1) / metricsapi.MaxFilterValues
	f.requests += n
	block, entered := f.block, f.entered
	if f.failNext > 0 {
		f.failNext--
		f.mu.Unlock()
		return &metricsapi.Result{Requests: n}, errors.New("fake: 503 service unavailable")
	}
	f.mu.Unlock()
	if block != nil {
		if entered != nil {
			entered <- struct{}{}
		}
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	res := &metricsapi.Result{Labels: []string{"country_code"}, Metrics: []string{"requests_edge_total"}, Requests: n}
	want := make(map[string]bool)
	for _, e := range q.Environments {
		want[e] = true
	}
	for k, v := range f.values {
		parts := splitKey(k)
		env, country := parts[0], parts[1]
		t := keyTime(parts)
		if !want[env] || t.Before(q.Start) || !t.Before(q.End) {
			continue
		}
		res.Rows = append(res.Rows, metricsapi.Row{Time: t, Environment: env, Labels: []string{country}, Values: []float64{v}})
	}
	return res, nil
}

// keyTime is the bucket start in the parts of a key (splitKey).
func keyTime(parts []string) time.Time {
	ns, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		panic(fmt.Sprintf("fake API: key %q: %v", parts, err)) // the fake writes its keys itself
	}
	return time.Unix(0, ns).UTC()
}

func splitKey(k string) []string {
	var out []string
	start := 0
	for i := 0; i < len(k); i++ {
		if k[i] == '|' {
			out = append(out, k[start:i])
			start = i + 1
		}
	}
	return append(out, k[start:])
}

// truth sums the fake's values over [from, to) per env|country.
func (f *fakeAPI) truth(from, to time.Time) map[string]float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]float64)
	for k, v := range f.values {
		p := splitKey(k)
		t := keyTime(p)
		if t.Before(from) || !t.Before(to) {
			continue
		}
		out[p[0]+"|"+p[1]] += v
	}
	return out
}

// counter is a Publisher that sums deltas like a Prometheus counter and
// remembers every update.
type counter struct {
	mu        sync.Mutex
	sums      map[string]float64
	seen      map[string]int // env|country|t → times published as first sighting
	revisions int
	batches   int
	envs      [][]string
	err       error
}

func newCounter() *counter {
	return &counter{sums: make(map[string]float64), seen: make(map[string]int)}
}

func (c *counter) Publish(_ context.Context, b *Batch) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batches++
	for _, u := range b.Updates {
		k := u.Row.Environment + "|" + u.Row.Labels[0]
		d := u.Row.Values[0]
		if u.Revision() {
			c.revisions++
			d -= u.Previous[0]
		} else {
			c.seen[bucketKey(u.Row.Environment, u.Row.Labels[0], u.Row.Time)]++
		}
		if !math.IsNaN(d) {
			c.sums[k] += d
		}
	}
	return c.err
}

func (c *counter) SetEnvironments(ids []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.envs = append(c.envs, ids)
}

func (c *counter) snapshot() (map[string]float64, map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := make(map[string]float64, len(c.sums))
	for k, v := range c.sums {
		s[k] = v
	}
	seen := make(map[string]int, len(c.seen))
	for k, v := range c.seen {
		seen[k] = v
	}
	return s, seen, c.revisions
}

type staticEnvs struct {
	mu   sync.Mutex
	envs []string
	err  error
}

func (s *staticEnvs) Environments(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.envs), s.err
}

func (s *staticEnvs) set(envs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.envs = envs
}

type recordingObserver struct {
	mu          sync.Mutex
	polls       []PollReport
	pubErrs     map[string]int
	discoveries []DiscoveryReport
}

func (o *recordingObserver) ObserveDiscovery(r DiscoveryReport) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.discoveries = append(o.discoveries, r)
}

func (o *recordingObserver) ObservePoll(r PollReport) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.polls = append(o.polls, r)
}

func (o *recordingObserver) ObservePublishError(_, sink string, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pubErrs == nil {
		o.pubErrs = make(map[string]int)
	}
	o.pubErrs[sink]++
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
