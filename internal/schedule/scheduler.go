// Package schedule polls the Metrics API: one loop per dataset, aligned to
// the poll interval, fetching every environment of the dataset in one query
// (which the client splits into ceil(environments/20) requests) and handing
// each new or revised bucket to the publishers (sinks).
//
// Correctness rests on the Tracker: per (dataset, environment) a
// HighWaterMark, the end of the newest bucket range fetched successfully.
// Each poll asks for [HighWaterMark − settle window, start of the current
// bucket): a failed or slow poll leaves the mark where it was, so the next
// one covers the gap, and buckets inside the settle window are compared
// with what was published before, so a bucket is published once per change
// and never counted twice. The bucket in progress is not fetched: its
// values are partial, its ratios and percentiles noisy, and its end lies in
// the future, which OTLP points and ClickHouse rows must not claim.
//
// Counting: the Tracker keeps per series the running totals of its counts
// (a first sighting adds its values, a revision its difference), which
// become Prometheus counters, and, with Config.Points, a point of every live
// series each time a poll's end passes a bucket boundary (OTLP sums; a
// revision between boundaries is folded into the next point). With
// Config.State the tracker is saved after every poll, before the poll's
// batch is published, and a restart Restores it: counting continues exactly.
// Without saved state the scheduler cannot tell a first start from a
// restart, so a Restart tracker makes the first poll of every environment a
// baseline: remembered, not counted.
//
// Time is the platform's: with a PlatformClock as Config.Clock, "now" (which
// buckets have ended, when polls are due) follows the Date headers of the
// API's answers, and a poll never counts a bucket as ended, nor moves a
// HighWaterMark past it, unless it ended before the newest Date the platform
// sent. A machine whose clock runs ahead therefore skips nothing, and one
// whose clock runs behind does not lag.
package schedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
)

// Defaults of Config.
const (
	DefaultPollInterval      = time.Minute
	DefaultDiscoveryInterval = 5 * time.Minute
	DefaultConcurrency       = 4
)

// DefaultSettleWindow returns the settle window used when none is configured:
// 30 minutes (6 buckets) for FIVE_MINUTES, 3 buckets for HOUR and DAY.
func DefaultSettleWindow(g metricsapi.Granularity) time.Duration {
	if g == metricsapi.FiveMinutes {
		return 30 * time.Minute
	}
	return 3 * g.Duration()
}

// NamedPublisher is a sink with the name its errors are reported under.
type NamedPublisher struct {
	Name      string
	Publisher Publisher
}

// Config configures a Scheduler. Datasets, Environments and Fetcher are
// required; zero values elsewhere take the documented defaults.
type Config struct {
	Granularity metricsapi.Granularity // default FIVE_MINUTES
	// PollInterval is how often each dataset is polled (default
	// DefaultPollInterval). Polls are aligned to multiples of it (UTC),
	// plus up to Jitter.
	PollInterval time.Duration
	// SettleWindow is how far before the HighWaterMark buckets are
	// re-fetched for late data; rounded up to whole buckets (default
	// DefaultSettleWindow).
	SettleWindow time.Duration
	// DiscoveryInterval is how often environments and dataset descriptors
	// are listed again (default DefaultDiscoveryInterval).
	DiscoveryInterval time.Duration
	// Concurrency bounds the polls running at once across datasets
	// (default DefaultConcurrency).
	Concurrency int
	// Jitter is the largest random delay added to each aligned poll time,
	// to spread load across instances; 0 means none.
	Jitter time.Duration
	// Datasets restricts polling to these dataset names; empty polls
	// every dataset that offers Granularity. A name the first successful
	// discovery does not find (or that does not offer Granularity) makes
	// Run fail; one that disappears later is logged at every discovery.
	Datasets []string

	// DatasetSource lists the datasets (required).
	DatasetSource DatasetSource
	// Environments lists the environments to serve (required).
	Environments EnvironmentSource
	// Fetcher runs the data queries (required).
	Fetcher Fetcher
	// Resume is optional; see ResumeSource.
	Resume ResumeSource
	// Publishers receive every batch.
	Publishers []NamedPublisher
	// Observer is told about polls (optional); if it also implements
	// DiscoveryObserver, about discoveries too.
	Observer Observer
	// Clock is the time polls are planned by (default RealClock). Pass a
	// *PlatformClock fed by the platform client to follow the platform's
	// clock; its newest Date then also bounds how far a poll counts
	// buckets as ended.
	Clock  Clock
	Logger *slog.Logger // default slog.Default()
	// Tracker is optional; a Scheduler creates NewTracker(Restart) when
	// nil. Pass NewTracker(FirstStart) when nothing was published before,
	// or a tracker Restored from a StateSaver's files.
	Tracker *Tracker
	// State, if set, receives the tracker's state of a dataset after every
	// successful poll, before the poll's batch is published (so a restart
	// from it never counts a published bucket again, and what a crash kept
	// from the sinks is republished).
	State StateSaver
	// Points asks for points: each time a poll's end passes the last point
	// of a live series, the batch carries the series' totals as a point at
	// that end (SeriesCounts.Point). OTLP sums need them; the Prometheus
	// collector does not.
	Points bool
	// SeriesTTL is how long the totals of a series are kept (and points
	// made for it) after its newest bucket, measured against the dataset's
	// newest bucket (default DefaultSeriesTTL).
	SeriesTTL time.Duration
}

