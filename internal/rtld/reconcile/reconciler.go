package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
)

// Where record counts come from.
const (
	// CountsSpool counts the records each replica spooled (one replica).
	CountsSpool = "spool"
	// CountsClickHouse counts access_logs under FINAL (any number of
	// replicas writing one table; one of them compares).
	CountsClickHouse = "clickhouse"
)

// Defaults of Config.
const (
	// DefaultDelay is how long after a bucket ends it is compared: the
	// Metrics API's values settle within minutes, and a batch the receiver
	// refused or missed is resent at the platform's retry interval.
	DefaultDelay = 30 * time.Minute
	// DefaultInterval is how often due buckets are looked for.
	DefaultInterval = 30 * time.Second
	// DefaultGiveUpAfter is how long a due bucket waits for the Metrics
	// API, the profile's state or ClickHouse before it is skipped.
	DefaultGiveUpAfter = 6 * time.Hour
)

// MetricsAPI is what the reconciliation needs of the Metrics API
// (*metricsapi.Client).
type MetricsAPI interface {
	Dataset(ctx context.Context, name string) (*metricsapi.Dataset, error)
	Data(ctx context.Context, q metricsapi.Query) (*metricsapi.Result, error)
}

// ClickHouseConfig names the ClickHouse server and database of the
// log_completeness table (and, with ClickHouse counts, of access_logs).
type ClickHouseConfig struct {
	DSN     string
	Options []clickhouse.Option
	// Reader is the spool reader of the receiver's ClickHouse sink: its
	// progress is what this replica reports (ClickHouse counts).
	Reader string
	// Schemas, when set, is that sink: its connection and schema manager
	// serve the reconciliation too (DSN and Options are then unused), so
	// its tables are rechecked and counted in
	// edgepipe_clickhouse_incomplete_nodes with the sink's. Without it the
	// reconciliation opens its own connection (its tables rechecked, not
	// counted).
	Schemas SchemaSource
}

// Config configures a Reconciler.
type Config struct {
	// EnvironmentIDs are the environments to reconcile.
	EnvironmentIDs []string
	// Delay is how long after a bucket ends it is compared (DefaultDelay).
	Delay time.Duration
	// Interval is how often due buckets are looked for (DefaultInterval).
	Interval time.Duration
	// GiveUpAfter bounds how long a due bucket waits (DefaultGiveUpAfter).
	GiveUpAfter time.Duration
	// Counts is CountsSpool (default) or CountsClickHouse.
	Counts string
	// Dir holds the state file (the spool directory).
	Dir string
	// ClickHouse, when set, receives the log_completeness table (required
	// with CountsClickHouse).
	ClickHouse *ClickHouseConfig
	// Replica names this receiver among the replicas (default: the host
	// name); Leader names the one that compares ("": this one).
	Replica, Leader string
	// Metrics is the Metrics API (app.metrics scope).
	Metrics MetricsAPI
	// Clock follows the platform's time; it must be the DateObserver of
	// the platform client behind Metrics and the profile calls.
	Clock *PlatformTime
	// ProfileName is the receiver's profile name; Destination, when set,
	// returns its destination_endpoint in an environment (a profile posting
	// elsewhere does not deliver here). Without it any destination counts.
	ProfileName string
	Destination func(env string) string
	// Registerer receives the metrics (none when nil).
	Registerer prometheus.Registerer
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Delay == 0 {
		c.Delay = DefaultDelay
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.GiveUpAfter == 0 {
		c.GiveUpAfter = DefaultGiveUpAfter
	}
	if c.Counts == "" {
		c.Counts = CountsSpool
	}
	if c.Replica == "" {
		c.Replica, _ = os.Hostname()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if len(c.EnvironmentIDs) == 0 {
		errs = append(errs, errors.New("no environments"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"delay", c.Delay}, {"interval", c.Interval}, {"give-up time", c.GiveUpAfter}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %s: must be positive", d.name, d.v))
		}
	}
	switch c.Counts {
	case CountsSpool:
		if c.Leader != "" && c.Leader != c.Replica {
			errs = append(errs, errors.New("a leader replica needs ClickHouse counts: each replica spools only part of the records"))
		}
	case CountsClickHouse:
		if c.ClickHouse == nil || c.ClickHouse.Reader == "" {
			errs = append(errs, errors.New("ClickHouse counts need ClickHouse and its sink's spool reader"))
		}
	default:
		errs = append(errs, fmt.Errorf("counts %q: want %s or %s", c.Counts, CountsSpool, CountsClickHouse))
	}
	if c.Replica == "" {
		errs = append(errs, errors.New("no replica name"))
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("no state directory"))
	}
	if c.Metrics == nil || c.Clock == nil || c.ProfileName == "" {
		errs = append(errs, errors.New("the Metrics API, the platform clock and the profile's name are required"))
	}
	return errors.Join(errs...)
}

// Reconciler compares each environment's accepted log records, bucket by
// bucket, with the requests the Metrics API counted. Create it with New,
// give Tap to the registrar, and call Run once.
type Reconciler struct {
	cfg     Config
	log     *slog.Logger
	store   *store
	metrics *metrics
	ch      *chClient // nil without ClickHouse

	// lostAtOpen: the state file was damaged; every bucket before the
	// first tick is marked lost then.
	lostAtOpen bool
	// upSince is the platform's time at the first tick: buckets that
	// ended before it are compared Delay after it, once the platform has
	// resent what it could not deliver while the receiver was down.
	upSince time.Time
	// forbidden is set while the Metrics API refuses the client's scope.
	mu        sync.Mutex
	forbidden bool
	// lastRecount is when ClickHouse counts were last taken again for
	// late records.
	lastRecount time.Time
}

// New validates cfg and opens the state.
func New(cfg Config) (*Reconciler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("reconcile: invalid configuration: %w", err)
	}
	envs := slices.Clone(cfg.EnvironmentIDs)
	slices.Sort(envs)
	cfg.EnvironmentIDs = slices.Compact(envs)
	st, lost, err := openStore(cfg.Dir, cfg.EnvironmentIDs)
	if err != nil {
		return nil, err
	}
	r := &Reconciler{cfg: cfg, log: cfg.Logger, store: st, lostAtOpen: lost}
	if lost {
		r.log.Error("reconcile: the state file was damaged; buckets before now are not compared (skipped with reason=counts_lost)", "file", st.path)
	}
	if cfg.ClickHouse != nil {
		r.ch = newCHClient(*cfg.ClickHouse, cfg.Replica, cfg.Logger)
	}
	if r.Compares() && cfg.Registerer != nil {
		r.metrics = newMetrics(cfg.Registerer, cfg.EnvironmentIDs, st)
	}
	return r, nil
}

