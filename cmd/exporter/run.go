package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	"github.com/alecthomas/kingpin/v2"
	rungroup "github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/exportconfig"
	"github.com/edgepipe/edgepipe/internal/inventory"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/schedule"
	"github.com/edgepipe/edgepipe/internal/sinks/otel"
	promsink "github.com/edgepipe/edgepipe/internal/sinks/prometheus"
	"github.com/edgepipe/edgepipe/internal/statedir"
)

// DefaultListenAddress is the exporter's default --web.listen-address.
const DefaultListenAddress = ":9780"

// runFlags are the flags of the run command.
type runFlags struct {
	pollInterval      time.Duration
	settleWindow      time.Duration
	discoveryInterval time.Duration
	concurrency       int
	jitter            time.Duration
	datasets          []string
	otlpEndpoint      string
	otlpProtocol      string
	otlpQueue         int
	otlpTemporality   string
	stateDir          string
	seriesTTL         time.Duration
	gaugeMaxAge       time.Duration
	maxSeries         int
	shutdownTimeout   time.Duration
	inventoryInterval time.Duration
	web               *cli.Web
}

func registerRunFlags(cmd *kingpin.CmdClause) *runFlags {
	f := &runFlags{}
	cmd.Flag("poll-interval", "How often each dataset is polled; polls are aligned to multiples of it.").Default(schedule.DefaultPollInterval.String()).DurationVar(&f.pollInterval)
	cmd.Flag("settle-window", "How far back buckets are re-polled for late data (default 30m for FIVE_MINUTES, 3 buckets for HOUR and DAY); rounded up to whole buckets.").
		DurationVar(&f.settleWindow)
	cmd.Flag("discovery.interval", "How often environments and dataset descriptors are listed again.").Default(schedule.DefaultDiscoveryInterval.String()).DurationVar(&f.discoveryInterval)
	cmd.Flag("poll.concurrency", "Most dataset polls running at once.").Default(strconv.Itoa(schedule.DefaultConcurrency)).IntVar(&f.concurrency)
	cmd.Flag("poll.jitter", "Largest random delay added to each aligned poll (spreads instances).").Default("5s").DurationVar(&f.jitter)
	cmd.Flag("dataset", "Poll only this dataset (repeatable; default: every dataset offering the granularity).").StringsVar(&f.datasets)
	cmd.Flag("otlp.endpoint", "Enables OTLP export to this endpoint: a URL (http:// plaintext, https:// TLS) or host:port (TLS). The standard OTEL_EXPORTER_OTLP_* variables work too.").
		StringVar(&f.otlpEndpoint)
	cmd.Flag("otlp.protocol", "OTLP protocol: grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc).").StringVar(&f.otlpProtocol)
	cmd.Flag("otlp.temporality", "Temporality of the OTLP count sums: cumulative (running totals; what Prometheus and Mimir take) or delta (default: OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, else cumulative).").
		StringVar(&f.otlpTemporality)
	cmd.Flag("state.dir", "Directory where the exporter keeps, after every poll, what it needs to continue exactly after a restart: high-water marks, the values published for the settle window's buckets, counter totals. Without it the first poll after start is a baseline (remembered, not counted).").
		StringVar(&f.stateDir)
	cmd.Flag("otlp.queue-size", "OTLP export requests (each up to 10000 points) queued while the collector is slow or down; beyond it points are dropped and counted.").
		Default(strconv.Itoa(otel.DefaultQueueSize)).IntVar(&f.otlpQueue)
	cmd.Flag("prometheus.series-ttl", "Drop a label set (e.g. a country) whose newest bucket is this much older than the dataset's newest; its counter totals and OTLP sums end then too.").
		Default(promsink.DefaultSeriesTTL.String()).DurationVar(&f.seriesTTL)
	cmd.Flag("prometheus.gauge-max-age", "Hide the gauges of a label set whose newest bucket is this much older than the dataset's newest (its counters stay).").
		Default(promsink.DefaultGaugeMaxAge.String()).DurationVar(&f.gaugeMaxAge)
	cmd.Flag("prometheus.max-series", "Most dataset series /metrics holds (label sets × their dataset's metrics; the inventory's few series per environment come on top); beyond it new label sets are "+
		"refused, counted in edgepipe_series_limit_dropped_total{dataset} and logged, while those held keep updating. 0: no limit.").
		Default(strconv.Itoa(promsink.DefaultMaxSeries)).IntVar(&f.maxSeries)
	cmd.Flag("shutdown-timeout", "How long shutdown may take to flush sinks.").Default("10s").DurationVar(&f.shutdownTimeout)
	cmd.Flag("inventory.interval", "How often every environment's TLS certificates are listed again (config API, scope "+platform.ScopeConfig+"; "+
		"requests spread out far inside its rate limit) for the "+inventory.DefaultPrefix+"_tls_certificate_* metrics and the tls_certificates table, "+
		"and names discovery does not give are looked up again. 0 turns the certificate inventory off.").
		Default(inventory.DefaultInterval.String()).DurationVar(&f.inventoryInterval)
	f.web = cli.AddWebFlags(cmd, DefaultListenAddress)
	return f
}

