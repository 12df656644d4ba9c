// Package receiver assembles the RTLD receiver: the ingest source, the
// on-disk spool, the gap tracker, the Kafka and ClickHouse delivery workers
// with their dead-letter store, and the profile registrar, behind one HTTP handler (ingest, /metrics,
// /healthz, /readyz). cmd/rtld-receiver parses flags into a Config; tests
// run a Receiver in-process.
package receiver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/rtld/deadletter"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
	"github.com/edgepipe/edgepipe/internal/rtld/logmetrics"
	"github.com/edgepipe/edgepipe/internal/rtld/reconcile"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/logtable"
	kafkasink "github.com/edgepipe/edgepipe/internal/sinks/kafka"
)

// Sink names: spool reader names and the "sink" metric label.
const (
	SinkKafka      = "kafka"
	SinkClickHouse = "clickhouse"
)

// Config configures a Receiver.
type Config struct {
	// SpoolDir, SpoolMaxBytes and SpoolSegmentBytes configure the spool.
	SpoolDir          string
	SpoolMaxBytes     int64
	SpoolSegmentBytes int64
	// DeadLetterMaxBytes bounds the dead-letter store under
	// <SpoolDir>/dead-letter (default deadletter.DefaultMaxBytes).
	DeadLetterMaxBytes int64
	// Ingest configures the ingest source.
	Ingest rtld.IngestConfig
	// EnvironmentIDs, when not empty, are the only environments accepted.
	EnvironmentIDs []string
	// Kafka enables the Kafka sink when not nil.
	Kafka *kafkasink.Config
	// ClickHouse enables the ClickHouse sink when not nil.
	ClickHouse *logtable.Config
	// LogMetrics enables the live traffic metrics of the accepted records
	// (cdn_logs_*) when not nil.
	LogMetrics *logmetrics.Config
	// ProfileAPI and Registrar enable profile registration when both are set.
	ProfileAPI rtld.ProfileAPI
	Registrar  *rtld.RegistrarConfig
	// Reconcile, when set, checks every environment's log delivery
	// against the Metrics API. The receiver fills in the environments, the
	// state directory, ClickHouse, the profile's name and destination, the
	// registry and the logger. It needs ProfileAPI: with a Registrar its
	// calls are observed, without one the profiles are listed every
	// WatchInterval.
	Reconcile *reconcile.Config
	// WatchInterval is how often profiles are read when Reconcile is set
	// and no Registrar is (default rtld.DefaultRegisterInterval).
	WatchInterval time.Duration
	// NoIngestFirst turns off the sinks' deference to ingest: by default,
	// while ingest is saturated, their workers hold the batches they read
	// back for up to delivery.DefaultMaxDefer after each was spooled, so
	// the answers to the platform get the CPU first.
	NoIngestFirst bool
	// GapGrace is how long a missing seq_num may stay missing before it
	// counts as a gap (default DefaultGapGrace).
	GapGrace time.Duration
	// GapSaveInterval is how often the gap tracker saves its state and lets
	// the spool delete what it covers (default DefaultGapSaveInterval).
	GapSaveInterval time.Duration
	// Registry receives the metrics (default: a new registry with the Go
	// and process collectors).
	Registry *prometheus.Registry
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Memory the receiver's parts may hold besides request bodies, for
// MemoryLimit: batches waiting for Kafka partitions with their messages
// (twice delivery.DefaultMaxPendingBytes), the ClickHouse sink's INSERT in
// delivery (batches, columns, the driver's copy and its encoding) and the
// next one built (six times its 32 MiB of batches), and the runtime, the
// spool, the gap tracker and TLS.
const (
	kafkaMemory      = 2 * delivery.DefaultMaxPendingBytes
	clickhouseMemory = 6 * clickhouseGroupBytes
	baseMemory       = 64 << 20
)

// MemoryLimit returns the soft memory limit the receiver should run with
// (Go's GOMEMLIMIT; the program sets it unless GOMEMLIMIT is set): request
// bodies in flight (Ingest.MaxMemoryBytes) plus what the configured sinks
// hold plus the rest, so that the collector keeps the heap near what the
// settings let the receiver hold instead of letting it grow to twice what
// is live (416 MiB with both sinks and the default settings).
func (c Config) MemoryLimit() int64 {
	n := c.Ingest.WithDefaults().MaxMemoryBytes + baseMemory
	if c.Kafka != nil {
		n += kafkaMemory
	}
	if c.ClickHouse != nil {
		n += clickhouseMemory
	}
	return n
}

// clickhouseGroupBytes is the most the ClickHouse sink's worker reads for
// one INSERT.
const clickhouseGroupBytes = 16 << 20

// Receiver is the assembled receiver. Create it with New, serve Handler,
// and call Run once; Run closes everything when its context ends.
type Receiver struct {
	cfg       Config
	log       *slog.Logger
	reg       *prometheus.Registry
	metrics   *rtld.Metrics
	delivered *delivery.Metrics
	spool     *spool.Spool
	dead      *deadletter.Store
	gaps      *rtld.GapTracker
	ingest    *rtld.Ingest
	registrar *rtld.Registrar
	reconcile *reconcile.Reconciler
	watch     *reconcile.ProfileTap // lists profiles when no registrar does
	sinks     map[string]delivery.Sink
	closers   []func() error
	handler   http.Handler
}

// Defaults of Config.
const (
	// DefaultGapGrace is the default of Config.GapGrace: the platform
	// retries a failed batch at intervals, for minutes.
	DefaultGapGrace = 10 * time.Minute
	// DefaultGapSaveInterval is the default of Config.GapSaveInterval.
	DefaultGapSaveInterval = 5 * time.Second
)

// withDefaults returns c with every unset field set to its default.
func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.GapGrace == 0 {
		c.GapGrace = DefaultGapGrace
	}
	if c.GapSaveInterval == 0 {
		c.GapSaveInterval = DefaultGapSaveInterval
	}
	if c.WatchInterval == 0 {
		c.WatchInterval = rtld.DefaultRegisterInterval
	}
	c.Ingest = c.Ingest.WithDefaults()
	return c
}

