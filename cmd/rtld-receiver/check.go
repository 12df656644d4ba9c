package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/preflight"
	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/rtld/reconcile"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/logtable"
	kafkasink "github.com/edgepipe/edgepipe/internal/sinks/kafka"
)

// checkCallTimeout bounds each API request of `rtld-receiver check`, which
// tries each once.
const checkCallTimeout = 10 * time.Second

// checkEnvironments is the name of the receiver's environments check.
const checkEnvironments = "environments"

// environmentsTimeout bounds the environments check (a list request per
// environment).
const environmentsTimeout = 2 * time.Minute

// runCheck is `rtld-receiver check`: it checks the flags as the receiver
// does at start, then runs every check their configuration calls for, a
// line each on stdout. It returns an error unless every check passed.
func runCheck(ctx context.Context, f *flags, stdout io.Writer) error {
	x := &receiverCheck{f: f}
	defer x.close()
	err := x.configure()
	checks := []preflight.Check{preflight.Configuration(nil, err)}
	if err == nil {
		checks = x.checks()
	}
	return preflight.Run(ctx, stdout, checks).Err()
}

// receiverCheck builds and runs the receiver's checks.
type receiverCheck struct {
	f   *flags
	sec secrets
	// environments are the environments served (--environment-id, or the
	// simulator's).
	environments []string
	// reconciling is set when the receiver compares the logs with the
	// Metrics API; reconcileOff says why not, when --reconcile.delay asks
	// for it but the settings lack what it needs (the receiver then runs
	// without it).
	reconciling  bool
	reconcileOff string
	// api talks to the platform when the receiver registers profiles or
	// reconciles; registrar when it registers (nil otherwise).
	api       *platform.Client
	clientID  string
	registrar *rtld.Registrar
	// The sinks' configurations (nil when disabled), and the Kafka sink
	// the Kafka checks ask the brokers through (never started).
	kafka      *kafkasink.Config
	kafkaSink  *kafkasink.Sink
	clickhouse *logtable.Config
	closers    []func()
}

func (x *receiverCheck) close() {
	for i := len(x.closers) - 1; i >= 0; i-- {
		x.closers[i]()
	}
}

// configure refuses what the receiver refuses at start: sizes and limits
// that do not fit together, missing credentials, sink flags that cannot
// work. Only a --public-url that is not https is left to its own check.
func (x *receiverCheck) configure() error {
	f := x.f
	if err := checkSizes(f); err != nil {
		return err
	}
	if err := f.reconcile.check(f.clickhouseDSN); err != nil {
		return err
	}
	var err error
	if x.sec, err = f.readSecrets(); err != nil {
		return err
	}
	if err := x.configureSinks(); err != nil {
		return err
	}
	if _, err := f.logMetrics.config(); err != nil {
		return err
	}
	x.environments = f.platform.EnvironmentIDs
	var clientSecret string
	if f.simulate {
		if clientSecret, err = x.simulate(); err != nil {
			return err
		}
	} else if x.sec.rtldUsername == "" || x.sec.rtldPassword == "" {
		return errors.New("EDGEPIPE_RTLD_USERNAME and EDGEPIPE_RTLD_PASSWORD (or --rtld.password-file) must be set: every batch is checked against them")
	}
	x.reconciling = f.reconcile.delay > 0
	if x.reconciling && !f.register {
		if x.reconcileOff = x.reconcileLacks(); x.reconcileOff != "" {
			x.reconciling = false
		}
	}
	if !f.register && !x.reconciling {
		return nil
	}
	return x.configurePlatform(clientSecret)
}

// configureSinks builds the sinks' configurations as the receiver does.
func (x *receiverCheck) configureSinks() error {
	f, log := x.f, x.f.app.Logger()
	var err error
	if x.kafka, err = kafkaConfig(f, x.sec.kafkaUsername, x.sec.kafkaPassword, log); err != nil {
		return err
	}
	if x.kafka != nil {
		if x.kafkaSink, err = kafkasink.New(*x.kafka); err != nil {
			return err
		}
		x.closers = append(x.closers, func() { _ = x.kafkaSink.Close() })
	}
	if err := checkRecordLimit(f); err != nil {
		return err
	}
	if x.clickhouse, err = clickhouseConfig(f, x.sec.clickhousePassword); err != nil {
		return err
	}
	if x.clickhouse != nil {
		x.clickhouse.Logger = log
	}
	return nil
}

