// Command platform-sim serves the simulated CDN platform API (token endpoint,
// accounts, config's TLS certificates, metrics, RTLD) on one address, for demos and manual testing:
//
//	go run ./cmd/platform-sim
//	curl -s -d grant_type=client_credentials -d client_id=edgepipe-demo \
//	  -d client_secret=edgepipe-demo-secret -d scope=app.metrics \
//	  http://127.0.0.1:9790/connect/token
//
// The demo client's secret is documented (edgepipe-demo-secret); set
// EDGEPIPE_SIM_CLIENT_SECRET (or --client-secret-file) to require another
// one.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/platformsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "platform-sim:", err)
		os.Exit(1)
	}
}

// envClientSecret holds the demo client's secret when it is not the
// documented one.
const envClientSecret = "EDGEPIPE_SIM_CLIENT_SECRET"

// simFlags are the parsed command line.
type simFlags struct {
	clientSecret  *cli.Secret
	clientScopes  *[]string
	listen        *string
	seed          *int64
	tokenLifetime *time.Duration
	lateData      *time.Duration
	properties    *int
	environments  *int
	numbers       *string
	rate429       *float64
	retryAfter    *time.Duration
	rate5xx       *float64
	latency       *time.Duration
	badValues     *string
	badValueRate  *float64
	malformedRows *float64
	clockOffset   *time.Duration
	rateLimits    *bool
	trafficScale  *float64
	live          *bool
	batchSize     *int
	flushInterval *time.Duration
	retryInterval *time.Duration
	insecure      *bool
	dropAcks      *float64
	dropBatches   *map[string]string
	dropRecords   *map[string]string
	late          *map[string]string
}

// newCommandLine declares the simulator's flags.
func newCommandLine(stdout, stderr io.Writer) (*cli.App, *simFlags) {
	app := cli.New("platform-sim", "Simulated CDN platform API (auth, accounts, config TLS certificates, metrics, RTLD) with deterministic, realistic data.", stdout, stderr)
	f := &simFlags{clientSecret: cli.SecretFlag(app, "client-secret-file", envClientSecret,
		"File holding the secret the demo client ("+platformsim.DemoClientID+") must present (default: the documented "+platformsim.DemoClientSecret+").")}
	f.clientScopes = app.Flag("client.scopes", "Scopes granted to the demo client (repeatable or comma-separated; default every scope the simulator serves: "+
		strings.Join(platformsim.DemoScopes(), ",")+"). Leave one out to see how a program copes without it.").PlaceHolder("SCOPE").Strings()
	f.listen = app.Flag("web.listen-address", "Address to serve the API and the token endpoint on.").Default("127.0.0.1:9790").String()
	f.seed = app.Flag("seed", "Seed of the simulated world and its data.").Default("1").Int64()
	f.tokenLifetime = app.Flag("token-lifetime", "Lifetime of issued access tokens.").Default(platformsim.DefaultTokenLifetime.String()).Duration()
	f.lateData = app.Flag("late-data", "How long after a bucket ends its values keep changing (0 disables late data).").Default(platformsim.DefaultLateData.String()).Duration()
	f.properties = app.Flag("world.properties", "Number of properties of the demo organization.").Default(strconv.Itoa(platformsim.DefaultProperties)).Int()
	f.environments = app.Flag("world.environments", "Total number of environments, spread over the properties.").Default(strconv.Itoa(platformsim.DefaultEnvironments)).Int()
	f.numbers = app.Flag("data.numbers", "How data rows render numbers: mixed (some rows as numeric strings), numbers, strings.").Default("mixed").Enum("mixed", "numbers", "strings")
	f.rate429 = app.Flag("fault.rate-429", "Share of API requests answered 429 (0..1).").Default("0").Float64()
	f.retryAfter = app.Flag("fault.retry-after", "Retry-After of injected 429 responses.").Default(platformsim.DefaultRetryAfter.String()).Duration()
	f.rate5xx = app.Flag("fault.rate-5xx", "Share of API requests answered 500 or 503 (0..1).").Default("0").Float64()
	f.latency = app.Flag("fault.latency", "Delay added to every API response.").Default("0s").Duration()
	f.badValues = app.Flag("fault.bad-values", "Replace a share of the metric values of data rows by values that are not: null, nan (\"NaN\"), infinity (\"Infinity\"), negative (-12345, counts only) or text (\"n/a\").").
		Enum("null", "nan", "infinity", "negative", "text")
	f.badValueRate = app.Flag("fault.bad-value-rate", "Share of metric values --fault.bad-values replaces (0..1).").Default(strconv.FormatFloat(platformsim.DefaultBadValueRate, 'g', -1, 64)).Float64()
	f.malformedRows = app.Flag("fault.malformed-rows", "Share of data rows replaced by a malformed row (wrong number of values, or an object) (0..1).").Default("0").Float64()
	f.clockOffset = app.Flag("fault.clock-offset", "How far the platform's clock runs ahead of this machine's (negative: behind), e.g. -40m; moves the data, token expiry and the Date header.").Default("0s").Duration()
	f.rateLimits = app.Flag("api.rate-limits", "Enforce the per-client rate limits of the spec (accounts and config: 2,000 GET per 5 minutes each); --no-api.rate-limits disables.").Default("true").Bool()
	f.trafficScale = app.Flag("traffic.scale", "Multiplies every environment's traffic: the Metrics API's counts and the access logs alike (one model; 1 is about 1,100 requests/s for the default world).").
		Default(strconv.FormatFloat(platformsim.DefaultTrafficScale, 'g', -1, 64)).Float64()
	f.live = app.Flag("delivery.live", "Deliver every enabled RTLD profile's access logs as the clock passes them (--no-delivery.live: none).").Default("true").Bool()
	f.batchSize = app.Flag("delivery.batch-size", "Most records in one delivered log batch.").Default(strconv.Itoa(platformsim.DefaultBatchSize)).Int()
	f.flushInterval = app.Flag("delivery.flush-interval", "How long records wait for a full batch before a partial one is sent.").Default(platformsim.DefaultFlushInterval.String()).Duration()
	f.retryInterval = app.Flag("delivery.retry-interval", "Wait before a failed batch is sent again.").Default(platformsim.DefaultRetryInterval.String()).Duration()
	f.insecure = app.Flag("delivery.insecure-skip-verify", "Accept any TLS certificate of destination endpoints (local demos only).").Bool()
	f.dropAcks = app.Flag("delivery.fault.drop-ack-percent", "Share (0..100) of acknowledged batches sent again as if the answer were lost: the receiver sees duplicates.").Default("0").Float64()
	f.dropBatches = app.Flag("delivery.fault.drop-batch-percent", "ENVIRONMENT_ID=PERCENT: share of the environment's batches lost after numbering (a seq_num gap). Repeatable.").PlaceHolder("ENV=PERCENT").StringMap()
	f.dropRecords = app.Flag("delivery.fault.drop-record-percent", "ENVIRONMENT_ID=PERCENT: share of the environment's records dropped silently, without a seq_num gap. Repeatable.").PlaceHolder("ENV=PERCENT").StringMap()
	f.late = app.Flag("delivery.fault.late", "ENVIRONMENT_ID=DURATION: hold each of the environment's buckets back until this long after its end. Repeatable.").PlaceHolder("ENV=DURATION").StringMap()
	return app, f
}

