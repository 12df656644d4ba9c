// Package inventory keeps what the platform says of the environments the
// exporter serves and of their TLS certificates, and exports it: the
// cdn_environment_info and cdn_tls_certificate_* metrics, const metrics
// built at scrape time from the last inventory (collector.go), and the
// environments and tls_certificates tables through a Publisher.
//
// In fastly-exporter's style it is one small cache per API list: the
// environments' names and properties, fed by every discovery (RecordDiscovery)
// and completed by lookups for environments discovery did not describe
// (names.go), and every environment's certificates (certificates.go), listed
// again every Config.Interval. One goroutine, owned by the caller of Run,
// does all the inventory's requests, spread out so that they stay far inside
// the config service's rate limit.
//
// A client the platform refuses the config service (no app.config scope)
// turns the certificates off with one log line and
// edgepipe_inventory_up{kind="tls_certificates"} 0; nothing else of the
// exporter depends on the inventory.
package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/edgepipe/edgepipe/internal/platform"
)

// Defaults of Config.
const (
	// DefaultInterval is how often the certificates are listed again.
	DefaultInterval = time.Hour
	// DefaultRequestGap is the shortest time between two requests of the
	// inventory: 500 requests per 5 minutes, a quarter of the config
	// service's 2,000 GET (spec section 8). The first pass runs at this
	// pace (1,000 environments in 10 minutes); later passes spread their
	// requests over nine tenths of the interval, which lists every
	// environment once per interval as well (at 1,000 environments and 1h,
	// one request every 3.24 s: 93 per 5 minutes). Replicas that share the
	// environments (and the API client's budget) multiply the gap by their
	// number.
	DefaultRequestGap = 600 * time.Millisecond
	// DefaultPrefix is the prefix of the inventory's metric names.
	DefaultPrefix = "cdn"
)

// Clock is the inventory's source of time (schedule.Clock, the platform's
// clock in the exporter).
type Clock interface {
	Now() time.Time
	// Sleep waits for d or until ctx is done, then returns ctx.Err().
	Sleep(ctx context.Context, d time.Duration) error
}

// CertificateLister lists an environment's TLS certificates, every page.
// *platform.ConfigService implements it.
type CertificateLister interface {
	TLSCertificates(ctx context.Context, environmentID string) ([]platform.TLSCertificate, error)
}

// EnvironmentLookup gets one environment and one property from the accounts
// API, to name environments discovery did not describe. *platform.Accounts
// implements it.
type EnvironmentLookup interface {
	Environment(ctx context.Context, id string) (*platform.Environment, error)
	Property(ctx context.Context, id string) (*platform.Property, error)
}

// Publisher receives the inventory as it changes, for the ClickHouse
// tables. Its methods must not block: a publisher queues.
type Publisher interface {
	// PublishEnvironments receives every named environment served, when a
	// name, property or the set changes and at least once per
	// Config.Interval; at is the inventory's time.
	PublishEnvironments(at time.Time, envs []Environment)
	// PublishCertificates receives an environment's certificates as just
	// listed, and those of its previous listing that are no longer listed.
	PublishCertificates(at time.Time, environmentID string, certs, gone []Certificate)
}

// Config configures an Inventory.
type Config struct {
	// Interval is how often every environment's certificates are listed
	// again and names discovery did not give are looked up again (default
	// DefaultInterval).
	Interval time.Duration
	// RequestGap is the shortest time between two requests (default
	// DefaultRequestGap); see DefaultRequestGap for the pace of a pass.
	RequestGap time.Duration
	// Certificates lists TLS certificates; nil turns the certificate
	// inventory off.
	Certificates CertificateLister
	// Accounts looks up environments discovery served without describing
	// (given by ID without a filter); nil leaves them unnamed.
	Accounts EnvironmentLookup
	// Publisher, when set, receives the inventory (the ClickHouse tables).
	Publisher Publisher
	// Prefix is the metric-name prefix (default DefaultPrefix).
	Prefix string
	// Clock is the clock (required).
	Clock Clock
	// Logger receives the inventory's logs (default: discard).
	Logger *slog.Logger
}

// withDefaults returns c with every unset field set to its default.
func (c Config) withDefaults() Config {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.RequestGap == 0 {
		c.RequestGap = DefaultRequestGap
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// validate reports every setting of c (with defaults applied) that cannot
// work.
func (c Config) validate() error {
	var errs []error
	if c.Interval < 0 || c.RequestGap < 0 {
		errs = append(errs, fmt.Errorf("interval %s and request gap %s: must not be negative", c.Interval, c.RequestGap))
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("no Clock"))
	}
	return errors.Join(errs...)
}

// Inventory is the exporter's inventory of environments and TLS
// certificates. Feed it discoveries (RecordDiscovery), run it (Run), and
// register it on a Prometheus registry: it is a prometheus.Collector.
type Inventory struct {
	cfg   Config
	log   *slog.Logger
	descs descs

	// discovered is closed by the first RecordDiscovery.
	discovered chan struct{}
	once       sync.Once

	// pubMu orders the calls to the Publisher.
	pubMu sync.Mutex

	mu    sync.Mutex
	names names
	certs certificates
}

// New validates cfg and returns an Inventory that holds nothing yet.
func New(cfg Config) (*Inventory, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("inventory: invalid configuration: %w", err)
	}
	return &Inventory{
		cfg:        cfg,
		log:        cfg.Logger,
		descs:      newDescs(cfg.Prefix),
		discovered: make(chan struct{}),
		names:      newNames(),
		certs:      newCertificates(cfg.Certificates != nil),
	}, nil
}

// Run refreshes the inventory until ctx is done: after the first discovery,
// and then every Config.Interval, it looks up the names discovery did not
// give and lists every environment's certificates, one request at a time at
// the pace DefaultRequestGap describes. It returns nil when ctx ends.
func (inv *Inventory) Run(ctx context.Context) error {
	select {
	case <-inv.discovered:
	case <-ctx.Done():
		return nil
	}
	for first := true; ; first = false {
		start := inv.cfg.Clock.Now()
		due := inv.nameUndescribed(ctx, start)
		if inv.cfg.Certificates != nil {
			inv.refreshCertificates(ctx, start, due, first)
		}
		if !inv.wait(ctx, start) { // ctx ended during the pass
			return nil
		}
		inv.publishEnvironments(inv.cfg.Clock.Now(), true)
		if !inv.wait(ctx, start.Add(inv.cfg.Interval)) {
			return nil
		}
	}
}

// wait sleeps until due; false when ctx ended.
func (inv *Inventory) wait(ctx context.Context, due time.Time) bool {
	if d := due.Sub(inv.cfg.Clock.Now()); d > 0 {
		if inv.cfg.Clock.Sleep(ctx, d) != nil {
			return false
		}
	}
	return ctx.Err() == nil
}

// gap returns the time between two requests of a pass over n
// environments: RequestGap in the first pass, otherwise nine tenths of the
// interval spread over them (each environment is still listed once per
// interval, the next pass at the same place), never less than RequestGap.
func (inv *Inventory) gap(n int, first bool) time.Duration {
	if first || n == 0 {
		return inv.cfg.RequestGap
	}
	return max(inv.cfg.RequestGap, inv.cfg.Interval*9/10/time.Duration(n))
}