// reconcileLacks says what the receiver lacks to reconcile without
// registering profiles, as it decides at start ("" when nothing).
func (x *receiverCheck) reconcileLacks() string {
	p := x.f.platform
	switch {
	case p.APIURL == "":
		return "no --api.url"
	case len(x.environments) == 0:
		return "no --environment-id"
	case !x.f.simulate:
		if _, _, err := p.Credentials(); err != nil {
			return err.Error()
		}
	}
	return ""
}

// simulate starts the simulator's API for --simulate, and takes its demo
// client, the environments --simulate serves (unless given) and profile
// credentials as --simulate does. It returns the client's secret.
func (x *receiverCheck) simulate() (clientSecret string, err error) {
	var envs []string
	var stop func()
	x.clientID, clientSecret, envs, stop, err = startSimulatedAPI(x.f)
	if err != nil {
		return "", err
	}
	x.closers = append(x.closers, stop)
	if len(x.environments) == 0 {
		x.environments = envs
	}
	if x.sec.rtldUsername == "" || x.sec.rtldPassword == "" {
		x.sec.rtldUsername, x.sec.rtldPassword = "edgepipe-sim", randomSecret()
	}
	if x.f.publicURL == "" {
		// --simulate receives on a loopback listener of its own.
		x.f.publicURL = "https://127.0.0.1"
	}
	return clientSecret, nil
}

// configurePlatform builds the API client the receiver registers profiles
// and reconciles with, and the registrar, as the receiver does at start.
// clientSecret is the simulator's; otherwise the credentials are read
// here.
func (x *receiverCheck) configurePlatform(clientSecret string) error {
	f, p := x.f, x.f.platform
	if f.register {
		if err := x.registerSettings(); err != nil {
			return err
		}
	}
	if !f.simulate {
		var err error
		if x.clientID, clientSecret, err = p.Credentials(); err != nil {
			return fmt.Errorf("%w; they are needed to register profiles (or --no-register)", err)
		}
	}
	api, err := platform.New(platform.Config{BaseURL: p.APIURL, AuthURL: p.AuthURL, ClientID: x.clientID, ClientSecret: clientSecret,
		Logger: f.app.Logger(), Version: cli.Version(), Timeout: checkCallTimeout, Retry: platform.RetryConfig{MaxAttempts: 1}})
	if err != nil {
		return err
	}
	x.api = api
	if !f.register {
		return nil
	}
	percent, _ := f.reconcile.downsamplingPercent() // checked by registerSettings
	x.registrar, err = rtld.NewRegistrar(api.RTLD(), rtld.RegistrarConfig{
		EnvironmentIDs: x.environments, ProfileName: f.profileName, PublicURL: strings.TrimRight(f.publicURL, "/"),
		Username: x.sec.rtldUsername, Password: x.sec.rtldPassword, Fields: cli.SplitList(f.fields), Interval: f.registerInterval,
		DownsamplingPercent: percent,
	})
	if err != nil && !strings.HasPrefix(f.publicURL, "https://") {
		x.registrar, err = nil, nil // the public URL's check says why
	}
	return err
}

// registerSettings refuses what registering profiles lacks.
func (x *receiverCheck) registerSettings() error {
	if len(x.environments) == 0 {
		return errors.New("--environment-id is required to register profiles (or --no-register)")
	}
	if x.f.platform.APIURL == "" {
		return errors.New("--api.url (or EDGEPIPE_API_URL) is required to register profiles (or --no-register)")
	}
	_, err := x.f.reconcile.downsamplingPercent()
	return err
}

