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
	recordsPerSec *float64
	batchSize     *int
	flushInterval *time.Duration
	retryInterval *time.Duration
	insecure      *bool
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
	f.recordsPerSec = app.Flag("delivery.records-per-second", "Access-log records generated per second for each enabled RTLD profile.").Default("5").Float64()
	f.batchSize = app.Flag("delivery.batch-size", "Most records in one delivered log batch.").Default(strconv.Itoa(platformsim.DefaultBatchSize)).Int()
	f.flushInterval = app.Flag("delivery.flush-interval", "How long records wait for a full batch before a partial one is sent.").Default(platformsim.DefaultFlushInterval.String()).Duration()
	f.retryInterval = app.Flag("delivery.retry-interval", "Wait before a failed batch is sent again.").Default(platformsim.DefaultRetryInterval.String()).Duration()
	f.insecure = app.Flag("delivery.insecure-skip-verify", "Accept any TLS certificate of destination endpoints (local demos only).").Bool()
	return app, f
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

	for name, v := range map[string]float64{"fault.rate-429": *f.rate429, "fault.rate-5xx": *f.rate5xx,
		"fault.bad-value-rate": *f.badValueRate, "fault.malformed-rows": *f.malformedRows} {
		if v < 0 || v > 1 {
			return fmt.Errorf("--%s must be between 0 and 1, got %v", name, v)
		}
	}
	cfg := platformsim.Config{
		Seed:          *f.seed,
		TokenLifetime: *f.tokenLifetime,
		LateData:      *f.lateData,
		Properties:    *f.properties,
		Environments:  *f.environments,
		ClockOffset:   *f.clockOffset,
		Faults: platformsim.Faults{Rate429: *f.rate429, RetryAfter: *f.retryAfter, Rate5xx: *f.rate5xx, Latency: *f.latency,
			BadValues: platformsim.BadValue(*f.badValues), BadValueRate: *f.badValueRate, MalformedRowRate: *f.malformedRows},
		RateLimits: *f.rateLimits,
		Delivery: platformsim.DeliveryConfig{
			RecordsPerSecond:      *f.recordsPerSec,
			BatchSize:             *f.batchSize,
			FlushInterval:         *f.flushInterval,
			RetryInterval:         *f.retryInterval,
			DevInsecureSkipVerify: *f.insecure,
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
	srv, err := platformsim.New(cfg)
	if err != nil {
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
		"seed", *f.seed)
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