// validate refuses flag values of the run command that cannot work,
// naming the flag, before anything is built.
func (f *runFlags) validate() error {
	if f.maxSeries < 0 {
		return fmt.Errorf("--prometheus.max-series must not be negative, got %d", f.maxSeries)
	}
	if f.shutdownTimeout <= 0 {
		return fmt.Errorf("--shutdown-timeout must be positive, got %s", f.shutdownTimeout)
	}
	if f.inventoryInterval < 0 {
		return fmt.Errorf("--inventory.interval must not be negative (0 turns the certificate inventory off), got %s", f.inventoryInterval)
	}
	if otel.Enabled(f.otlpEndpoint) {
		if _, err := otel.Protocol(f.otlpProtocol); err != nil {
			return err
		}
		if _, err := otel.Temporality(f.otlpTemporality); err != nil {
			return err
		}
	}
	return nil
}

// runDeps are test seams of the run command; production uses zero values.
type runDeps struct {
	clock    schedule.Clock       // default: the wall clock
	listener net.Listener         // default: listen per --web.listen-address
	registry *prometheus.Registry // default: a new registry
	ready    chan<- *exporter     // receives the exporter once it serves
}

// exporter is one running run command: registry, sinks, scheduler, web.
type exporter struct {
	reg       *prometheus.Registry
	self      *promsink.SelfMetrics
	collector *promsink.Collector
	sched     *schedule.Scheduler
	inv       *inventory.Inventory
	metrics   http.Handler        // /metrics
	handler   http.Handler        // /healthz, /readyz
	state     schedule.StateSaver // nil without --state.dir
	closers   []func(context.Context) error
}

// runExporter builds the exporter from the flags and runs it until ctx is
// done: scheduler and web server in one run group, then an orderly
// shutdown (web server, poll loops, then sinks flush within
// --shutdown-timeout).
func runExporter(ctx context.Context, h *host, f *runFlags, exts []extension, deps runDeps) error {
	x, err := buildExporter(ctx, h, f, exts, deps)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
		defer cancel()
		for i := len(x.closers) - 1; i >= 0; i-- {
			if err := x.closers[i](sctx); err != nil {
				h.log.Error("shutdown", "err", err)
			}
		}
	}()
	srv, err := f.web.NewServer(cli.Site{
		Landing: web.LandingConfig{
			Name:        "edgepipe exporter",
			Description: "Exports the CDN platform's traffic metrics (every dataset of every environment) to Prometheus and OpenTelemetry.",
			Links: []web.LandingLinks{
				{Address: "/metrics", Text: "Metrics"},
				{Address: "/healthz", Text: "Health"},
				{Address: "/readyz", Text: "Readiness", Description: "ready after the first discovery and a successful poll of every dataset"},
			},
		},
		Metrics:  x.metrics,
		Registry: x.reg,
		Handler:  x.handler,
		Listener: deps.listener,
	}, h.log)
	if err != nil {
		return err
	}

	var g rungroup.Group
	g.Add(cli.ContextActor(ctx))
	g.Add(srv.Actor(5 * time.Second))
	schedCtx, stopSched := context.WithCancel(context.Background())
	// Only a configuration error (an unknown --dataset, a config file that
	// does not fit the platform's datasets) ends the scheduler before it is
	// interrupted.
	g.Add(func() error { return x.sched.Run(schedCtx) }, func(error) { stopSched() })
	invCtx, stopInv := context.WithCancel(context.Background())
	g.Add(func() error { return x.inv.Run(invCtx) }, func(error) { stopInv() })
	if deps.ready != nil {
		deps.ready <- x
	}
	h.log.Info("exporter running", "granularity", h.common.granularity, "poll_interval", f.pollInterval,
		"settle_window", x.sched.SettleWindow(), "shard", fmt.Sprintf("%d/%d", h.common.shard.Index, h.common.shard.Count),
		"config_file", h.common.config.Source, "prefix", h.common.config.Prefix, "max_series", f.maxSeries)
	err = g.Run()
	h.log.Info("exporter stopped")
	return err
}