// validate reports every setting of c (with defaults applied) that cannot
// work; the spool, the dead-letter store and the sinks check their own.
func (c Config) validate() error {
	var errs []error
	if c.SpoolDir == "" {
		errs = append(errs, errors.New("no spool directory"))
	}
	if c.GapGrace < 0 {
		errs = append(errs, fmt.Errorf("GapGrace %s: must be positive", c.GapGrace))
	}
	if c.GapSaveInterval < 0 {
		errs = append(errs, fmt.Errorf("GapSaveInterval %s: must be positive", c.GapSaveInterval))
	}
	if err := c.Ingest.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("ingest: %w", err))
	}
	if c.Reconcile != nil && c.ProfileAPI == nil {
		errs = append(errs, errors.New("reconciliation needs the RTLD API to see the profiles"))
	}
	if c.Reconcile != nil && c.Registrar == nil && len(c.EnvironmentIDs) == 0 {
		errs = append(errs, errors.New("reconciliation needs the environment IDs"))
	}
	return errors.Join(errs...)
}

// ingestBusy returns what the delivery workers ask to let ingest go
// first, or nil when Config.NoIngestFirst is set.
func (r *Receiver) ingestBusy() func() float64 {
	if r.cfg.NoIngestFirst {
		return nil
	}
	return r.ingest.Load().Busy
}

// New opens the spool (recovering it) and prepares every part; nothing runs
// until Run.
func New(cfg Config) (_ *Receiver, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("rtld receiver: invalid configuration: %w", err)
	}
	lm, err := newLogMetrics(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
		cfg.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	r := &Receiver{cfg: cfg, log: cfg.Logger, reg: cfg.Registry, sinks: map[string]delivery.Sink{}}
	r.metrics = rtld.NewMetrics(r.reg)
	r.delivered = delivery.NewMetrics(r.reg)
	defer func() {
		if err != nil {
			err = r.closeOpened(err)
		}
	}()

	if err := r.openSinks(); err != nil {
		return nil, err
	}
	if cfg.Reconcile != nil {
		if r.reconcile, err = r.newReconciler(); err != nil {
			return nil, err
		}
	}
	if len(r.sinks) == 0 {
		r.log.Warn("rtld receiver: no sink configured (--kafka.brokers, --clickhouse.dsn): batches are spooled, counted and then discarded")
	}
	if err := r.openStores(); err != nil {
		return nil, err
	}
	if err := r.newIngest(lm); err != nil {
		return nil, err
	}
	if err := r.newRegistrar(); err != nil {
		return nil, err
	}
	r.handler = r.routes()
	return r, nil
}

// newLogMetrics returns the live traffic metrics cfg.LogMetrics asks for,
// or nil.
func newLogMetrics(cfg Config) (*logmetrics.Metrics, error) {
	if cfg.LogMetrics == nil {
		return nil, nil
	}
	lc := *cfg.LogMetrics
	lc.Logger = cfg.Logger
	lm, err := logmetrics.New(lc)
	if err != nil {
		return nil, fmt.Errorf("rtld receiver: %w", err)
	}
	return lm, nil
}

