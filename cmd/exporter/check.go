package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/preflight"
	"github.com/edgepipe/edgepipe/internal/schedule"
	"github.com/edgepipe/edgepipe/internal/sinks/otel"
)

// checkCallTimeout bounds each API request of `exporter check`, which
// tries each once.
const checkCallTimeout = 10 * time.Second

// Names of the exporter's checks that other checks need.
const (
	checkEnvironments = "environments"
	checkDatasets     = "datasets"
)

// environmentsTimeout bounds the environments check, which looks up every
// environment given by ID and lists every organization.
const environmentsTimeout = 2 * time.Minute

// checkState carries what earlier checks found to later ones.
type checkState struct {
	// listed are the platform's datasets (the metrics scope's request).
	listed []metricsapi.Dataset
	// environments are the environments the run would serve.
	environments []string
	// datasets are the datasets the run would poll, as exported.
	datasets []metricsapi.Dataset
	// certificates is set when the run lists TLS certificates.
	certificates bool
	// closers run when the checks are done, last first.
	closers []func()
}

func (st *checkState) close() {
	for i := len(st.closers) - 1; i >= 0; i-- {
		st.closers[i]()
	}
}

// runCheck is `exporter check`: it checks the run command's flags, then
// runs every check their configuration calls for, a line each on stdout.
// It returns an error unless every check passed.
func runCheck(ctx context.Context, cl *commandLine, stdout io.Writer) error {
	x, err := newExporterCheck(ctx, cl)
	if x != nil {
		defer x.close()
	}
	checks := []preflight.Check{preflight.Configuration(nil, err)}
	if err == nil {
		checks = x.checks()
	}
	return preflight.Run(ctx, stdout, checks).Err()
}

// exporterCheck builds and runs the exporter's checks.
type exporterCheck struct {
	h   *host
	cl  *commandLine
	api *apiClients
	st  checkState
	ext []preflight.Check // the extensions'
}

// newExporterCheck resolves the flags as the run command does and builds
// the API clients (under --simulate, starting the simulator); an error is
// a flag the run command would refuse.
func newExporterCheck(ctx context.Context, cl *commandLine) (*exporterCheck, error) {
	h, err := newHost(cl.common, cl.app.Logger())
	if err != nil {
		return nil, err
	}
	h.once = true
	x := &exporterCheck{h: h, cl: cl}
	if err := cl.run.validate(); err != nil {
		return x, err
	}
	x.st.certificates = cl.run.inventoryInterval > 0
	for _, e := range cl.exts {
		c, err := e.checks(h, &x.st)
		if err != nil {
			return x, err
		}
		x.ext = append(x.ext, c...)
	}
	x.api, err = h.clients(ctx)
	return x, err
}

func (x *exporterCheck) close() {
	x.st.close()
	x.h.close()
}

// checks lists the checks of the configuration, in the order they run.
func (x *exporterCheck) checks() []preflight.Check {
	c, f := x.h.common, x.cl.run
	checks := []preflight.Check{preflight.Configuration(x.describe, nil)}
	if p := *f.web.Flags.WebConfigFile; p != "" {
		checks = append(checks, preflight.WebConfig(p))
	}
	if f.stateDir != "" {
		checks = append(checks, preflight.Directory("state directory", "--state.dir", f.stateDir))
	}
	p := &preflight.Platform{Client: x.api.Platform, ClientID: c.clientID, AuthURL: c.authURL, APIURL: c.apiURL}
	uses := x.scopes()
	checks = append(checks, p.Credentials(uses[0].Scope))
	var later []preflight.Check // scopes whose request needs the environments
	for _, u := range uses {
		if len(u.Needs) == 0 {
			checks = append(checks, p.Scope(u))
		} else {
			later = append(later, p.Scope(u))
		}
	}
	envNeeds := []string{preflight.ScopeCheck(platform.ScopeAccounts)}
	for _, org := range c.organizationIDs {
		checks = append(checks, x.organization(org))
		envNeeds = append(envNeeds, organizationCheck(org))
	}
	checks = append(checks, preflight.Check{Name: checkEnvironments, Needs: envNeeds, Timeout: environmentsTimeout, Run: x.environments})
	checks = append(checks, later...)
	checks = append(checks, preflight.Check{Name: checkDatasets, Needs: []string{preflight.ScopeCheck(platform.ScopeMetrics)}, Run: x.datasets})
	checks = append(checks, x.ext...)
	if otel.Enabled(f.otlpEndpoint) {
		checks = append(checks, preflight.Check{Name: "OTLP endpoint", Run: x.otlp})
	}
	return checks
}