// checks lists the checks of the configuration, in the order they run.
func (x *receiverCheck) checks() []preflight.Check {
	f := x.f
	checks := []preflight.Check{preflight.Configuration(x.describe, nil)}
	if p := *f.web.Flags.WebConfigFile; p != "" {
		checks = append(checks, preflight.WebConfig(p))
	}
	checks = append(checks, preflight.Directory("spool directory", "--spool.dir", f.spoolDir))
	checks = append(checks, x.platformChecks()...)
	if x.clickhouse != nil {
		checks = append(checks, x.clickhouseChecks()...)
	}
	if x.kafka != nil {
		checks = append(checks, x.kafkaChecks()...)
	}
	return checks
}

// scopes are the scopes the receiver's configuration needs, each with a
// request it authorises.
func (x *receiverCheck) scopes() []preflight.ScopeUse {
	var uses []preflight.ScopeUse
	for _, s := range []struct {
		on  bool
		use preflight.ScopeUse
	}{
		{x.f.register, preflight.ScopeUse{Scope: platform.ScopeRTLD, For: "registering the access-log profiles",
			Otherwise: "pass --no-register and manage the profiles yourself", Probe: x.probeRTLD}},
		{x.reconciling, preflight.ScopeUse{Scope: platform.ScopeMetrics, For: "comparing the logs with the Metrics API (reconciliation)",
			Otherwise: "set --reconcile.delay=0 to turn reconciliation off", Probe: x.probeMetrics}},
	} {
		if s.on {
			uses = append(uses, s.use)
		}
	}
	return uses
}

// platformChecks are the checks of the platform's API, when the receiver
// uses it: credentials, scopes, the public URL and the environments.
func (x *receiverCheck) platformChecks() []preflight.Check {
	uses := x.scopes()
	if len(uses) == 0 || x.api == nil {
		return nil
	}
	p := x.f.platform
	pf := &preflight.Platform{Client: x.api, ClientID: x.clientID, AuthURL: p.AuthURL, APIURL: p.APIURL}
	checks := []preflight.Check{pf.Credentials(uses[0].Scope)}
	for _, u := range uses {
		checks = append(checks, pf.Scope(u))
	}
	if !x.f.register {
		return checks
	}
	envNeeds := []string{preflight.ScopeCheck(platform.ScopeRTLD)}
	if !x.f.simulate { // the simulator posts to the receiver on loopback
		pu := &preflight.PublicURL{URL: x.f.publicURL, WebConfigFile: *x.f.web.Flags.WebConfigFile,
			Destination: func(env string) string { return strings.TrimRight(x.f.publicURL, "/") + rtld.EndpointPath(env) }}
		checks = append(checks, pu.Checks()...)
		envNeeds = append(envNeeds, preflight.CheckPublicURL)
	}
	return append(checks, preflight.Check{Name: checkEnvironments, Needs: envNeeds, Timeout: environmentsTimeout, Run: x.checkEnvironments})
}

// describe sums up the configuration.
func (x *receiverCheck) describe() string {
	f := x.f
	var parts []string
	switch {
	case f.simulate:
		parts = append(parts, "the built-in simulator at "+f.platform.APIURL+" (--simulate)")
	case x.api != nil:
		parts = append(parts, "API "+f.platform.APIURL)
	}
	parts = append(parts, fmt.Sprintf("%d environment(s)", len(x.environments)))
	if f.register {
		parts = append(parts, "registers profile "+strconv.Quote(f.profileName))
	} else {
		parts = append(parts, "profiles managed elsewhere (--no-register)")
	}
	switch {
	case x.reconciling:
		parts = append(parts, fmt.Sprintf("reconciles with the Metrics API %s after each bucket (counts from %s)", f.reconcile.delay, f.reconcile.counts))
	case x.reconcileOff != "":
		parts = append(parts, "no reconciliation ("+x.reconcileOff+")")
	default:
		parts = append(parts, "no reconciliation (--reconcile.delay=0)")
	}
	var sinks []string
	if x.kafka != nil {
		sinks = append(sinks, "Kafka")
	}
	if x.clickhouse != nil {
		sinks = append(sinks, "ClickHouse")
	}
	if len(sinks) == 0 {
		sinks = append(sinks, "none (batches stay in the spool)")
	}
	return strings.Join(append(parts, "sinks: "+strings.Join(sinks, ", ")), ", ")
}