// closeOpened closes what New opened before it failed with err, newest
// first, and returns err with whatever closing reported.
func (r *Receiver) closeOpened(err error) error {
	var cerrs []error
	if r.gaps != nil {
		cerrs = append(cerrs, r.gaps.Close())
	}
	if r.reconcile != nil {
		cerrs = append(cerrs, r.reconcile.Close())
	}
	if r.spool != nil {
		cerrs = append(cerrs, r.spool.Close())
	}
	if cerr := errors.Join(append(cerrs, r.closeSinks())...); cerr != nil {
		err = errors.Join(err, fmt.Errorf("closing the parts opened: %w", cerr))
	}
	return err
}

// openSinks creates the configured Kafka and ClickHouse sinks.
func (r *Receiver) openSinks() error {
	cfg := r.cfg
	if cfg.Kafka != nil {
		kc := *cfg.Kafka
		kc.Logger = cfg.Logger
		k, err := kafkasink.New(kc)
		if err != nil {
			return err
		}
		r.sinks[SinkKafka] = k
		r.closers = append(r.closers, k.Close)
	}
	if cfg.ClickHouse != nil {
		cc := *cfg.ClickHouse
		cc.Logger = cfg.Logger
		c, err := logtable.New(cc)
		if err != nil {
			return err
		}
		r.sinks[SinkClickHouse] = c
		r.closers = append(r.closers, c.Close)
		r.reg.MustRegister(c)
	}
	return nil
}

// spoolReaders returns the names of the spool's readers: the gap tracker,
// every sink and the reconciliation when it counts the spool.
func (r *Receiver) spoolReaders() []string {
	readers := []string{rtld.GapReader}
	for name := range r.sinks {
		readers = append(readers, name)
	}
	if r.reconcile != nil && r.reconcile.CountsSpool() {
		readers = append(readers, reconcile.SpoolReaderName)
	}
	return readers
}