// config builds the simulator's configuration from the flags (without the
// client and the logger).
func (f *simFlags) config() (platformsim.Config, error) {
	for name, v := range map[string]float64{"fault.rate-429": *f.rate429, "fault.rate-5xx": *f.rate5xx,
		"fault.bad-value-rate": *f.badValueRate, "fault.malformed-rows": *f.malformedRows} {
		if v < 0 || v > 1 {
			return platformsim.Config{}, fmt.Errorf("--%s must be between 0 and 1, got %v", name, v)
		}
	}
	if !(*f.trafficScale > 0 && *f.trafficScale <= platformsim.MaxTrafficScale) {
		return platformsim.Config{}, fmt.Errorf("--traffic.scale must be more than 0 and at most %v, got %v", platformsim.MaxTrafficScale, *f.trafficScale)
	}
	faults, err := f.deliveryFaults()
	if err != nil {
		return platformsim.Config{}, err
	}
	cfg := platformsim.Config{
		Seed:          *f.seed,
		TokenLifetime: *f.tokenLifetime,
		LateData:      *f.lateData,
		Properties:    *f.properties,
		Environments:  *f.environments,
		TrafficScale:  *f.trafficScale,
		ClockOffset:   *f.clockOffset,
		Faults: platformsim.Faults{Rate429: *f.rate429, RetryAfter: *f.retryAfter, Rate5xx: *f.rate5xx, Latency: *f.latency,
			BadValues: platformsim.BadValue(*f.badValues), BadValueRate: *f.badValueRate, MalformedRowRate: *f.malformedRows},
		RateLimits: *f.rateLimits,
		Delivery: platformsim.DeliveryConfig{
			Live:                  *f.live,
			BatchSize:             *f.batchSize,
			FlushInterval:         *f.flushInterval,
			RetryInterval:         *f.retryInterval,
			DevInsecureSkipVerify: *f.insecure,
			Faults:                faults,
		},
	}
	if cfg.LateData == 0 {
		cfg.LateData = -1 // Config: negative disables, zero means the default
	}
	switch *f.numbers {
	case "numbers":
		cfg.Numbers = platformsim.NumbersOnly
	case "strings":
		cfg.Numbers = platformsim.NumbersAsStrings
	}
	return cfg, nil
}