func (x *receiverCheck) probeRTLD(ctx context.Context) (string, error) {
	var page struct {
		TotalItems *int `json:"total_items"`
	}
	if err := x.api.RTLD().Do(ctx, http.MethodGet, "/accesslogs/fields", url.Values{"limit": {"1"}}, nil, &page); err != nil {
		return "", err
	}
	if page.TotalItems == nil {
		return "the RTLD service lists the log fields", nil
	}
	return fmt.Sprintf("the RTLD service lists %d log fields", *page.TotalItems), nil
}

func (x *receiverCheck) probeMetrics(ctx context.Context) (string, error) {
	var list struct {
		Items []any `json:"items"`
	}
	if err := x.api.Metrics().Do(ctx, http.MethodGet, "/datasets", nil, nil, &list); err != nil {
		return "", err
	}
	return fmt.Sprintf("the Metrics API lists %d datasets", len(list.Items)), nil
}

// checkEnvironments is the check "environments": every environment
// exists and the API client may read its profiles; the line says what the
// receiver will create or repair at start.
func (x *receiverCheck) checkEnvironments(ctx context.Context) preflight.Result {
	var unknown, delivers, elsewhere, missing []string
	for _, env := range x.environments {
		st, err := x.registrar.Inspect(ctx, env)
		switch {
		case platform.StatusCode(err) == http.StatusBadRequest || platform.IsNotFound(err):
			unknown = append(unknown, env)
		case err != nil:
			return preflight.Fail("%v", err)
		case !st.Found:
			missing = append(missing, env)
		case st.Delivers && st.Enabled && st.Copies == 1:
			delivers = append(delivers, env)
		default:
			elsewhere = append(elsewhere, env)
		}
	}
	if len(unknown) > 0 {
		return preflight.Fail("unknown to the platform, or not ones API client %s may see: %s; check --environment-id (or EDGEPIPE_ENVIRONMENT_ID)",
			x.clientID, strings.Join(unknown, ", "))
	}
	msg := fmt.Sprintf("%d exist; profile %q delivers here in %d", len(x.environments), x.f.profileName, len(delivers))
	if len(elsewhere) > 0 {
		msg += fmt.Sprintf(", is repaired at start in %d (another destination, disabled or duplicated: %s)", len(elsewhere), strings.Join(elsewhere, ", "))
	}
	if len(missing) > 0 {
		msg += fmt.Sprintf(", is created at start in %d", len(missing))
	}
	return preflight.Pass("%s", msg)
}

// clickhouseChecks are "ClickHouse" and "ClickHouse tables" (access_logs,
// the environments table the sink makes, the reconciliation's tables), as
// the receiver would find them at start.
func (x *receiverCheck) clickhouseChecks() []preflight.Check {
	cfg := *x.clickhouse
	var db *clickhouse.DB
	keep := func(d *clickhouse.DB) {
		db = d
		x.closers = append(x.closers, func() { _ = d.Close() })
	}
	open := func(ctx context.Context) (*clickhouse.DB, error) { return logtable.OpenReadOnly(ctx, cfg) }
	var extra []*clickhouse.Table
	if x.reconciling {
		extra = append(extra, reconcile.Completeness())
		if x.f.reconcile.counts == reconcile.CountsClickHouse {
			extra = append(extra, reconcile.Progress())
		}
	}
	inspect := func(ctx context.Context) ([]*clickhouse.TableReport, error) {
		return logtable.Inspect(ctx, db, cfg, extra...)
	}
	return []preflight.Check{
		preflight.ClickHouse(cfg.DSN, open, keep),
		preflight.ClickHouseTables("ClickHouse tables", inspect),
	}
}

// kafkaChecks are the brokers, the topic and its message size limit.
func (x *receiverCheck) kafkaChecks() []preflight.Check {
	k := &kafkaCheck{Brokers: x.kafka.Brokers, Topic: x.kafka.Topic, CreateTopic: x.kafka.CreateTopic, Partitions: x.kafka.Partitions,
		MaxMessageBytes: x.kafka.MaxMessageBytes, MaxRecordBytes: int64(x.f.maxRecordBytes), Inspect: x.kafkaSink.Inspect}
	return k.checks()
}