// DefaultSeriesTTL is the default of Config.SeriesTTL.
const DefaultSeriesTTL = 24 * time.Hour

// Scheduler owns the poll loops, the discovery loop and the Tracker. Create
// it with New and call Run once.
type Scheduler struct {
	cfg     Config
	settle  time.Duration
	log     *slog.Logger
	obs     Observer
	clock   Clock
	tracker *Tracker
	sem     chan struct{}

	// loopsMu guards loops; it is held while loops stop, so a poll must
	// never take it.
	loopsMu sync.Mutex
	loops   map[string]*loop

	// envChange is held for writing while the environment set changes
	// (tracker and watchers) and for reading while a poll applies,
	// publishes and commits its result, so a poll that started before a
	// change never publishes or records a vanished environment.
	envChange sync.RWMutex

	mu         sync.Mutex
	envs       []string
	active     map[string]*metricsapi.Dataset // the descriptor each running loop polls
	ready      bool
	polledOK   map[string]bool
	discovered bool // a discovery has succeeded
}

// ErrUnknownDataset is returned by Run when a dataset named in
// Config.Datasets does not exist or does not offer the granularity.
var ErrUnknownDataset = errors.New("unknown dataset")

// ErrConfig marks an error of a source that retrying cannot cure (a
// configuration that does not fit what the platform offers): Run returns an
// error wrapping it at once instead of retrying the discovery.
var ErrConfig = errors.New("configuration error")

type loop struct {
	ds     *metricsapi.Dataset
	cancel context.CancelFunc
	done   chan struct{}
}

// withDefaults returns c with every unset field set to its default.
func (c Config) withDefaults() Config {
	if c.Granularity == "" {
		c.Granularity = metricsapi.FiveMinutes
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.SettleWindow == 0 {
		c.SettleWindow = DefaultSettleWindow(c.Granularity)
	}
	if c.DiscoveryInterval == 0 {
		c.DiscoveryInterval = DefaultDiscoveryInterval
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Clock == nil {
		c.Clock = RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Tracker == nil {
		c.Tracker = NewTracker(Restart)
	}
	if c.SeriesTTL == 0 {
		c.SeriesTTL = DefaultSeriesTTL
	}
	return c
}

// validate reports every setting of c (with defaults applied) that cannot
// work.
func (c Config) validate() error {
	var errs []error
	if c.DatasetSource == nil || c.Environments == nil || c.Fetcher == nil {
		errs = append(errs, errors.New("DatasetSource, Environments and Fetcher are required"))
	}
	if c.Granularity.Duration() == 0 {
		errs = append(errs, fmt.Errorf("unknown granularity %q", c.Granularity))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"PollInterval", c.PollInterval}, {"SettleWindow", c.SettleWindow}, {"DiscoveryInterval", c.DiscoveryInterval}, {"SeriesTTL", c.SeriesTTL}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %s: must be positive", d.name, d.v))
		}
	}
	if c.Jitter < 0 {
		errs = append(errs, fmt.Errorf("negative Jitter %s", c.Jitter))
	}
	if c.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("negative Concurrency %d", c.Concurrency))
	}
	for _, p := range c.Publishers {
		if p.Publisher == nil || p.Name == "" {
			errs = append(errs, errors.New("every publisher needs a name and a Publisher"))
			break
		}
	}
	return errors.Join(errs...)
}