// Compares reports whether this replica compares (it is the leader, or
// there is none).
func (r *Reconciler) Compares() bool { return r.cfg.Leader == "" || r.cfg.Leader == r.cfg.Replica }

// CountsSpool reports whether this replica counts its spool (and needs
// the SpoolReaderName reader).
func (r *Reconciler) CountsSpool() bool { return r.cfg.Counts == CountsSpool }

// Tap returns api with the profile calls observed (see ProfileTap).
func (r *Reconciler) Tap(api ProfileAPI) *ProfileTap {
	t := &ProfileTap{api: api, name: r.cfg.ProfileName, clock: r.cfg.Clock, observe: r.store.observe}
	if d := r.cfg.Destination; d != nil {
		t.destination = func(env string) string { return strings.TrimRight(d(env), "/") }
	}
	return t
}

// Run counts, reports and compares until ctx ends, then saves the state.
// sp and rd are the spool and the SpoolReaderName reader (spool counts);
// watch, when not nil, is the tap Run lists the profiles through every
// watchEvery (when no registrar does). Call Close after it returned.
func (r *Reconciler) Run(ctx context.Context, sp Spool, rd SpoolReader, watch *ProfileTap, watchEvery time.Duration) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 5)
	start := func(f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil {
				errc <- err
				cancel()
			}
		}()
	}
	if r.ch != nil {
		start(r.keepTables)
	}
	if r.CountsSpool() {
		start(func(ctx context.Context) error { return r.countSpool(ctx, rd) })
	} else {
		start(func(ctx context.Context) error { return r.reportProgress(ctx, sp) })
	}
	if r.Compares() {
		start(func(ctx context.Context) error { r.probe(ctx); return nil })
		start(func(ctx context.Context) error { return r.compareLoop(ctx, sp, rd) })
	}
	if watch != nil {
		start(func(ctx context.Context) error { return r.watch(ctx, watch, watchEvery) })
	}
	r.log.Info("reconcile: log delivery is checked against the Metrics API", "delay", r.cfg.Delay, "counts", r.cfg.Counts,
		"replica", r.cfg.Replica, "compares", r.Compares(), "environments", len(r.cfg.EnvironmentIDs))
	<-ctx.Done()
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	if _, err := r.store.save(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// tables returns the ClickHouse tables this replica writes:
// log_completeness when it compares, log_delivery_progress with
// ClickHouse counts.
func (r *Reconciler) tables() []*clickhouse.Table {
	var ts []*clickhouse.Table
	if r.Compares() {
		ts = append(ts, Completeness())
	}
	if !r.CountsSpool() {
		ts = append(ts, Progress())
	}
	return ts
}

// keepTables makes this replica's ClickHouse tables when Run starts, so
// that they are on every node (and, while a node is out of reach, rechecked
// by the schema manager and counted as incomplete) before the first
// comparison writes log_completeness, maybe half an hour later; and again,
// every clickhouse.RecheckInterval, after ClickHouse failed or the sink
// connected afresh (each schema manager ensures them once).
func (r *Reconciler) keepTables(ctx context.Context) error {
	t := time.NewTicker(clickhouse.RecheckInterval)
	defer t.Stop()
	for {
		if _, err := r.ch.conn(ctx, r.tables()...); err != nil && ctx.Err() == nil {
			r.log.Warn("reconcile: making the ClickHouse tables failed; trying again", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Close closes the state file and the ClickHouse connection.
func (r *Reconciler) Close() error {
	err := r.store.Close()
	if r.ch != nil {
		err = errors.Join(err, r.ch.Close())
	}
	return err
}

// watch lists every environment's profile through tap every interval.
func (r *Reconciler) watch(ctx context.Context, tap *ProfileTap, every time.Duration) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for _, env := range r.cfg.EnvironmentIDs {
			if err := tap.watchOnce(ctx, env); err != nil && ctx.Err() == nil {
				r.log.Warn("reconcile: cannot read the receiver's profile", "environment_id", env, "err", err)
			}
		}
		t.Reset(every)
	}
}

// compareLoop compares due buckets every Interval.
func (r *Reconciler) compareLoop(ctx context.Context, sp Spool, rd SpoolReader) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		r.tick(ctx, sp, rd)
	}
}

// probe asks for the dataset once at start, to say at once when the API
// client lacks the app.metrics scope.
func (r *Reconciler) probe(ctx context.Context) {
	_, err := r.cfg.Metrics.Dataset(ctx, dataset)
	switch {
	case err == nil, ctx.Err() != nil:
	case isForbidden(err):
		r.forbiddenSeen(err)
	default:
		r.log.Warn("reconcile: the Metrics API does not answer yet; buckets wait for it", "err", err)
	}
}
