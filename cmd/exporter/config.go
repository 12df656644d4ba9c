package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/exportconfig"
	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/schedule"
)

// envOrganizations holds the organizations to serve (comma-separated) when
// no --organization-id is given.
const envOrganizations = "EDGEPIPE_ORGANIZATION_ID"

// commonFlags are the flags every command shares: where the API is, whom to
// serve, at which granularity.
type commonFlags struct {
	// platform holds the shared platform flags; tests that build a
	// commonFlags themselves leave it nil and set apiURL, authURL and
	// environmentIDs.
	platform        *cli.Platform
	organizationIDs []string
	granularityName string
	shardIndex      int
	shardCount      int
	simulate        bool
	configFile      string

	// Resolved by resolve().
	apiURL, authURL        string
	environmentIDs         []string
	clientID, clientSecret string
	granularity            metricsapi.Granularity
	shard                  schedule.Shard
	// config is --config.file, checked as far as it can be without the
	// platform (exportconfig.Default without the flag).
	config *exportconfig.Config
}

func registerCommonFlags(app *cli.App) *commonFlags {
	c := &commonFlags{platform: cli.AddPlatformFlags(app)}
	app.Flag("organization-id", "Serve every environment of every property of this organization, rediscovered periodically (repeatable or comma-separated).").
		Envar(envOrganizations).PlaceHolder("ID").StringsVar(&c.organizationIDs)
	app.Flag("granularity", "Bucket width polled: FIVE_MINUTES, HOUR or DAY.").Default(string(metricsapi.FiveMinutes)).StringVar(&c.granularityName)
	app.Flag("shard.index", "This instance's shard in [0, shard.count): it serves the environments with FNV-1a-64(id) mod shard.count == shard.index.").
		Default("0").IntVar(&c.shardIndex)
	app.Flag("shard.count", "Number of exporter instances sharing the environments.").Default("1").IntVar(&c.shardCount)
	app.Flag("config.file", "YAML file saying what to export: per dataset the dimensions kept (the API aggregates the others), "+
		"metrics (regular expressions) and percentiles; environments included or excluded by ID, name or property; the metric-name prefix. "+
		"Checked against the platform's datasets at start.").PlaceHolder("FILE").StringVar(&c.configFile)
	app.Flag("simulate", "Run against the built-in platform simulator (demo credentials and organization; no other flag needed).").BoolVar(&c.simulate)
	return c
}

// resolve checks the flags and reads the credentials. Under --simulate the
// API settings are filled in later by host.clients.
func (c *commonFlags) resolve() error {
	var err error
	if c.granularity, err = metricsapi.ParseGranularity(c.granularityName); err != nil {
		return fmt.Errorf("--granularity: %w", err)
	}
	c.shard = schedule.Shard{Index: c.shardIndex, Count: c.shardCount}
	if err := c.shard.Validate(); err != nil {
		return fmt.Errorf("--shard.index/--shard.count: %w", err)
	}
	p := c.platform
	if p == nil {
		p = &cli.Platform{APIURL: c.apiURL, AuthURL: c.authURL, EnvironmentIDs: c.environmentIDs}
	}
	p.Resolve()
	c.apiURL, c.authURL, c.environmentIDs = p.APIURL, p.AuthURL, p.EnvironmentIDs
	c.organizationIDs = cli.SplitList(c.organizationIDs...)
	c.config = exportconfig.Default()
	if c.configFile != "" {
		if c.config, err = exportconfig.Load(c.configFile); err != nil {
			return fmt.Errorf("--config.file: %w", err)
		}
	}
	if c.simulate {
		return nil
	}
	if c.apiURL == "" {
		return errors.New("--api.url (or EDGEPIPE_API_URL) is required, or use --simulate")
	}
	if len(c.environmentIDs) == 0 && len(c.organizationIDs) == 0 {
		return errors.New("nothing to serve: give --environment-id and/or --organization-id (or EDGEPIPE_ENVIRONMENT_ID / EDGEPIPE_ORGANIZATION_ID)")
	}
	c.clientID, c.clientSecret, err = p.Credentials()
	return err
}

// host is what main builds once for every command and hands to the run
// command and to extensions.
type host struct {
	common  *commonFlags
	log     *slog.Logger
	version string

	// registerer receives the self-metrics of extensions. The run command
	// sets it to the registry served on /metrics before calling setup;
	// other commands get a private registry nobody serves.
	registerer prometheus.Registerer
	// apiObserver is told about every API request (self-metrics); set by
	// the run command before clients is first called.
	apiObserver platform.Observer
	// platformClock follows the platform's clock through the Date headers
	// of the API's answers; commands set it before clients is first called.
	platformClock *schedule.PlatformClock
	// rateLimits overrides the client's default budgets (tests).
	rateLimits map[string]platform.Limits
	// once makes every API call one attempt bounded by checkCallTimeout
	// (`exporter check` tries each thing once).
	once bool

	mu      sync.Mutex
	sim     simulation // under --simulate
	built   *apiClients
	closers []func()
}

// apiClients are the platform clients built from the flags.
type apiClients struct {
	Platform *platform.Client
	Metrics  *metricsapi.Client
	Accounts *platform.Accounts
	Config   *platform.ConfigService
}

func newHost(c *commonFlags, log *slog.Logger) (*host, error) {
	if err := c.resolve(); err != nil {
		return nil, err
	}
	return &host{common: c, log: log, version: cli.Version(), registerer: prometheus.NewRegistry()}, nil
}

// clients builds (once) the platform, metrics and accounts clients from the
// flags. Under --simulate it first starts the simulator on 127.0.0.1:0 and
// points the flags at it with the demo credentials, serving the demo
// organization unless environments or organizations were given.
func (h *host) clients(_ context.Context) (*apiClients, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.built != nil {
		return h.built, nil
	}
	c := h.common
	if c.simulate {
		stop, err := h.sim.start(c, h.log)
		if err != nil {
			return nil, err
		}
		h.closers = append(h.closers, stop)
	}
	cfg := platform.Config{
		BaseURL:      c.apiURL,
		AuthURL:      c.authURL,
		ClientID:     c.clientID,
		ClientSecret: c.clientSecret,
		Logger:       h.log.With("component", "platform"),
		Observer:     h.apiObserver,
		Version:      h.version,
		DateObserver: dateObserver(h.platformClock),
		RateLimits:   h.rateLimits,
	}
	if h.once {
		cfg.Retry.MaxAttempts, cfg.Timeout = 1, checkCallTimeout
	}
	pc, err := platform.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("platform client: %w", err)
	}
	h.built = &apiClients{Platform: pc, Metrics: metricsapi.NewClient(pc.Metrics()), Accounts: pc.Accounts(), Config: pc.ConfigService()}
	return h.built, nil
}

// dateObserver returns pc as a platform.DateObserver, nil when pc is nil.
func dateObserver(pc *schedule.PlatformClock) platform.DateObserver {
	if pc == nil {
		return nil
	}
	return pc
}

// environments returns the sharded environment discovery of the flags and
// the config file's environment filter; call it after clients.
func (h *host) environments(cl *apiClients) *schedule.Discovery {
	d := &schedule.Discovery{
		Accounts:      cl.Accounts,
		Organizations: h.common.organizationIDs,
		Static:        h.common.environmentIDs,
		Shard:         h.common.shard,
	}
	if h.common.config.FiltersEnvironments() {
		d.Filter = h.common.config
	}
	return d
}

// close stops what the host started (the simulator).
func (h *host) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.closers) - 1; i >= 0; i-- {
		h.closers[i]()
	}
	h.closers = nil
}