// New checks cfg and returns a Scheduler.
func New(cfg Config) (*Scheduler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("schedule: invalid configuration: %w", err)
	}
	// The settle window in whole buckets, rounded up.
	d := cfg.Granularity.Duration()
	settle := cfg.SettleWindow.Truncate(d)
	if settle < cfg.SettleWindow {
		settle += d
	}
	return &Scheduler{
		cfg:      cfg,
		settle:   settle,
		log:      cfg.Logger,
		obs:      cfg.Observer,
		clock:    cfg.Clock,
		tracker:  cfg.Tracker,
		sem:      make(chan struct{}, cfg.Concurrency),
		loops:    make(map[string]*loop),
		active:   make(map[string]*metricsapi.Dataset),
		polledOK: make(map[string]bool),
	}, nil
}

// SettleWindow returns the settle window in effect (whole buckets).
func (s *Scheduler) SettleWindow() time.Duration { return s.settle }

// Ready reports whether discovery has succeeded and every dataset polled
// has completed at least one successful poll.
func (s *Scheduler) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}

// Environments returns the environments currently served.
func (s *Scheduler) Environments() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.envs)
}

// Run discovers environments and datasets, runs one poll loop per dataset
// and rediscovers every DiscoveryInterval, until ctx is done. It returns
// after every loop has stopped. Discovery failures are retried; Run returns
// ctx's error, an error wrapping ErrUnknownDataset when the first
// successful discovery does not offer every dataset of Config.Datasets, or
// an error wrapping ErrConfig from a source.
func (s *Scheduler) Run(ctx context.Context) error {
	defer s.stopAll()
	backoff := time.Second
	for {
		if err := s.discover(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, ErrUnknownDataset) || errors.Is(err, ErrConfig) {
				return err
			}
			s.log.Error("discovery failed", "err", err, "retry_in", backoff)
			if s.clock.Sleep(ctx, backoff) != nil {
				return ctx.Err()
			}
			backoff = min(2*backoff, s.cfg.DiscoveryInterval)
			continue
		}
		backoff = time.Second
		if s.clock.Sleep(ctx, s.cfg.DiscoveryInterval) != nil {
			return ctx.Err()
		}
	}
}

// discover lists environments and datasets and reconciles the loops:
// new datasets start, vanished ones stop, changed descriptors restart
// (the Tracker keeps their state, so nothing is counted twice).
func (s *Scheduler) discover(ctx context.Context) error {
	polled, err := s.discoverOnce(ctx)
	s.mu.Lock()
	n := len(s.envs)
	s.mu.Unlock()
	do, _ := s.obs.(DiscoveryObserver)
	if err != nil {
		if do != nil {
			do.ObserveDiscovery(DiscoveryReport{Err: err, Environments: n})
		}
		return err
	}
	if do != nil {
		do.ObserveDiscovery(DiscoveryReport{Environments: n, Datasets: polled})
	}
	s.checkClock()
	return nil
}

