package main

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/platformsim"
	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/logtable"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestCheck runs `rtld-receiver check` (the built binary) against the
// simulator over HTTP, a public URL served over TLS by a test CA's
// certificate (trusted through SSL_CERT_FILE, as a public CA is), a real
// ClickHouse 18.16 and a kfake broker: exit 0 only when everything is
// right, and for each thing that can be wrong a non-zero exit and a line
// naming it, the checks that need it skipped; no secret printed, nothing
// created (database, topic).
func TestCheck(t *testing.T) {
	bin := receiverBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ch := testenv.ClickHouse(t)
	kafka := testenv.Kafka(t)
	kafka.CreateTopic(t, "logs", 3)
	kafka.CreateTopic(t, "small", 2)
	kafka.SetTopicConfig(t, "small", "max.message.bytes", "100000")
	ca := testenv.NewCA(t)
	serve := func(hosts ...string) string {
		srv := httptest.NewUnstartedServer(http.NotFoundHandler())
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Certificate(t, hosts...)}, MinVersion: tls.VersionTLS12}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv.URL
	}
	publicURL := serve("127.0.0.1")

	// The demo client, one without the RTLD service's scope and one
	// without the Metrics API's.
	sim, err := platformsim.New(platformsim.Config{Seed: 5, Clients: []platformsim.Client{platformsim.DemoClient(),
		{ID: "rtld-less", Secret: platformsim.DemoClientSecret, Scopes: []string{platformsim.ScopeMetrics, platformsim.ScopeAccounts, platformsim.ScopeConfig}},
		{ID: "metrics-less", Secret: platformsim.DemoClientSecret, Scopes: []string{platformsim.ScopeRTLD, platformsim.ScopeAccounts, platformsim.ScopeConfig}}}})
	if err != nil {
		t.Fatal(err)
	}
	base, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	envs := sim.EnvironmentIDs()[:2]
	const rtldPassword, wrongSecret = "rtld-secret-6b1e", "wrong-secret-93d0"
	// The receiver's profile is in the first environment already.
	pc, err := platform.New(platform.Config{BaseURL: base, AuthURL: base, ClientID: platformsim.DemoClientID, ClientSecret: platformsim.DemoClientSecret})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := rtld.NewRegistrar(pc.RTLD(), rtld.RegistrarConfig{EnvironmentIDs: envs[:1], PublicURL: publicURL, Username: "platform", Password: rtldPassword})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}

	// access_logs as the sink makes it, and one a column of which cannot
	// hold its field.
	fits := ch.NewDatabase(t)
	sink, err := logtable.New(logtable.Config{DSN: ch.DSN(fits)})
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Check(ctx); err != nil {
		t.Fatal(err)
	}
	sink.Close()
	incompatible := ch.NewDatabase(t)
	ch.Exec(t, "CREATE TABLE "+incompatible+".access_logs (environment_id String, status_code Date) ENGINE = MergeTree ORDER BY environment_id")
	// A reconciliation table its writer cannot insert into.
	badCompleteness := ch.NewDatabase(t)
	ch.Exec(t, "CREATE TABLE "+badCompleteness+".log_completeness (environment_id String, time DateTime, api_requests Float64) ENGINE = MergeTree ORDER BY (environment_id, time)")

	const unknownEnv, absent = "0d5e0c1e-9a7b-4e62-8c57-5f1b6a2e9d40", "check_created_at_start"
	baseEnv := []string{
		"EDGEPIPE_CLIENT_ID=" + platformsim.DemoClientID, "EDGEPIPE_CLIENT_SECRET=" + platformsim.DemoClientSecret,
		"EDGEPIPE_RTLD_USERNAME=platform", "EDGEPIPE_RTLD_PASSWORD=" + rtldPassword, "SSL_CERT_FILE=" + ca.File(t),
		"EDGEPIPE_ENVIRONMENT_ID=" + strings.Join(envs, ","), "EDGEPIPE_PUBLIC_URL=" + publicURL,
		"EDGEPIPE_KAFKA_BROKERS=", "EDGEPIPE_CLICKHOUSE_DSN=", "EDGEPIPE_API_URL=" + base, "EDGEPIPE_AUTH_URL=",
	}
	sinks := []string{"--clickhouse.dsn=" + ch.DSN(absent), "--kafka.brokers=" + kafka.Addr(), "--kafka.topic=logs"}
	for _, tc := range []struct {
		name   string
		args   []string
		env    []string
		code   int
		want   []string // in this order in stdout
		absent []string
	}{
		{name: "all good", args: sinks,
			want: []string{"ok    configuration: API " + base + ", 2 environment(s), registers profile \"edgepipe\", reconciles with the Metrics API 30m0s after each bucket (counts from spool), sinks: Kafka, ClickHouse",
				"ok    spool directory:", "ok    credentials: " + base + "/connect/token issues tokens to API client edgepipe-demo",
				"ok    scope app.rtld: granted; the RTLD service lists ", " log fields",
				"ok    scope app.metrics: granted; the Metrics API lists 6 datasets",
				"ok    public URL: destination_endpoint " + publicURL + "/ingest/<environment_id>",
				"ok    public URL certificate: the certificate served at " + strings.TrimPrefix(publicURL, "https://") + ": for 127.0.0.1, issued by \"CN=edgepipe test CA\"",
				"ok    environments: 2 exist; profile \"edgepipe\" delivers here in 1, is created at start in 1",
				"ok    ClickHouse: clickhouse://" + ch.Addr() + "/" + absent + ": ClickHouse 18.16", "database " + absent + " does not exist yet (created at start)",
				"ok    ClickHouse tables: 4 tables: 0 exist and fit; created at start: `" + absent + "`.`access_logs`, `" + absent + "`.`access_logs_1m`, `" + absent + "`.`environments`, `" + absent + "`.`log_completeness`",
				"ok    Kafka: 1 broker(s) answer: " + kafka.Addr(),
				"ok    Kafka topic logs: exists, 3 partitions",
				"ok    Kafka message size: topic logs takes record batches of up to 1048588 bytes (the broker's message.max.bytes), at least --kafka.max-message-bytes (1048576)",
				"13 checks: 13 passed, 0 failed, 0 skipped"}},
		{name: "access_logs fits", args: []string{"--clickhouse.dsn=" + ch.DSN(fits)},
			want: []string{"database " + fits + " exists", "ok    ClickHouse tables: 4 tables: 3 exist and fit; created at start: `" + fits + "`.`log_completeness`", "0 failed"}},
		{name: "access_logs incompatible", args: []string{"--clickhouse.dsn=" + ch.DSN(incompatible)}, code: 1,
			want: []string{"FAIL  ClickHouse tables: column status_code of table access_logs has type Date, which cannot hold the field status_code",
				"ALTER TABLE access_logs MODIFY COLUMN status_code", "nothing was changed"}},
		{name: "log_completeness incompatible", args: []string{"--clickhouse.dsn=" + ch.DSN(badCompleteness)}, code: 1,
			want: []string{"FAIL  ClickHouse tables: ", "column api_requests of table log_completeness has type Float64, but edgepipe writes UInt64 values into it",
				"ALTER TABLE `log_completeness` MODIFY COLUMN `api_requests` UInt64"}},
		{name: "ClickHouse too old for HTTP", args: []string{"--clickhouse.dsn=http://" + ch.HTTPAddr() + "/" + fits}, code: 1,
			want: []string{"FAIL  ClickHouse: ClickHouse 18.16.1 at " + ch.HTTPAddr() + " cannot be used over HTTP", "use its native protocol instead",
				"      ClickHouse tables: skipped: needs ClickHouse"}},
		{name: "wrong secret", env: []string{"EDGEPIPE_CLIENT_SECRET=" + wrongSecret}, code: 1,
			want: []string{"FAIL  credentials: ", "refuses API client edgepipe-demo: wrong client ID or secret",
				"      scope app.rtld: skipped: needs credentials", "      environments: skipped: needs scope app.rtld"}},
		{name: "no app.rtld", env: []string{"EDGEPIPE_CLIENT_ID=rtld-less"}, code: 1,
			want: []string{"ok    credentials:", "accepts API client rtld-less (it refuses scope app.rtld: see that check)",
				"FAIL  scope app.rtld: the token endpoint refuses it", "invalid_scope", "grant scope app.rtld to API client rtld-less", "needs it for registering the access-log profiles, or pass --no-register",
				"      environments: skipped: needs scope app.rtld"}},
		{name: "unknown environment", args: []string{"--environment-id=" + unknownEnv}, code: 1,
			want: []string{"FAIL  environments: unknown to the platform, or not ones API client edgepipe-demo may see: " + unknownEnv, "check --environment-id"}},
		{name: "public URL not https", env: []string{"EDGEPIPE_PUBLIC_URL=http://127.0.0.1:9781"}, code: 1,
			want: []string{`FAIL  public URL: --public-url "http://127.0.0.1:9781" is not an https URL`,
				"      public URL certificate: skipped: needs public URL", "      environments: skipped: needs public URL"}},
		{name: "certificate for another host", env: []string{"EDGEPIPE_PUBLIC_URL=" + serve("rtld.example.net")}, code: 1,
			want: []string{"FAIL  public URL certificate: the certificate served at 127.0.0.1:", "it does not cover 127.0.0.1 (it is for rtld.example.net)"}},
		{name: "ClickHouse down", args: []string{"--clickhouse.dsn=clickhouse://" + testenv.FreeAddr(t) + "/cdn"}, code: 1,
			want: []string{"FAIL  ClickHouse: cannot connect", "      ClickHouse tables: skipped: needs ClickHouse"}},
		{name: "Kafka down", args: []string{"--kafka.brokers=" + testenv.FreeAddr(t)}, code: 1,
			want: []string{"FAIL  Kafka: kafka: connecting to", "check --kafka.brokers", "      Kafka topic cdn-access-logs: skipped: needs Kafka",
				"      Kafka message size: skipped: needs Kafka topic cdn-access-logs"}},
		{name: "topic too small", args: []string{"--kafka.brokers=" + kafka.Addr(), "--kafka.topic=small"}, code: 1,
			want: []string{"ok    Kafka topic small: exists, 2 partitions",
				"FAIL  Kafka message size: --kafka.max-message-bytes is 1048576 bytes, but topic small takes record batches of at most 100000 bytes (the topic's max.message.bytes)",
				"set --kafka.max-message-bytes=100000 and --ingest.max-record-bytes at most that (it is 524288), or raise the topic's max.message.bytes to 1048576"}},
		{name: "topic missing", args: []string{"--kafka.brokers=" + kafka.Addr(), "--kafka.topic=absent", "--no-kafka.create-topic"}, code: 1,
			want: []string{"FAIL  Kafka topic absent: does not exist, and --kafka.create-topic=false", "      Kafka message size: skipped: needs Kafka topic absent"}},
		{name: "topic created at start", args: []string{"--kafka.brokers=" + kafka.Addr(), "--kafka.topic=later"},
			want: []string{"ok    Kafka topic later: does not exist yet: the receiver creates it at start (--kafka.create-topic, 6 partitions)",
				"ok    Kafka message size: a topic created at start takes record batches of up to 1048588 bytes (the broker's message.max.bytes)", "0 failed"}},
		{name: "no register, no reconciliation", args: []string{"--no-register", "--reconcile.delay=0"},
			want:   []string{"ok    configuration: 2 environment(s), profiles managed elsewhere (--no-register), no reconciliation (--reconcile.delay=0), sinks: none", "2 checks: 2 passed"},
			absent: []string{"credentials", "public URL"}},
		{name: "no register, reconciling", args: []string{"--no-register"},
			want: []string{"ok    configuration: API " + base + ", 2 environment(s), profiles managed elsewhere (--no-register), reconciles with the Metrics API",
				"ok    credentials:", "issues tokens to API client edgepipe-demo", "ok    scope app.metrics: granted", "4 checks: 4 passed"},
			absent: []string{"app.rtld", "public URL", "environments"}},
		{name: "no register, reconciliation lacks the API", args: []string{"--no-register"}, env: []string{"EDGEPIPE_API_URL="},
			want:   []string{"ok    configuration: 2 environment(s), profiles managed elsewhere (--no-register), no reconciliation (no --api.url)", "2 checks: 2 passed"},
			absent: []string{"credentials"}},
		{name: "no app.metrics", env: []string{"EDGEPIPE_CLIENT_ID=metrics-less"}, code: 1,
			want: []string{"ok    scope app.rtld", "FAIL  scope app.metrics: the token endpoint refuses it", "grant scope app.metrics to API client metrics-less",
				"needs it for comparing the logs with the Metrics API (reconciliation), or set --reconcile.delay=0 to turn reconciliation off",
				"ok    environments"}},
		{name: "no app.metrics, reconciliation off", args: []string{"--reconcile.delay=0"}, env: []string{"EDGEPIPE_CLIENT_ID=metrics-less"},
			want: []string{"no reconciliation (--reconcile.delay=0)", "ok    scope app.rtld", "ok    environments", "0 failed, 0 skipped"}, absent: []string{"scope app.metrics"}},
		{name: "reconciliation settings the receiver refuses", args: []string{"--reconcile.counts=clickhouse"}, code: 1,
			want: []string{"FAIL  configuration: --reconcile.counts=clickhouse needs --clickhouse.dsn", "1 checks"}},
		{name: "a flag the receiver refuses", args: []string{"--log-metrics.top-n=0"}, code: 1,
			want: []string{"FAIL  configuration: --log-metrics.top-n must be at least 1", "1 checks"}},
		{name: "no RTLD password", env: []string{"EDGEPIPE_RTLD_PASSWORD="}, code: 1,
			want: []string{"FAIL  configuration: EDGEPIPE_RTLD_USERNAME and EDGEPIPE_RTLD_PASSWORD (or --rtld.password-file) must be set", "1 checks"}},
		{name: "simulate", args: []string{"--simulate"}, env: []string{"EDGEPIPE_ENVIRONMENT_ID=", "EDGEPIPE_PUBLIC_URL=", "EDGEPIPE_API_URL="},
			want: []string{"ok    configuration: the built-in simulator at http://127.0.0.1:", "3 environment(s)", "ok    scope app.rtld",
				"ok    scope app.metrics", "ok    environments: 3 exist", "0 failed"}, absent: []string{"public URL"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"check", "--spool.dir=" + t.TempDir(), "--log.level=warn"}, tc.args...)
			env := append(append([]string(nil), baseEnv...), tc.env...)
			stdout, stderr, code := testenv.RunCommand(t, bin, args, env...)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			testenv.CheckInOrder(t, stdout, tc.want)
			for _, a := range append(tc.absent, platformsim.DemoClientSecret, wrongSecret, rtldPassword) {
				if strings.Contains(stdout, a) || strings.Contains(stderr, a) {
					t.Errorf("output shows %q", a)
				}
			}
			if t.Failed() {
				t.Logf("%s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), stdout, stderr)
			}
		})
	}
	if n := ch.QueryUint64(t, "SELECT count() FROM system.databases WHERE name = '"+absent+"'"); n != 0 {
		t.Errorf("check created database %s", absent)
	}
	topics := testenv.KcatTopics(t, kafka.Addr())
	if _, ok := topics["later"]; ok {
		t.Error("check created topic later")
	}
	if topics["logs"] != 3 || topics["small"] != 2 {
		t.Errorf("topics as kcat lists them: %v", topics)
	}
}