// scopes are the scopes the run command's configuration needs, each with
// a request it authorises. The first is the one the credentials check asks
// a token for.
func (x *exporterCheck) scopes() []preflight.ScopeUse {
	uses := []preflight.ScopeUse{
		{Scope: platform.ScopeAccounts, For: "discovering the organizations' environments and naming every environment served (cdn_environment_info)",
			Probe: x.probeAccounts},
		{Scope: platform.ScopeMetrics, For: "polling the Metrics API", Probe: x.probeMetrics},
	}
	if x.st.certificates {
		uses = append(uses, preflight.ScopeUse{Scope: platform.ScopeConfig, For: "the TLS certificate inventory (cdn_tls_certificate_*, the tls_certificates table)",
			Otherwise: "set --inventory.interval=0 to turn the certificate inventory off", Probe: x.probeConfig, Needs: []string{checkEnvironments}})
	}
	return uses
}

// describe sums up the configuration.
func (x *exporterCheck) describe() string {
	c, f := x.h.common, x.cl.run
	parts := []string{"API " + c.apiURL}
	if c.simulate {
		parts[0] = "the built-in simulator at " + c.apiURL + " (--simulate)"
	}
	if n := len(c.organizationIDs); n > 0 {
		parts = append(parts, fmt.Sprintf("%d organization(s)", n))
	}
	if n := len(c.environmentIDs); n > 0 {
		parts = append(parts, fmt.Sprintf("%d environment(s) by ID", n))
	}
	parts = append(parts, "granularity "+string(c.granularity), "poll every "+f.pollInterval.String())
	if c.shard.Count > 1 {
		parts = append(parts, fmt.Sprintf("shard %d of 0..%d", c.shard.Index, c.shard.Count-1))
	}
	if c.configFile != "" {
		parts = append(parts, "config file "+c.configFile)
	}
	if x.st.certificates {
		parts = append(parts, "TLS certificates every "+f.inventoryInterval.String())
	} else {
		parts = append(parts, "TLS certificate inventory off")
	}
	return strings.Join(parts, ", ")
}

func (x *exporterCheck) probeAccounts(ctx context.Context) (string, error) {
	c := x.h.common
	if len(c.organizationIDs) > 0 {
		id := c.organizationIDs[0]
		o, err := x.api.Accounts.Organization(ctx, id)
		if err != nil {
			return notFound("organization", id, err)
		}
		return fmt.Sprintf("organization %s is %q", id, o.Name), nil
	}
	id := c.environmentIDs[0]
	e, err := x.api.Accounts.Environment(ctx, id)
	if err != nil {
		return notFound("environment", id, err)
	}
	return fmt.Sprintf("environment %s is %q", id, e.Name), nil
}

// notFound turns the accounts service's "not found" for an ID into the
// scope's success (the service answered; the ID's own check says more).
func notFound(kind, id string, err error) (string, error) {
	if unknownID(err) {
		return fmt.Sprintf("the accounts service answers (it does not know %s %s: see below)", kind, id), nil
	}
	return "", err
}

// unknownID reports whether err is the API saying an ID does not exist
// (404, or 400 naming it).
func unknownID(err error) bool {
	s := platform.StatusCode(err)
	return s == http.StatusNotFound || s == http.StatusBadRequest
}

func (x *exporterCheck) probeMetrics(ctx context.Context) (string, error) {
	list, err := x.api.Metrics.Datasets(ctx)
	if err != nil {
		return "", err
	}
	x.st.listed = list
	return fmt.Sprintf("the Metrics API lists %d datasets", len(list)), nil
}

func (x *exporterCheck) probeConfig(ctx context.Context) (string, error) {
	env := x.st.environments[0]
	certs, err := x.api.Config.TLSCertificates(ctx, env)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("environment %s has %d TLS certificate(s)", env, len(certs)), nil
}

func organizationCheck(id string) string { return "organization " + id }

// organization is the check "organization <id>": it exists, the API
// client sees it, and it has properties to serve.
func (x *exporterCheck) organization(id string) preflight.Check {
	return preflight.Check{Name: organizationCheck(id), Needs: []string{preflight.ScopeCheck(platform.ScopeAccounts)}, Run: func(ctx context.Context) preflight.Result {
		o, err := x.api.Accounts.Organization(ctx, id)
		switch {
		case unknownID(err):
			return preflight.Fail("unknown to the platform, or not one API client %s may see (%v); check --organization-id (or EDGEPIPE_ORGANIZATION_ID)", x.h.common.clientID, err)
		case err != nil:
			return preflight.Fail("%v", err)
		}
		props, err := x.api.Accounts.Properties(ctx, id)
		switch {
		case err != nil:
			return preflight.Fail("%v", err)
		case len(props) == 0:
			return preflight.Fail("%q has no property, so no environment to export; check --organization-id (or EDGEPIPE_ORGANIZATION_ID)", o.Name)
		}
		return preflight.Pass("%q, %d properties", o.Name, len(props))
	}}
}