// discoverOnce does the work of discover and returns the datasets polled.
func (s *Scheduler) discoverOnce(ctx context.Context) ([]string, error) {
	envs, err := s.cfg.Environments.Environments(ctx)
	if err != nil {
		return nil, fmt.Errorf("discover environments: %w", err)
	}
	envs = slices.Clone(envs)
	slices.Sort(envs)
	envs = slices.Compact(envs)
	datasets, err := s.cfg.DatasetSource.Datasets(ctx)
	if err != nil {
		return nil, fmt.Errorf("list datasets: %w", err)
	}
	want, err := s.wanted(datasets)
	if err != nil {
		return nil, err
	}

	s.mu.Lock()
	changed := !slices.Equal(s.envs, envs) || s.envs == nil
	s.mu.Unlock()
	if changed {
		s.envChange.Lock()
		s.mu.Lock()
		s.envs = envs
		s.mu.Unlock()
		s.tracker.Retain(envs)
		for _, p := range s.cfg.Publishers {
			if w, ok := p.Publisher.(EnvironmentWatcher); ok {
				w.SetEnvironments(slices.Clone(envs))
			}
		}
		s.envChange.Unlock()
		s.log.Info("environments discovered", "count", len(envs))
	}

	s.loopsMu.Lock()
	defer s.loopsMu.Unlock()
	for name, l := range s.loops {
		if nd, ok := want[name]; ok && sameDescriptor(l.ds, nd) {
			continue
		}
		l.cancel()
		<-l.done
		delete(s.loops, name)
		s.mu.Lock()
		delete(s.active, name)
		delete(s.polledOK, name)
		s.mu.Unlock()
		if _, ok := want[name]; !ok {
			s.log.Info("dataset gone; loop stopped", "dataset", name)
		} else {
			s.log.Info("dataset descriptor changed; loop restarted", "dataset", name)
		}
	}
	polled := make([]string, 0, len(want))
	for name, ds := range want {
		polled = append(polled, name)
		if _, ok := s.loops[name]; ok {
			continue
		}
		s.startLoopLocked(ctx, ds)
	}
	slices.Sort(polled)
	s.mu.Lock()
	s.discovered = true
	s.updateReadyLocked()
	s.mu.Unlock()
	return polled, nil
}

// wanted picks the datasets to poll from those listed (ChooseDatasets). A
// dataset named in Config.Datasets that is not listed, or does not offer
// the granularity, is an error wrapping ErrUnknownDataset at the first
// successful discovery (a typo must not leave the exporter silently
// exporting nothing) and a warning at later ones (the platform may withdraw
// a dataset).
func (s *Scheduler) wanted(datasets []metricsapi.Dataset) (map[string]*metricsapi.Dataset, error) {
	c := ChooseDatasets(datasets, s.cfg.Datasets, s.cfg.Granularity)
	for _, name := range c.Unoffered {
		s.log.Warn("dataset does not offer the granularity; not polled", "dataset", name, "granularity", s.cfg.Granularity)
	}
	err := c.Err()
	if err == nil {
		return c.Want, nil
	}
	s.mu.Lock()
	first := !s.discovered
	s.mu.Unlock()
	if first {
		return nil, err
	}
	s.log.Warn("configured datasets are not offered by the platform (any more); not polled",
		"missing", c.Missing, "granularity", s.cfg.Granularity, "available", c.Available)
	return c.Want, nil
}

// DatasetChoice is what ChooseDatasets picked.
type DatasetChoice struct {
	// Want are the datasets to poll, by name.
	Want map[string]*metricsapi.Dataset
	// Unoffered are the datasets listed that do not offer the granularity,
	// among those named (every one when none is named).
	Unoffered []string
	// Missing are the names not listed, or listed without the granularity.
	Missing []string
	// Available are the names of the datasets offering the granularity,
	// sorted.
	Available []string

	granularity metricsapi.Granularity
}

// ChooseDatasets picks, from the datasets listed, those polled at g: the
// ones named (every one when names is empty) that offer g.
func ChooseDatasets(datasets []metricsapi.Dataset, names []string, g metricsapi.Granularity) DatasetChoice {
	c := DatasetChoice{Want: make(map[string]*metricsapi.Dataset), granularity: g}
	for i := range datasets {
		ds := &datasets[i]
		if !ds.Supports(g) {
			if slices.Contains(names, ds.Name) || len(names) == 0 {
				c.Unoffered = append(c.Unoffered, ds.Name)
			}
			continue
		}
		c.Available = append(c.Available, ds.Name)
		if len(names) > 0 && !slices.Contains(names, ds.Name) {
			continue
		}
		c.Want[ds.Name] = ds
	}
	for _, name := range names {
		if c.Want[name] == nil && !slices.Contains(c.Missing, name) {
			c.Missing = append(c.Missing, name)
		}
	}
	slices.Sort(c.Available)
	return c
}

