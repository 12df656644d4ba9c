package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/edgepipe/edgepipe/internal/metricsapi"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/metrictables"
	"github.com/edgepipe/edgepipe/internal/sinks/otel/otlptest"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestCheck runs `exporter check` (the built binary) against the
// simulator over HTTP, a real ClickHouse 18.16 and an OTLP receiver, once
// for a configuration where everything is right and once for each thing
// that can be wrong: the exit code is 0 only in the first case, each
// failure's line names the problem and what to fix, the checks that need
// a failed one say "skipped: needs …", no secret is printed, and nothing
// is created (the database, the tables' columns).
func TestCheck(t *testing.T) {
	bin := exporterBin(t)
	ch := testenv.ClickHouse(t)
	otlp, otlpAddr := otlptest.StartGRPC(t)
	dir := t.TempDir()
	writeFile := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	lean, err := filepath.Abs("../../examples/lean.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// A table of an older edgepipe: the run adds the dataset's metrics.
	older := ch.NewDatabase(t)
	ch.Exec(t, "CREATE TABLE "+older+".origin_offload (time DateTime, granularity String, environment_id String, version UInt64) "+
		"ENGINE = ReplacingMergeTree(version) ORDER BY (granularity, environment_id, time)")
	// A table whose column cannot hold the dataset's metric: the run would
	// fail, so check fails and names the statement that fixes it.
	incompatible := ch.NewDatabase(t)
	ch.Exec(t, "CREATE TABLE "+incompatible+".origin_offload (time DateTime, granularity String, environment_id String, version UInt64, requests_edge_total Date) "+
		"ENGINE = ReplacingMergeTree(version) ORDER BY (granularity, environment_id, time)")
	const (
		org          = "--organization-id=" + platformsim.DemoOrganizationID
		unknownID    = "0d5e0c1e-9a7b-4e62-8c57-5f1b6a2e9d40"
		wrongSecret  = "wrong-secret-4f2a9c"
		createdLater = "check_created_at_start"
	)
	demo := func(scopes ...string) []platformsim.Client {
		return []platformsim.Client{platformsim.DemoClient(scopes...)}
	}
	noDSN := "EDGEPIPE_CLICKHOUSE_DSN="
	for _, tc := range []struct {
		name    string
		clients []platformsim.Client // nil: the demo client with every scope
		args    []string
		env     []string
		code    int
		want    []string // in this order in stdout
		absent  []string
	}{
		{name: "all good", args: []string{org, "--clickhouse.dsn=" + ch.DSN(createdLater), "--otlp.endpoint=http://" + otlpAddr,
			"--state.dir=" + filepath.Join(dir, "state"), "--config.file=" + lean},
			want: []string{"ok    configuration: API http://127.0.0.1:", "1 organization(s), granularity FIVE_MINUTES", "config file " + lean,
				"ok    state directory: " + filepath.Join(dir, "state") + " does not exist yet; created at start in " + dir,
				"ok    credentials: http://127.0.0.1:", "/connect/token issues tokens to API client edgepipe-demo",
				"ok    scope app.accounts: granted; organization " + platformsim.DemoOrganizationID + ` is "Edgepipe Demo"`,
				"ok    scope app.metrics: granted; the Metrics API lists 6 datasets",
				"ok    organization " + platformsim.DemoOrganizationID + `: "Edgepipe Demo", 3 properties`,
				"ok    environments: 25 served",
				"ok    scope app.config: granted; environment ",
				"ok    datasets: 6 polled at FIVE_MINUTES: edge_usage_by_country, ", "--config.file fits",
				"ok    ClickHouse: clickhouse://" + ch.Addr() + "/" + createdLater + ": ClickHouse 18.16", "database " + createdLater + " does not exist yet (created at start)",
				"ok    ClickHouse tables: 8 tables: 0 exist and fit; created at start: `" + createdLater + "`.`edge_usage_by_country__by_environment_id`, ",
				"`" + createdLater + "`.`environments`, `" + createdLater + "`.`tls_certificates`",
				"ok    OTLP endpoint: http://" + otlpAddr + " (grpc) takes an export request",
				"12 checks: 12 passed, 0 failed, 0 skipped"}},
		{name: "table of an older version", args: []string{org, "--clickhouse.dsn=" + ch.DSN(older), "--dataset=origin_offload", "--inventory.interval=0"},
			want: []string{"ok    datasets: 1 polled at FIVE_MINUTES: origin_offload",
				"ok    ClickHouse tables: 2 tables: 0 exist and fit; columns added at start: `" + older + "`.`origin_offload` (http_method, content_type, requests_edge_total, ",
				"created at start: `" + older + "`.`environments`", "0 failed"}},
		{name: "table incompatible", args: []string{org, "--clickhouse.dsn=" + ch.DSN(incompatible), "--dataset=origin_offload", "--inventory.interval=0"}, code: 1,
			want: []string{"FAIL  ClickHouse tables: ", "column requests_edge_total of table origin_offload has type Date, but edgepipe writes UInt64 values into it",
				"ALTER TABLE `origin_offload` MODIFY COLUMN `requests_edge_total` UInt64", "nothing was changed"}},
		{name: "wrong secret", args: []string{org}, env: []string{envClientSecret + "=" + wrongSecret}, code: 1,
			want: []string{"FAIL  credentials: http://127.0.0.1:", "refuses API client edgepipe-demo: wrong client ID or secret", "invalid_client",
				"set $EDGEPIPE_CLIENT_ID and the client secret",
				"      scope app.accounts: skipped: needs credentials", "      environments: skipped: needs scope app.accounts",
				"      datasets: skipped: needs scope app.metrics", "1 failed, 6 skipped"}},
		{name: "no app.accounts", clients: demo(platformsim.ScopeMetrics, platformsim.ScopeConfig), args: []string{org}, code: 1,
			want: []string{"ok    credentials:", "accepts API client edgepipe-demo (it refuses scope app.accounts: see that check)",
				"FAIL  scope app.accounts: the token endpoint refuses it", "invalid_scope", "grant scope app.accounts to API client edgepipe-demo",
				"ok    scope app.metrics", "      organization " + platformsim.DemoOrganizationID + ": skipped: needs scope app.accounts",
				"      scope app.config: skipped: needs environments", "ok    datasets"}},
		{name: "no app.metrics", clients: demo(platformsim.ScopeAccounts, platformsim.ScopeConfig), args: []string{org}, code: 1,
			want: []string{"ok    scope app.accounts", "FAIL  scope app.metrics: the token endpoint refuses it", "needs it for polling the Metrics API",
				"ok    environments: 25 served", "ok    scope app.config", "      datasets: skipped: needs scope app.metrics"}},
		{name: "no app.config", clients: demo(platformsim.ScopeAccounts, platformsim.ScopeMetrics), args: []string{org}, code: 1,
			want: []string{"ok    environments", "FAIL  scope app.config: the token endpoint refuses it", "needs it for the TLS certificate inventory",
				"or set --inventory.interval=0 to turn the certificate inventory off", "ok    datasets"}},
		{name: "no app.config, inventory off", clients: demo(platformsim.ScopeAccounts, platformsim.ScopeMetrics), args: []string{org, "--inventory.interval=0"},
			want: []string{"TLS certificate inventory off", "ok    environments: 25 served", "ok    datasets", "0 failed, 0 skipped"}, absent: []string{"app.config"}},
		{name: "unknown organization", args: []string{"--organization-id=" + unknownID}, code: 1,
			want: []string{"ok    scope app.accounts: granted; the accounts service answers (it does not know organization " + unknownID,
				"FAIL  organization " + unknownID + ": unknown to the platform, or not one API client edgepipe-demo may see", "404",
				"check --organization-id", "      environments: skipped: needs organization " + unknownID}},
		{name: "unknown environment", args: []string{org, "--environment-id=" + unknownID}, code: 1,
			want: []string{"ok    organization", "FAIL  environments: unknown to the platform, or not ones API client edgepipe-demo may see: " + unknownID,
				"check --environment-id", "      scope app.config: skipped: needs environments"}},
		{name: "unknown dataset", args: []string{org, "--dataset=origin_offload", "--dataset=origin_offlaod"}, code: 1,
			want: []string{`FAIL  datasets: --dataset: unknown dataset "origin_offlaod": the platform offers these datasets at FIVE_MINUTES: edge_errors, `}},
		{name: "unknown dataset in the config file", args: []string{org, "--config.file=" + writeFile("typo.yaml", "datasets:\n  edge_usage:\n    dimensions: []\n")}, code: 1,
			want: []string{"FAIL  datasets: config file " + filepath.Join(dir, "typo.yaml") + " does not fit the platform's datasets", "datasets.edge_usage: unknown dataset", "fix --config.file"}},
		{name: "ClickHouse down", args: []string{org, "--clickhouse.dsn=clickhouse://" + testenv.FreeAddr(t) + "/cdn"}, code: 1,
			want: []string{"ok    datasets", "FAIL  ClickHouse: cannot connect", "check --clickhouse.dsn", "      ClickHouse tables: skipped: needs ClickHouse"}},
		{name: "OTLP collector down", args: []string{org, "--otlp.endpoint=http://" + testenv.FreeAddr(t)}, code: 1,
			want: []string{"FAIL  OTLP endpoint: http://127.0.0.1:", "(grpc):", "check --otlp.endpoint"}},
		{name: "a flag the run refuses", args: []string{org, "--prometheus.max-series=-1"}, code: 1,
			want: []string{"FAIL  configuration: --prometheus.max-series must not be negative, got -1; the other checks need a configuration the program accepts",
				"1 checks: 0 passed, 1 failed, 0 skipped"}, absent: []string{"credentials"}},
		{name: "no credentials", args: []string{org}, env: []string{envClientID + "="}, code: 1,
			want: []string{"FAIL  configuration: API credentials missing: set $EDGEPIPE_CLIENT_ID"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, base := startSim(t, platformsim.Config{Seed: 5, Clients: tc.clients})
			args := append([]string{"check", "--api.url=" + base, "--log.level=warn"}, tc.args...)
			env := append([]string{noDSN}, tc.env...)
			stdout, stderr, code := testenv.RunCommand(t, bin, args, env...)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			testenv.CheckInOrder(t, stdout, tc.want)
			for _, a := range append(tc.absent, platformsim.DemoClientSecret, wrongSecret) {
				if strings.Contains(stdout, a) || strings.Contains(stderr, a) {
					t.Errorf("output shows %q", a)
				}
			}
			if t.Failed() {
				t.Logf("%s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), stdout, stderr)
			}
		})
	}
	// Nothing was created or changed.
	if n := ch.QueryUint64(t, "SELECT count() FROM system.databases WHERE name = '"+createdLater+"'"); n != 0 {
		t.Errorf("check created database %s", createdLater)
	}
	if n := ch.QueryUint64(t, "SELECT count() FROM system.columns WHERE database = '"+older+"'"); n != 4 {
		t.Errorf("check changed %s: %d columns, want the 4 it had", older, n)
	}
	if _, err := os.Stat(filepath.Join(dir, "state")); !os.IsNotExist(err) {
		t.Errorf("check created the state directory: %v", err)
	}
	// The OTLP check sent one export request with no point.
	if n := otlp.Requests(); n != 1 {
		t.Errorf("the OTLP receiver got %d requests, want 1", n)
	}
}

// TestCheckHTTPS26 runs `exporter check` over HTTPS against ClickHouse
// 26.x (chDB behind testenv's server) whose tables the sink made for every
// dataset (LowCardinality, codecs): they exist and fit, the inventory's
// environments table is created at start, and the CA file flag reaches
// the read-only connection.
func TestCheckHTTPS26(t *testing.T) {
	ch := testenv.ChDB(t)
	_, base := startSim(t, platformsim.Config{Seed: 5})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pc, err := platform.New(platform.Config{BaseURL: base, AuthURL: base, ClientID: platformsim.DemoClientID, ClientSecret: platformsim.DemoClientSecret})
	if err != nil {
		t.Fatal(err)
	}
	datasets, err := metricsapi.NewClient(pc.Metrics()).Datasets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tls := clickhouse.TLSOptions{CAFile: ch.CAFile()}
	db, err := clickhouse.Open(ctx, ch.HTTPSDSN("check26"), clickhouse.WithTLS(tls))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	schema := clickhouse.NewSchema(db, slog.New(slog.DiscardHandler))
	defer schema.Close()
	for i := range datasets {
		ds := &datasets[i]
		if _, err := schema.Ensure(ctx, metrictables.TableSpec(metrictables.TableName(ds), metrictables.MetricsColumns(ds, nil, nil), db.Version(), 0)); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"check", "--api.url=" + base, "--log.level=warn", "--organization-id=" + platformsim.DemoOrganizationID, "--inventory.interval=0",
		"--clickhouse.dsn=" + ch.HTTPSDSN("check26"), "--clickhouse.tls.ca-file=" + ch.CAFile()}
	stdout, stderr, code := testenv.RunCommand(t, exporterBin(t), args, "EDGEPIPE_CLICKHOUSE_DSN=")
	want := []string{"ok    ClickHouse: https://" + ch.HTTPSAddr() + "/check26?secure=true: ClickHouse 26.", "over http at " + ch.HTTPSAddr() + "; database check26 exists",
		"ok    ClickHouse tables: 7 tables: 6 exist and fit; created at start: `check26`.`environments`", "0 failed, 0 skipped"}
	if !testenv.CheckInOrder(t, stdout, want) || code != 0 {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// TestCheckTakesTheRunFlags: `exporter check` has every flag of the run
// command (the extensions' included) with the same default, variable and
// visibility, and its parsed values land where the run command reads them.
func TestCheckTakesTheRunFlags(t *testing.T) {
	cl := newCommandLine(io.Discard, io.Discard)
	var run, check *kingpin.CmdModel
	for _, c := range cl.app.Model().Commands {
		switch c.Name {
		case "run":
			run = c
		case "check":
			check = c
		}
	}
	if len(run.Flags) < 25 || len(check.Flags) != len(run.Flags) {
		t.Fatalf("run has %d flags, check %d", len(run.Flags), len(check.Flags))
	}
	for i, r := range run.Flags {
		c := check.Flags[i]
		if c.Name != r.Name || !slices.Equal(c.Default, r.Default) || c.Envar != r.Envar || c.Hidden != r.Hidden || c.Help != r.Help {
			t.Errorf("check --%s %+v, run --%s %+v", c.Name, c, r.Name, r)
		}
	}
	t.Setenv("EDGEPIPE_CLICKHOUSE_DSN", "clickhouse://ch:9000/cdn")
	if _, err := cl.app.Parse([]string{"check", "--poll-interval=5m", "--dataset=a", "--dataset=b"}); err != nil {
		t.Fatal(err)
	}
	ext := cl.exts[0].(*clickhouseExtension)
	if cl.run.pollInterval != 5*time.Minute || !slices.Equal(cl.run.datasets, []string{"a", "b"}) || cl.run.inventoryInterval != time.Hour ||
		ext.flags.dsn != "clickhouse://ch:9000/cdn" || ext.flags.queueRows == 0 {
		t.Errorf("parsed: poll %s, datasets %v, inventory %s, dsn %q, queue %d", cl.run.pollInterval, cl.run.datasets, cl.run.inventoryInterval, ext.flags.dsn, ext.flags.queueRows)
	}
}