// buildExporter wires registry, self-metrics, clients, sinks and scheduler.
func buildExporter(ctx context.Context, h *host, f *runFlags, exts []extension, deps runDeps) (_ *exporter, err error) {
	x := &exporter{reg: deps.registry}
	defer func() {
		if err != nil { // undo what was built (e.g. the state directory's lock)
			for i := len(x.closers) - 1; i >= 0; i-- {
				err = errors.Join(err, x.closers[i](context.Background()))
			}
		}
	}()
	if x.reg == nil {
		x.reg = prometheus.NewRegistry()
	}
	if err := f.validate(); err != nil {
		return nil, err
	}
	clock, err := x.newSelfMetrics(h, f, deps.clock)
	if err != nil {
		return nil, err
	}
	cl, err := h.clients(ctx)
	if err != nil {
		return nil, err
	}
	tracker, err := openState(h, f, x)
	if err != nil {
		return nil, err
	}
	pubs, err := x.newSinks(ctx, h, f)
	if err != nil {
		return nil, err
	}
	ext, err := x.setupExtensions(ctx, h, exts)
	if err != nil {
		return nil, err
	}
	pubs = append(pubs, ext.publishers...)
	if x.inv, err = newInventory(h, f, cl, clock, ext.inventory, x.reg); err != nil {
		return nil, err
	}
	if x.sched, err = x.newScheduler(h, f, cl, clock, tracker, pubs, ext.resume); err != nil {
		return nil, err
	}
	x.metrics, err = promsink.Handler(x.reg, x.collector, func(err error) { cli.LogServeError(h.log, "/metrics", err) })
	if err != nil {
		return nil, fmt.Errorf("/metrics handler: %w", err)
	}
	x.handler = newHandler(x.sched)
	return x, nil
}

// newSelfMetrics registers the build info and the exporter's own metrics,
// and hands them to h with the platform's clock, which it returns: polls
// are planned by the Date headers of the API's answers, the local clock
// (default the wall clock) only sleeps.
func (x *exporter) newSelfMetrics(h *host, f *runFlags, local schedule.Clock) (*schedule.PlatformClock, error) {
	if local == nil {
		local = schedule.RealClock{}
	}
	clock := schedule.NewPlatformClock(local)
	if err := x.reg.Register(cli.BuildInfo("exporter")); err != nil {
		return nil, fmt.Errorf("build info: %w", err)
	}
	self, err := promsink.NewSelfMetrics(x.reg, clock.Now)
	if err != nil {
		return nil, fmt.Errorf("self-metrics: %w", err)
	}
	self.SetClockSkew(clock.Skew)
	self.ExpectDatasets(f.datasets)
	x.self = self
	h.apiObserver = self
	h.platformClock = clock
	h.registerer = x.reg
	return clock, nil
}

// newSinks creates the Prometheus collector and, with --otlp.endpoint, the
// OTLP sink, and returns them as the scheduler's publishers.
func (x *exporter) newSinks(ctx context.Context, h *host, f *runFlags) ([]schedule.NamedPublisher, error) {
	var err error
	x.collector, err = promsink.NewCollector(promsink.Options{SeriesTTL: f.seriesTTL, GaugeMaxAge: f.gaugeMaxAge,
		Prefix: h.common.config.Prefix, MaxSeries: f.maxSeries, Logger: h.log.With("sink", "prometheus")})
	if err != nil {
		return nil, err
	}
	pubs := []schedule.NamedPublisher{{Name: "prometheus", Publisher: x.collector}}
	if !otel.Enabled(f.otlpEndpoint) {
		return pubs, nil
	}
	sink, err := x.newOTLPSink(ctx, h, f)
	if err != nil {
		return nil, err
	}
	return append(pubs, schedule.NamedPublisher{Name: "otlp", Publisher: sink}), nil
}

// newOTLPSink creates the OTLP sink of the --otlp.* flags.
func (x *exporter) newOTLPSink(ctx context.Context, h *host, f *runFlags) (*otel.Sink, error) {
	proto, err := otel.Protocol(f.otlpProtocol)
	if err != nil {
		return nil, err
	}
	temporality, err := otel.Temporality(f.otlpTemporality)
	if err != nil {
		return nil, err
	}
	res, err := otel.NewResource(ctx, h.version)
	if err != nil {
		return nil, err
	}
	exp, err := otel.NewExporter(ctx, proto, f.otlpEndpoint)
	if err != nil {
		return nil, err
	}
	sink, err := otel.New(exp, otel.Options{Resource: res, QueueSize: f.otlpQueue, Registerer: x.reg, Prefix: h.common.config.Prefix,
		Logger: h.log.With("sink", "otlp"), Temporality: temporality})
	if err != nil {
		return nil, errors.Join(err, exp.Shutdown(context.Background()))
	}
	x.closers = append(x.closers, sink.Close)
	h.log.Info("OTLP export enabled", "protocol", proto, "endpoint", f.otlpEndpoint, "temporality", temporality)
	return sink, nil
}