// Err is nil when every dataset named is polled, else an error wrapping
// ErrUnknownDataset that names the missing ones and those available.
func (c DatasetChoice) Err() error {
	if len(c.Missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w %s: the platform offers these datasets at %s: %s",
		ErrUnknownDataset, strings.Join(quoteAll(c.Missing), ", "), c.granularity, strings.Join(c.Available, ", "))
}

func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = strconv.Quote(n)
	}
	return out
}

// checkClock warns when the platform's clock and the local clock differ by
// more than the settle window: polling follows the platform's clock, but
// whatever else reads the local clock (logs, Prometheus's scrape times)
// is that far off.
func (s *Scheduler) checkClock() {
	pc, ok := s.clock.(*PlatformClock)
	if !ok {
		return
	}
	skew, ok := pc.Skew()
	if !ok || skew.Abs() <= s.settle {
		return
	}
	s.log.Warn("the platform's clock and this machine's differ by more than the settle window; "+
		"polls follow the platform's clock (Date header), check NTP on this machine",
		"skew", skew.Round(time.Second), "settle_window", s.settle)
}

// startLoopLocked starts the poll loop of ds; s.loopsMu must be held.
func (s *Scheduler) startLoopLocked(ctx context.Context, ds *metricsapi.Dataset) {
	lctx, cancel := context.WithCancel(ctx)
	l := &loop{ds: ds, cancel: cancel, done: make(chan struct{})}
	s.loops[ds.Name] = l
	s.mu.Lock()
	s.active[ds.Name] = ds
	s.mu.Unlock()
	go func() {
		defer close(l.done)
		s.runLoop(lctx, ds)
	}()
}

func (s *Scheduler) updateReadyLocked() {
	ready := len(s.active) > 0
	for name := range s.active {
		if !s.polledOK[name] {
			ready = false
		}
	}
	s.ready = ready
}

func (s *Scheduler) stopAll() {
	s.loopsMu.Lock()
	defer s.loopsMu.Unlock()
	for _, l := range s.loops {
		l.cancel()
	}
	for name, l := range s.loops {
		<-l.done
		delete(s.loops, name)
	}
	s.mu.Lock()
	clear(s.active)
	s.ready = false
	s.mu.Unlock()
}

// runLoop polls ds now and then once per cycle, at every multiple of the
// poll interval (plus jitter), until ctx is done. A poll that overruns
// simply makes the loop skip the cycles it missed: the HighWaterMark covers
// the gap.
func (s *Scheduler) runLoop(ctx context.Context, ds *metricsapi.Dataset) {
	cycle := s.clock.Now().Truncate(s.cfg.PollInterval)
	for {
		s.pollOnce(ctx, ds, cycle)
		if ctx.Err() != nil {
			return
		}
		now := s.clock.Now()
		cycle = nextCycle(cycle, now, s.cfg.PollInterval)
		due := cycle
		if s.cfg.Jitter > 0 {
			due = due.Add(rand.N(s.cfg.Jitter))
		}
		if s.clock.Sleep(ctx, due.Sub(now)) != nil {
			return
		}
	}
}

// nextCycle returns the start of the poll cycle after the one starting at
// cycle, now being the time after its poll: cycle + interval, or the first
// multiple of interval after now when the poll overran that (or the clock
// went back by more than half an interval).
//
// It counts from the cycle, not from now, because now is the platform's
// time as estimated from Date headers, which carry whole seconds: the
// estimate moves by up to a second as answers come in. A loop woken at
// 10:03:00 by one estimate reads 10:02:59.6 after its poll by the next;
// counted from now, it would poll the 10:03 cycle a second time, a whole
// poll of extra requests.
func nextCycle(cycle, now time.Time, interval time.Duration) time.Time {
	next := cycle.Add(interval)
	if !now.Before(next) || next.Sub(now) > interval+interval/2 {
		return now.Truncate(interval).Add(interval)
	}
	return next
}