// openStores opens the spool, the dead-letter store and the gap tracker's
// state.
func (r *Receiver) openStores() error {
	cfg := r.cfg
	sp, err := spool.Open(spool.Options{
		Dir: cfg.SpoolDir, MaxBytes: cfg.SpoolMaxBytes, SegmentBytes: cfg.SpoolSegmentBytes,
		MaxEntryBytes: rtld.SpoolEntryBytes(cfg.Ingest.MaxDecodedBytes),
		Readers:       r.spoolReaders(), Logger: cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("opening the spool: %w", err)
	}
	r.spool = sp
	r.reg.MustRegister(rtld.NewSpoolCollector(sp))
	r.dead, err = deadletter.Open(deadletter.Options{Dir: filepath.Join(cfg.SpoolDir, deadletter.DirName), MaxBytes: cfg.DeadLetterMaxBytes,
		Logger: cfg.Logger, Sinks: slices.Sorted(maps.Keys(r.sinks))})
	if err != nil {
		return err
	}
	r.reg.MustRegister(r.dead.Collectors()...)
	r.gaps, err = rtld.NewGapTracker(cfg.SpoolDir, cfg.GapGrace, r.metrics, cfg.Logger)
	if err != nil {
		return err
	}
	// Ingest recognises a resend of what the previous run spooled once the
	// tracker has read it.
	gapReader, err := sp.Reader(rtld.GapReader)
	if err != nil {
		return err
	}
	r.gaps.Recover(gapReader.Committed().Index + sp.Stats().Readers[rtld.GapReader].Entries)
	return nil
}

// newIngest creates the ingest source, restricted to cfg.EnvironmentIDs
// and observed by the log metrics lm when not nil.
func (r *Receiver) newIngest(lm *logmetrics.Metrics) error {
	cfg := r.cfg
	ic := cfg.Ingest
	if len(cfg.EnvironmentIDs) > 0 && ic.AllowEnvironment == nil {
		allowed := map[string]bool{}
		for _, e := range cfg.EnvironmentIDs {
			allowed[e] = true
		}
		ic.AllowEnvironment = func(env string) bool { return allowed[env] }
	}
	if lm != nil {
		r.reg.MustRegister(lm)
		ic.Observer = lm
	}
	var err error
	r.ingest, err = rtld.NewIngest(ic, r.spool, r.gaps, r.metrics, cfg.Logger)
	return err
}

// newRegistrar creates the profile registrar when the configuration has
// one, or else the profile watch the reconciliation needs.
func (r *Receiver) newRegistrar() error {
	cfg := r.cfg
	if cfg.ProfileAPI == nil || cfg.Registrar == nil {
		if r.reconcile != nil {
			r.watch = r.reconcile.Tap(cfg.ProfileAPI)
		}
		return nil
	}
	rc := *cfg.Registrar
	rc.Logger = cfg.Logger
	if cfg.LogMetrics != nil {
		rc.Fields = withLogMetricsFields(rc.Fields, cfg.LogMetrics.Labels, cfg.Logger)
	}
	rc.Observer = newRegistrationMetrics(r.reg)
	api := cfg.ProfileAPI
	if r.reconcile != nil {
		api = r.reconcile.Tap(api)
		rc.Fields = withTimestamp(rc.Fields, cfg.Logger)
	}
	var err error
	r.registrar, err = rtld.NewRegistrar(api, rc)
	return err
}

// routes returns the receiver's HTTP handler.
func (r *Receiver) routes() http.Handler {
	mux := chi.NewRouter()
	r.ingest.Register(mux)
	mux.Handle("/metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg}))
	mux.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.Get("/readyz", r.ready)
	return mux
}

// newReconciler completes the reconciliation's configuration from the
// receiver's and opens its state.
func (r *Receiver) newReconciler() (*reconcile.Reconciler, error) {
	cfg := r.cfg
	rc := *cfg.Reconcile
	rc.Dir, rc.Registerer, rc.Logger = cfg.SpoolDir, r.reg, cfg.Logger
	if rc.EnvironmentIDs == nil {
		rc.EnvironmentIDs = cfg.EnvironmentIDs
		if cfg.Registrar != nil {
			rc.EnvironmentIDs = cfg.Registrar.EnvironmentIDs
		}
	}
	if cfg.Registrar != nil {
		rc.ProfileName = cmp.Or(cfg.Registrar.ProfileName, rc.ProfileName)
		base := strings.TrimRight(cfg.Registrar.PublicURL, "/")
		rc.Destination = func(env string) string { return base + rtld.EndpointPath(env) }
	}
	rc.ProfileName = cmp.Or(rc.ProfileName, rtld.DefaultProfileName)
	if cfg.ClickHouse != nil {
		// The sink's connection and schema manager: the reconciliation's
		// tables are rechecked and counted with the sink's.
		sink, _ := r.sinks[SinkClickHouse].(reconcile.SchemaSource)
		rc.ClickHouse = &reconcile.ClickHouseConfig{DSN: cfg.ClickHouse.DSN, Options: cfg.ClickHouse.Options, Reader: SinkClickHouse, Schemas: sink}
	}
	return reconcile.New(rc)
}

// withTimestamp returns the profile's fields with timestamp, which the
// reconciliation buckets records by. An empty list (every field the
// platform lists) is returned as it is.
func withTimestamp(fields []string, log *slog.Logger) []string {
	if len(fields) == 0 || slices.Contains(fields, "timestamp") {
		return fields
	}
	log.Info("rtld receiver: requesting the timestamp field besides --fields: reconciliation counts records by it (--reconcile.delay=0 to leave it out)")
	return append(slices.Clone(fields), "timestamp")
}

// Handler serves ingest (POST /ingest/{environment_id}), /metrics, /healthz
// and /readyz.
func (r *Receiver) Handler() http.Handler { return r.handler }

// Registry returns the metrics registry (/metrics of the program serving
// Handler).
func (r *Receiver) Registry() *prometheus.Registry { return r.reg }

// Check checks, before the receiver starts, what a sink can only find out
// by connecting: that ClickHouse's access_logs can hold every field (it is
// created or extended here). A column that cannot is an error (the receiver
// must not start); a server that cannot be reached is only logged, since
// delivery connects again later.
func (r *Receiver) Check(ctx context.Context) error {
	c, ok := r.sinks[SinkClickHouse].(*logtable.Sink)
	if !ok {
		return nil
	}
	err := c.Check(ctx)
	var incompatible *logtable.IncompatibleColumnError
	var unsupported *clickhouse.UnsupportedServerError
	switch {
	case errors.As(err, &incompatible), errors.As(err, &unsupported):
		return fmt.Errorf("ClickHouse sink: %w", err)
	case err != nil:
		r.log.Warn("ClickHouse is not reachable at start-up; delivery will connect when it is", "err", err)
	}
	return nil
}

// ready answers 200 while the spool takes batches, 503 while ingest
// refuses them for lack of space (the spool's bound or a full disk).
func (r *Receiver) ready(w http.ResponseWriter, _ *http.Request) {
	if r.spool.Full() {
		msg := "spool is full"
		if r.spool.Stats().NoSpace {
			msg = "spool disk is full"
		}
		http.Error(w, msg, http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// Close closes the sinks, the gap state and the spool of a receiver whose Run was never
// called (Run closes them itself).
func (r *Receiver) Close() error {
	err := errors.Join(r.closeSinks(), r.gaps.Close(), r.spool.Close())
	if r.reconcile != nil {
		err = errors.Join(err, r.reconcile.Close())
	}
	return err
}

func (r *Receiver) closeSinks() error {
	var errs []error
	for _, c := range r.closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

// Run starts the delivery workers, the gap tracker and the registrar, and
// blocks until ctx ends; it then stops them, waits for them, and closes the
// sinks and the spool. Stop serving Handler before cancelling ctx so no
// request meets a closed spool.
func (r *Receiver) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errc := make(chan error, len(r.sinks)+3)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(runCtx); err != nil {
				errc <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	for name, sink := range r.sinks {
		reader, err := r.spool.Reader(name)
		if err != nil {
			cancel()
			return err
		}
		if ps, ok := sink.(delivery.Partitioned); ok {
			// Kafka: every partition on its own.
			w := &delivery.PartitionWorker{Name: name, Sink: ps, Reader: reader, DeadLetters: r.dead, Metrics: r.delivered, Log: r.log,
				IngestBusy: r.ingestBusy(), MarksFile: filepath.Join(r.cfg.SpoolDir, "partitions-"+name+".state")}
			start(name+" worker", w.Run)
			continue
		}
		w := &delivery.Worker{Name: name, Sink: sink, Reader: reader, DeadLetters: r.dead, Metrics: r.delivered, Log: r.log,
			IngestBusy: r.ingestBusy()}
		if name == SinkClickHouse {
			// ClickHouse wants few large INSERTs (each one is a part to
			// merge): up to 16 MiB of JSON (~8k records of 2 KB) at once
			// (32 MiB cost 130 MiB more peak RSS for 7 % less of
			// clickhouse-server's CPU per record).
			w.MaxBatches, w.MaxBytes = 1024, clickhouseGroupBytes
		}
		start(name+" worker", w.Run)
	}
	gapReader, err := r.spool.Reader(rtld.GapReader)
	if err != nil {
		cancel()
		return err
	}
	start("gap tracker", func(ctx context.Context) error { return r.gaps.Run(ctx, gapReader, r.cfg.GapSaveInterval) })
	if r.registrar != nil {
		start("profile registrar", r.registrar.Run)
	}
	if r.reconcile != nil {
		var rd reconcile.SpoolReader
		if r.reconcile.CountsSpool() {
			sr, err := r.spool.Reader(reconcile.SpoolReaderName)
			if err != nil {
				cancel()
				return err
			}
			rd = sr
		}
		start("reconciliation", func(ctx context.Context) error {
			return r.reconcile.Run(ctx, r.spool, rd, r.watch, r.cfg.WatchInterval)
		})
	}
	<-runCtx.Done()
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	errs = append(errs, r.closeSinks(), r.gaps.Close(), r.spool.Close())
	if r.reconcile != nil {
		errs = append(errs, r.reconcile.Close())
	}
	return errors.Join(errs...)
}

// withLogMetricsFields returns the profile's fields with those the log
// metrics read added. An empty list (every field the platform lists) is
// returned as it is.
func withLogMetricsFields(fields, labels []string, log *slog.Logger) []string {
	if len(fields) == 0 {
		return fields
	}
	var added []string
	for _, f := range logmetrics.Fields(labels) {
		if !slices.Contains(fields, f) {
			added = append(added, f)
		}
	}
	if len(added) > 0 {
		log.Info("rtld receiver: requesting the log fields the log metrics read besides --fields (--no-log-metrics.enabled to leave them out)", "added", added)
	}
	return append(slices.Clone(fields), added...)
}

// registrationMetrics counts profile checks by result.
type registrationMetrics struct{ c *prometheus.CounterVec }

func newRegistrationMetrics(reg prometheus.Registerer) *registrationMetrics {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgepipe_rtld_profile_registrations_total",
		Help: "Checks of the receiver's RTLD profile per environment, by result (created, updated, repaired, unchanged, error).",
	}, []string{"environment_id", "result"})
	reg.MustRegister(c)
	return &registrationMetrics{c: c}
}

// ObserveRegistration implements rtld.RegistrationObserver.
func (m *registrationMetrics) ObserveRegistration(env string, res rtld.RegistrationResult) {
	m.c.WithLabelValues(env, string(res)).Inc()
}