// environments is the check "environments": every environment given by
// ID exists, and the run's discovery (organizations, the config file's
// filter, the shard) leaves some to serve.
func (x *exporterCheck) environments(ctx context.Context) preflight.Result {
	c := x.h.common
	var unknown []string
	for _, id := range c.environmentIDs {
		_, err := x.api.Accounts.Environment(ctx, id)
		switch {
		case unknownID(err):
			unknown = append(unknown, id)
		case err != nil:
			return preflight.Fail("look up environment %s: %v", id, err)
		}
	}
	if len(unknown) > 0 {
		return preflight.Fail("unknown to the platform, or not ones API client %s may see: %s; check --environment-id (or EDGEPIPE_ENVIRONMENT_ID)",
			c.clientID, strings.Join(unknown, ", "))
	}
	served, err := x.h.environments(x.api).Environments(ctx)
	if err != nil {
		return preflight.Fail("%v", err)
	}
	x.st.environments = served
	var after []string
	if c.config.FiltersEnvironments() {
		after = append(after, "the environments include/exclude of --config.file "+c.configFile)
	}
	if c.shard.Count > 1 {
		after = append(after, fmt.Sprintf("shard %d of --shard.count=%d", c.shard.Index, c.shard.Count))
	}
	if len(served) == 0 {
		if len(after) == 0 {
			return preflight.Fail("no environment to serve: the organizations have none; check --organization-id and --environment-id")
		}
		return preflight.Fail("no environment to serve after %s; change them, or check --organization-id and --environment-id", strings.Join(after, " and "))
	}
	msg := fmt.Sprintf("%d served", len(served))
	if len(after) > 0 {
		msg += " after " + strings.Join(after, " and ")
	}
	return preflight.Pass("%s", msg)
}

// datasets is the check "datasets": --config.file fits the platform's
// datasets (as the run checks it at start), every --dataset exists and
// offers --granularity, and something is left to poll.
func (x *exporterCheck) datasets(context.Context) preflight.Result {
	c, g := x.h.common, x.h.common.granularity
	selected, warnings, err := c.config.Select(x.st.listed, true)
	if err != nil {
		return preflight.Fail("%v; fix --config.file", err)
	}
	choice := schedule.ChooseDatasets(selected, x.cl.run.datasets, g)
	if err := choice.Err(); err != nil {
		return preflight.Fail("--dataset: %v", err)
	}
	var names []string
	for _, ds := range selected {
		if choice.Want[ds.Name] != nil {
			x.st.datasets = append(x.st.datasets, ds)
			names = append(names, ds.Name)
		}
	}
	if len(names) == 0 {
		return preflight.Fail("no dataset offers granularity %s (%d listed): choose another --granularity", g, len(selected))
	}
	msg := fmt.Sprintf("%d polled at %s: %s", len(names), g, strings.Join(names, ", "))
	if c.configFile != "" {
		msg += "; --config.file fits"
	}
	if len(warnings) > 0 {
		msg += "; warnings: " + strings.Join(slices.Compact(warnings), "; ")
	}
	return preflight.Pass("%s", msg)
}

// otlp is the check "OTLP endpoint": an export request with no metric,
// through the exporter the run command builds (endpoint, protocol, TLS
// and the OTEL_EXPORTER_OTLP_* variables).
func (x *exporterCheck) otlp(ctx context.Context) preflight.Result {
	f := x.cl.run
	proto, _ := otel.Protocol(f.otlpProtocol) // validated with the flags
	endpoint := f.otlpEndpoint
	if endpoint == "" {
		endpoint = "$OTEL_EXPORTER_OTLP_ENDPOINT"
		if e := os.Getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"); e != "" {
			endpoint = "$OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
		}
	}
	fail := func(err error) preflight.Result {
		return preflight.Fail("%s (%s): %v; check --otlp.endpoint, --otlp.protocol and the OTEL_EXPORTER_OTLP_* variables (headers, certificates), and that the collector runs and this machine reaches it",
			endpoint, proto, err)
	}
	exp, err := otel.NewExporter(ctx, proto, f.otlpEndpoint)
	if err != nil {
		return fail(err)
	}
	res, err := otel.NewResource(ctx, x.h.version)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return fail(err)
	}
	if err := otel.Probe(ctx, exp, res); err != nil {
		return fail(err)
	}
	return preflight.Pass("%s (%s) takes an export request", endpoint, proto)
}