// pollOnce runs the poll of ds of the cycle starting at cycle under the
// concurrency bound.
func (s *Scheduler) pollOnce(ctx context.Context, ds *metricsapi.Dataset, cycle time.Time) {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-s.sem }()
	r := s.Poll(ctx, ds)
	if r.Err != nil && ctx.Err() != nil {
		return // shutting down: not a failure worth reporting
	}
	s.obs.ObservePoll(r)
	if r.Err != nil {
		s.log.Warn("poll failed; the next poll covers the gap", "dataset", ds.Name, "err", r.Err,
			"from", r.From, "to", r.To)
		return
	}
	s.logProblems(r)
	s.log.Debug("polled", "dataset", ds.Name, "cycle", cycle, "from", r.From, "to", r.To, "envs", r.Environments,
		"requests", r.Requests, "rows", r.Rows, "new", r.New, "revisions", r.Revisions,
		"baseline", r.Baseline, "replayed", r.Replayed, "took", r.Duration)
	s.mu.Lock()
	if s.active[ds.Name] == ds {
		s.polledOK[ds.Name] = true
		s.updateReadyLocked()
	}
	s.mu.Unlock()
}

// Poll runs one poll of ds for the current environments and publishes what
// changed. Run's loops call it; it is exported so callers that drive their
// own timing (tests, one-shot tools) can use the same logic.
func (s *Scheduler) Poll(ctx context.Context, ds *metricsapi.Dataset) PollReport {
	start := s.clock.Now()
	began := s.localNow()
	g := s.cfg.Granularity
	r := PollReport{Dataset: ds.Name, Start: start}
	envs := s.Environments()
	r.Environments = len(envs)
	if len(envs) == 0 {
		return r
	}
	to := g.Truncate(start)
	var notBefore time.Time
	if ret := ds.Retention.For(g); ret > 0 {
		// A bucket older than the retention is gone; one bucket of margin
		// keeps the range clear of the boundary.
		notBefore = g.Truncate(start.Add(-ret)).Add(g.Duration())
	}
	if s.cfg.Resume != nil {
		if need := s.tracker.needResume(ds.Name, envs); len(need) > 0 {
			points, err := s.cfg.Resume.Resume(ctx, ds, g, need)
			if err != nil {
				if ctx.Err() != nil {
					r.Err = ctx.Err()
					return r
				}
				s.log.Warn("resume points unavailable; starting these environments at the settle window",
					"dataset", ds.Name, "environments", len(need), "err", err)
				points = nil
			}
			s.tracker.setResume(ds.Name, need, points)
		}
	}
	floors := s.tracker.floors(ds.Name, envs, to, s.settle, notBefore)
	from := to
	for _, f := range floors {
		if f.Before(from) {
			from = f
		}
	}
	r.From, r.To = from, to
	if !from.Before(to) {
		return r
	}
	// The descriptor's dimensions and metrics, explicitly: a descriptor
	// chosen by a selection (metricsapi.Dataset.Select) has fewer than the
	// platform's, and the API aggregates the dimensions left out.
	res, err := s.cfg.Fetcher.Data(ctx, metricsapi.Query{
		Dataset:      ds.Name,
		Environments: envs,
		Granularity:  g,
		Start:        from,
		End:          to,
		Labels:       ds.LabelNames(),
		Metrics:      ds.MetricNames(),
	})
	if res != nil {
		r.Requests = res.Requests
	}
	if err != nil {
		r.Err = fmt.Errorf("fetch %s [%s, %s) for %d environments: %w", ds.Name,
			from.Format(time.RFC3339), to.Format(time.RFC3339), len(envs), err)
		r.Duration = s.localNow().Sub(began)
		return r
	}
	// The platform's newest Date bounds what counts as ended: a bucket
	// that ends after it may still be in progress there, so it is left for
	// a later poll and the HighWaterMark stays before it.
	end := to
	if pc, ok := s.clock.(*PlatformClock); ok {
		if latest, ok := pc.Latest(); ok && g.Truncate(latest).Before(end) {
			end = g.Truncate(latest)
		}
	}
	r.To = end
	r.Problems = res.Problems
	s.envChange.RLock()
	defer s.envChange.RUnlock()
	pr := s.tracker.apply(ds.Name, res, floors, end, applyOptions{
		width: g.Duration(), settle: s.settle, ttl: s.cfg.SeriesTTL, points: s.cfg.Points})
	r.Rows, r.New, r.Revisions = pr.rows, pr.newOnes, pr.revisions
	r.Decreases, r.Deferred, r.Held = pr.decreases, pr.deferred, pr.held
	r.Baseline, r.Replayed = pr.baseline, pr.replays
	if !pr.newest.IsZero() {
		r.NewestBucketEnd = pr.newest.Add(g.Duration())
	}
	s.tracker.commit(ds.Name, envs, end, s.settle, s.cfg.SeriesTTL)
	// Saved before publishing: after a crash the state never lags what
	// the sinks were given, so a restart never counts a bucket twice.
	if s.cfg.State != nil {
		state, err := s.tracker.Snapshot(ds.Name)
		if err == nil {
			err = s.cfg.State.Save(ds.Name, state)
		}
		if err != nil {
			r.StateErr = fmt.Errorf("save the state of %s: %w", ds.Name, err)
		}
	}
	if len(pr.updates) > 0 || len(pr.counts) > 0 {
		b := &Batch{Dataset: ds, Granularity: g, Labels: res.Labels, Metrics: res.Metrics,
			Updates: pr.updates, Counts: pr.counts, End: end}
		for _, p := range s.cfg.Publishers {
			if err := p.Publisher.Publish(ctx, b); err != nil {
				s.obs.ObservePublishError(ds.Name, p.Name, err)
				s.log.Error("publish failed", "dataset", ds.Name, "sink", p.Name, "err", err)
			}
		}
	}
	r.Duration = s.localNow().Sub(began)
	return r
}