// setupExtensions sets up every extension and returns what they add
// together: their publishers, and the one resume source and inventory
// publisher at most one of them may provide.
func (x *exporter) setupExtensions(ctx context.Context, h *host, exts []extension) (parts, error) {
	var all parts
	for _, e := range exts {
		p, err := e.setup(ctx, h)
		if err != nil {
			return parts{}, err
		}
		all.publishers = append(all.publishers, p.publishers...)
		if p.close != nil {
			x.closers = append(x.closers, p.close)
		}
		if p.resume != nil {
			if all.resume != nil {
				return parts{}, errors.New("two extensions provide a resume source")
			}
			all.resume = p.resume
		}
		if p.inventory != nil {
			if all.inventory != nil {
				return parts{}, errors.New("two extensions take the inventory")
			}
			all.inventory = p.inventory
		}
	}
	return all, nil
}

// newScheduler creates the scheduler that polls every dataset through cl
// and hands the buckets to pubs.
func (x *exporter) newScheduler(h *host, f *runFlags, cl *apiClients, clock schedule.Clock, tracker *schedule.Tracker,
	pubs []schedule.NamedPublisher, resume schedule.ResumeSource) (*schedule.Scheduler, error) {
	discovery := h.environments(cl)
	discovery.Catalog = x.inv
	return schedule.New(schedule.Config{
		Granularity:       h.common.granularity,
		PollInterval:      f.pollInterval,
		SettleWindow:      f.settleWindow,
		DiscoveryInterval: f.discoveryInterval,
		Concurrency:       f.concurrency,
		Jitter:            f.jitter,
		Datasets:          f.datasets,
		DatasetSource:     &exportconfig.DatasetSource{Source: cl.Metrics, Config: h.common.config, Logger: h.log.With("component", "config")},
		Environments:      discovery,
		Fetcher:           cl.Metrics,
		Resume:            resume,
		Publishers:        pubs,
		Observer:          x.self,
		Clock:             clock,
		Logger:            h.log.With("component", "schedule"),
		Tracker:           tracker,
		State:             x.state,
		Points:            otel.Enabled(f.otlpEndpoint),
		SeriesTTL:         f.seriesTTL,
	})
}

// newHandler serves /healthz and /readyz (the web server adds /metrics and
// the landing page).
func newHandler(sched *schedule.Scheduler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !sched.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: waiting for the first discovery and a successful poll of every dataset")
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// openState opens --state.dir and returns the tracker to start from: empty
// for a first start (an empty directory), restored from the directory's
// files otherwise, and, without a state directory, one whose first poll of
// each environment is a baseline. A refused file stops the exporter.
func openState(h *host, f *runFlags, x *exporter) (*schedule.Tracker, error) {
	if f.stateDir == "" {
		h.log.Info("no --state.dir: the first poll after start is a baseline (its buckets are remembered, not counted); " +
			"buckets completed while stopped are not counted; set --state.dir")
		return schedule.NewTracker(schedule.Restart), nil
	}
	c := h.common
	dir, err := statedir.Open(f.stateDir, statedir.Identity{
		Granularity:   string(c.granularity),
		Organizations: c.organizationIDs,
		Environments:  c.environmentIDs,
		Shard:         fmt.Sprintf("%d/%d", c.shard.Index, c.shard.Count),
	})
	if err != nil {
		return nil, fmt.Errorf("--state.dir: %w", err)
	}
	x.closers = append(x.closers, func(context.Context) error { return dir.Close() })
	x.state = dir
	if dir.Fresh() {
		h.log.Info("state directory is empty: a first start, the first poll is counted in full", "state_dir", dir.Path())
		return schedule.NewTracker(schedule.FirstStart), nil
	}
	tracker := schedule.NewTracker(schedule.Restart)
	states := dir.TakeStates()
	for dataset, state := range states {
		if err := tracker.Restore(dataset, state); err != nil {
			return nil, fmt.Errorf("--state.dir: %s: %w; nothing in the state directory was used. Move the file away to let this exporter start (the dataset then starts with a baseline)",
				filepath.Join(dir.Path(), dataset+statedir.Suffix), err)
		}
	}
	h.log.Info("state restored: counting continues where it stopped", "state_dir", dir.Path(), "datasets", len(states))
	return tracker, nil
}