// deliveryFaults parses the --delivery.fault.* flags.
func (f *simFlags) deliveryFaults() (platformsim.DeliveryFaults, error) {
	out := platformsim.DeliveryFaults{DropAckPercent: *f.dropAcks, Environments: map[string]platformsim.EnvironmentFaults{}}
	var errs []error
	if p := out.DropAckPercent; !(p >= 0 && p <= 100) {
		errs = append(errs, fmt.Errorf("--delivery.fault.drop-ack-percent must be between 0 and 100, got %v", p))
	}
	for _, fl := range []struct {
		name string
		vals map[string]string
		set  func(ef *platformsim.EnvironmentFaults, v string) error
	}{
		{"delivery.fault.drop-batch-percent", *f.dropBatches, func(ef *platformsim.EnvironmentFaults, v string) (err error) {
			ef.DropBatchPercent, err = parsePercent(v)
			return err
		}},
		{"delivery.fault.drop-record-percent", *f.dropRecords, func(ef *platformsim.EnvironmentFaults, v string) (err error) {
			ef.DropRecordPercent, err = parsePercent(v)
			return err
		}},
		{"delivery.fault.late", *f.late, func(ef *platformsim.EnvironmentFaults, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return errors.New("want a duration such as 10m")
			}
			ef.Late = d
			return nil
		}},
	} {
		for env, v := range fl.vals {
			ef := out.Environments[env]
			if err := fl.set(&ef, v); err != nil {
				errs = append(errs, fmt.Errorf("--%s %s=%s: %w", fl.name, env, v, err))
				continue
			}
			out.Environments[env] = ef
		}
	}
	return out, errors.Join(errs...)
}

// parsePercent parses a share from 0 to 100.
func parsePercent(v string) (float64, error) {
	p, err := strconv.ParseFloat(v, 64)
	if err != nil || !(p >= 0 && p <= 100) {
		return 0, errors.New("want a percent from 0 to 100")
	}
	return p, nil
}

// checkFaultEnvironments reports fault flags naming an environment the
// simulated world does not have.
func checkFaultEnvironments(f platformsim.DeliveryFaults, envs []string) error {
	var errs []error
	for env := range f.Environments {
		if !slices.Contains(envs, env) {
			errs = append(errs, fmt.Errorf("--delivery.fault.*: no environment %q in the simulated world (see GET /accounts/v0.1/environments)", env))
		}
	}
	return errors.Join(errs...)
}

// run serves until ctx ends (SIGINT/SIGTERM in main).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	app, f := newCommandLine(stdout, stderr)
	_, err := app.Parse(args)
	if errors.Is(err, cli.ErrPrinted) {
		return nil
	}
	if err != nil {
		return err
	}
	log := app.Logger()

	cfg, err := f.config()
	if err != nil {
		return err
	}
	secret, err := f.clientSecret.Read()
	if err != nil {
		return err
	}
	secretSource := "set by --client-secret-file or " + envClientSecret
	if strings.TrimSpace(secret) == "" {
		secret, secretSource = platformsim.DemoClientSecret, "documented demo secret"
	}
	demo := platformsim.DemoClient(cli.SplitList(*f.clientScopes...)...)
	demo.Secret = secret
	cfg.Clients = []platformsim.Client{demo}

	cfg.Logger = log
	cfg.Delivery.Logger = log.With("component", "rtld-delivery")
	srv, err := platformsim.New(cfg)
	if err != nil {
		return err
	}
	if err := checkFaultEnvironments(cfg.Delivery.Faults, srv.EnvironmentIDs()); err != nil {
		srv.Close()
		return err
	}
	base, err := srv.Start(*f.listen)
	if err != nil {
		srv.Close()
		return err
	}
	envs := srv.Environments()
	log.Info("platform simulator serving",
		"url", base,
		"auth_url", base,
		"organization_id", platformsim.DemoOrganizationID,
		"client_id", platformsim.DemoClientID,
		"client_secret_from", secretSource,
		"client_scopes", strings.Join(demo.Scopes, " "),
		"properties", len(srv.Properties()),
		"environments", len(envs),
		"seed", *f.seed,
		"traffic_scale", *f.trafficScale,
		"live_delivery", *f.live)
	fmt.Fprintf(stdout, "platform-sim: API and auth URL %s\n", base)
	fmt.Fprintf(stdout, "platform-sim: organization ID %s\n", platformsim.DemoOrganizationID)
	fmt.Fprintf(stdout, "platform-sim: client ID %s (secret: %s)\n", platformsim.DemoClientID, secretSource)

	<-ctx.Done()
	log.Info("shutting down")
	done := make(chan error, 1)
	go func() { done <- srv.Close() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("shutdown: %w", err)
		}
	case <-time.After(15 * time.Second):
		return errors.New("shutdown: timed out")
	}
	log.Info("stopped")
	return nil
}