// localNow is this machine's clock, which durations are measured on: the
// platform's clock moves by the skew estimate between two readings.
func (s *Scheduler) localNow() time.Time {
	if pc, ok := s.clock.(*PlatformClock); ok {
		return pc.local.Now()
	}
	return s.clock.Now()
}

// logProblems logs, once per poll, what the poll had to leave out, with an
// example of each.
func (s *Scheduler) logProblems(r PollReport) {
	if n := r.Problems.InvalidValues(); n > 0 {
		s.log.Warn("the platform sent metric values that are not numbers; buckets keep their last good value, "+
			"and new buckets wait until every count has one",
			"dataset", r.Dataset, "values", n, "by_reason", r.Problems.Values, "example", r.Problems.ValueExample,
			"new_buckets_held", r.Held)
	}
	if n := r.Problems.InvalidRows(); n > 0 {
		s.log.Warn("the platform sent malformed rows; they were skipped and the rest of the answer used",
			"dataset", r.Dataset, "rows", n, "by_reason", r.Problems.Rows, "example", r.Problems.RowExample)
	}
	if r.Deferred > 0 {
		s.log.Info("rows of buckets that had not ended by the platform's clock; left for the next poll",
			"dataset", r.Dataset, "rows", r.Deferred, "poll_end", r.To)
	}
	if r.Decreases > 0 {
		s.log.Info("revisions lowered counts already published; not applied",
			"dataset", r.Dataset, "values", r.Decreases)
	}
	if r.Baseline > 0 {
		s.log.Info("baseline: the first poll of these environments since start is remembered, not counted",
			"dataset", r.Dataset, "buckets", r.Baseline)
	}
	if r.StateErr != nil {
		s.log.Error("state not saved; a restart now would resume from an older state", "dataset", r.Dataset, "err", r.StateErr)
	}
}

// sameDescriptor reports whether two descriptors would be polled and
// published alike.
func sameDescriptor(a, b *metricsapi.Dataset) bool {
	return a.Name == b.Name &&
		slices.Equal(a.Dimensions, b.Dimensions) &&
		slices.Equal(a.Metrics, b.Metrics) &&
		slices.Equal(a.TimeGranularities, b.TimeGranularities) &&
		a.Retention == b.Retention
}
