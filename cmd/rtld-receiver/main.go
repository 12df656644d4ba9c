// Command rtld-receiver registers an http_post real-time log delivery
// profile in each configured environment, accepts the platform's log
// batches, makes each one durable in an on-disk spool before acknowledging
// it, and delivers every record to Kafka and ClickHouse.
//
// # Commands
//
// run (the default) is the receiver. A record a sink rejects for good (too
// large for the topic, refused by the table) is set aside in the dead-letter
// store under <spool.dir>/dead-letter/<sink>/ and the sink moves on.
//
// dead-letter list shows the dead letters; dead-letter replay [--sink S]
// delivers them again through the same sink code (with the same flags as
// the receiver, after the operator fixed the topic or table) and removes
// what the sink acknowledged. Replay is safe while the receiver runs.
//
// check (check.go) tries, once, each setting, credential and endpoint the
// receiver would use with the same flags, one line per check, and exits 0
// only when every check passed.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/units"
	rungroup "github.com/oklog/run"
	"github.com/prometheus/common/model"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/edgepipe/edgepipe/internal/cli"
	"github.com/edgepipe/edgepipe/internal/platform"
	"github.com/edgepipe/edgepipe/internal/rtld"
	"github.com/edgepipe/edgepipe/internal/rtld/deadletter"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
	"github.com/edgepipe/edgepipe/internal/rtld/receiver"
	"github.com/edgepipe/edgepipe/internal/rtld/reconcile"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/logtable"
	kafkasink "github.com/edgepipe/edgepipe/internal/sinks/kafka"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, cli.ErrPrinted) { // ErrPrinted: the metrics were described
		fmt.Fprintln(os.Stderr, "rtld-receiver:", err)
		os.Exit(1)
	}
}

// Commands.
const (
	cmdRun              = "run"
	cmdDeadLetterList   = "dead-letter list"
	cmdDeadLetterReplay = "dead-letter replay"
	cmdCheck            = "check"
)

// flags holds the parsed command line.
type flags struct {
	app                 *cli.App
	platform            *cli.Platform
	publicURL           string
	profileName         string
	fields              string
	register            bool
	registerInterval    time.Duration
	kafkaBrokers        string
	kafkaTopic          string
	kafkaCompression    string
	kafkaCreateTopic    bool
	kafkaPartitions     int
	kafkaReplication    int
	kafkaTLS            bool
	kafkaTLSCAFile      string
	kafkaTLSCertFile    string
	kafkaTLSKeyFile     string
	kafkaTLSInsecure    bool
	kafkaSASLMechanism  string
	kafkaWriteTimeout   time.Duration
	clickhouseDSN       string
	clickhouseCluster   string
	clickhouseQuorum    int
	clickhouseRetention model.Duration
	clickhouseTLS       clickhouse.TLSOptions
	spoolDir            string
	spoolMaxBytes       units.Base2Bytes
	spoolSegmentBytes   units.Base2Bytes
	maxBodyBytes        units.Base2Bytes
	maxDecodedBytes     units.Base2Bytes
	maxInFlight         int
	maxRecordBytes      units.Base2Bytes
	maxMemoryBytes      units.Base2Bytes
	bodyTimeout         time.Duration
	retryAfter          time.Duration
	gapGrace            time.Duration
	ingestFirst         bool
	logMetrics          logMetricsFlags
	reconcile           reconcileFlags
	simulate            bool
	simTrafficScale     float64
	simEnvironments     int
	web                 *cli.Web

	// Secrets (the API client's are in platform).
	rtldUsername, rtldPassword   *cli.Secret
	kafkaUsername, kafkaPassword *cli.Secret
	clickhousePassword           *cli.Secret

	// The sinks' limits, the dead-letter store and its commands.
	command              string // cmdRun, cmdDeadLetterList or cmdDeadLetterReplay
	kafkaMaxMessageBytes units.Base2Bytes
	deadLetterMaxBytes   units.Base2Bytes
	deadLetterSink       string
	deadLetterJSON       bool
	replayTimeout        time.Duration
}

// parseFlags parses args, writing help and errors nowhere (tests).
func parseFlags(args []string) (*flags, error) {
	f := newCommandLine(io.Discard, io.Discard)
	cmd, err := f.app.Parse(args)
	if err != nil {
		return nil, err
	}
	f.resolve(cmd)
	return f, nil
}

// newCommandLine declares the receiver's flags and commands.
func newCommandLine(stdout, stderr io.Writer) *flags {
	app := cli.New("rtld-receiver", "Receives the CDN platform's real-time access logs (RTLD http_post) and delivers every record to Kafka and ClickHouse, durably and exactly once under FINAL.\n\n"+
		"Secrets come only from the environment, a file named by the same variable with _FILE appended, or a file named by a --…-file flag: EDGEPIPE_CLIENT_ID, EDGEPIPE_CLIENT_SECRET (API client; --client-secret-file), EDGEPIPE_RTLD_USERNAME, EDGEPIPE_RTLD_PASSWORD (HTTP basic credentials of the profile, required on every batch; --rtld.password-file), EDGEPIPE_CLICKHOUSE_PASSWORD (optional; --clickhouse.password-file), EDGEPIPE_KAFKA_USERNAME, EDGEPIPE_KAFKA_PASSWORD (with --kafka.sasl.mechanism; --kafka.password-file).",
		stdout, stderr)
	f := &flags{app: app, platform: cli.AddPlatformFlags(app),
		rtldUsername: cli.EnvSecret("EDGEPIPE_RTLD_USERNAME"), kafkaUsername: cli.EnvSecret("EDGEPIPE_KAFKA_USERNAME")}
	f.rtldPassword = cli.SecretFlag(app, "rtld.password-file", "EDGEPIPE_RTLD_PASSWORD",
		"File holding the password of the HTTP basic credentials written into each profile and required on every batch (the user name comes from $EDGEPIPE_RTLD_USERNAME).")
	app.Flag("public-url", "Base https URL the platform reaches this receiver at; each profile's destination_endpoint is <public-url>/ingest/<environment_id>.").Envar("EDGEPIPE_PUBLIC_URL").StringVar(&f.publicURL)
	app.Flag("profile-name", "Name of the RTLD profile the receiver owns in each environment.").Default(rtld.DefaultProfileName).StringVar(&f.profileName)
	app.Flag("fields", "Comma-separated log-field codes to request (default: every field the fields API lists).").StringVar(&f.fields)
	app.Flag("register", "Create or repair the RTLD profile in each environment (--no-register to manage profiles yourself).").Default("true").BoolVar(&f.register)
	app.Flag("register.interval", "How often profiles are re-checked and repaired.").Default(rtld.DefaultRegisterInterval.String()).DurationVar(&f.registerInterval)
	app.Flag("kafka.brokers", "Comma-separated Kafka bootstrap brokers; enables the Kafka sink.").Envar("EDGEPIPE_KAFKA_BROKERS").StringVar(&f.kafkaBrokers)
	app.Flag("kafka.topic", "Kafka topic for the records.").Default(kafkasink.DefaultTopic).StringVar(&f.kafkaTopic)
	app.Flag("kafka.compression", "Kafka compression: none, gzip, snappy, lz4, zstd.").Default(kafkasink.DefaultCompression).EnumVar(&f.kafkaCompression, "none", "gzip", "snappy", "lz4", "zstd")
	app.Flag("kafka.create-topic", "Create the topic if it does not exist (otherwise it must exist).").Default("true").BoolVar(&f.kafkaCreateTopic)
	app.Flag("kafka.partitions", "Partitions of a topic the receiver creates.").Default(strconv.Itoa(kafkasink.DefaultPartitions)).IntVar(&f.kafkaPartitions)
	app.Flag("kafka.replication-factor", "Replication factor of a topic the receiver creates (-1: the broker's default).").Default(strconv.Itoa(kafkasink.DefaultReplicationFactor)).IntVar(&f.kafkaReplication)
	app.Flag("kafka.tls", "Connect to the Kafka brokers with TLS (the system's CA certificates unless --kafka.tls.ca-file).").BoolVar(&f.kafkaTLS)
	app.Flag("kafka.tls.ca-file", "PEM file of the CA certificates the brokers' certificates must chain to (needs --kafka.tls).").PlaceHolder("FILE").StringVar(&f.kafkaTLSCAFile)
	app.Flag("kafka.tls.cert-file", "PEM client certificate for mutual TLS (with --kafka.tls.key-file; needs --kafka.tls).").PlaceHolder("FILE").StringVar(&f.kafkaTLSCertFile)
	app.Flag("kafka.tls.key-file", "PEM key of --kafka.tls.cert-file.").PlaceHolder("FILE").StringVar(&f.kafkaTLSKeyFile)
	app.Flag("kafka.tls.insecure-skip-verify", "FOR TESTING ONLY: accept any broker certificate (anyone on the path can read and alter the traffic).").BoolVar(&f.kafkaTLSInsecure)
	app.Flag("kafka.max-message-bytes", "Largest record batch the Kafka brokers accept (their message.max.bytes or the topic's max.message.bytes); the writer's batches stay under it and a record too large for it alone is dead-lettered for Kafka (it still reaches ClickHouse). Must be at least --ingest.max-record-bytes.").Default(units.Base2Bytes(kafkasink.DefaultMaxMessageBytes).String()).BytesVar(&f.kafkaMaxMessageBytes)
	app.Flag("kafka.write-timeout", "How long a produce request may wait for the brokers' acknowledgement (acks=all). A request without an answer by then is unconfirmed: its partition's leader is probed until it answers and the request is sent again, so its records may be in the topic twice (counted in edgepipe_rtld_sink_partition_unconfirmed_records_total). Other partitions go on meanwhile.").Default(kafkasink.DefaultWriteTimeout.String()).DurationVar(&f.kafkaWriteTimeout)
	app.Flag("kafka.sasl.mechanism", "Kafka SASL mechanism: none, plain, scram-sha-256, scram-sha-512. The username comes only from $EDGEPIPE_KAFKA_USERNAME (or the file named by $EDGEPIPE_KAFKA_USERNAME_FILE), the password as --kafka.password-file says.").Default(kafkasink.SASLNone).EnumVar(&f.kafkaSASLMechanism, kafkasink.SASLMechanisms...)
	f.kafkaPassword = cli.SecretFlag(app, "kafka.password-file", "EDGEPIPE_KAFKA_PASSWORD", "File holding the Kafka SASL password (with --kafka.sasl.mechanism).")
	app.Flag("clickhouse.dsn", "ClickHouse DSN, enables the ClickHouse sink (table access_logs): clickhouse://127.0.0.1:9000/cdn (native protocol), http://HOST:8123/cdn or https://HOST:8443/cdn?secure=true (HTTP interface, ClickHouse 23.3 on). The password goes in $EDGEPIPE_CLICKHOUSE_PASSWORD or --clickhouse.password-file, not here.").Envar("EDGEPIPE_CLICKHOUSE_DSN").PlaceHolder("clickhouse://HOST:9000/DB").StringVar(&f.clickhouseDSN)
	app.Flag("clickhouse.tls.ca-file", "With a DSN that uses TLS (https://…?secure=true, clickhouse://…?secure=true): PEM file of the CA certificates the server's certificate must chain to (default: the system's).").PlaceHolder("FILE").StringVar(&f.clickhouseTLS.CAFile)
	app.Flag("clickhouse.tls.server-name", "With TLS: the name the server's certificate must be valid for (default: the DSN's host).").PlaceHolder("NAME").StringVar(&f.clickhouseTLS.ServerName)
	app.Flag("clickhouse.tls.insecure-skip-verify", "FOR TESTING ONLY: accept any ClickHouse server certificate (anyone on the path can read and alter the traffic).").BoolVar(&f.clickhouseTLS.InsecureSkipVerify)
	f.clickhousePassword = cli.SecretFlag(app, "clickhouse.password-file", "EDGEPIPE_CLICKHOUSE_PASSWORD", "File holding the ClickHouse password.")
	app.Flag("clickhouse.cluster", "The cluster (remote_servers) the DSN's server belongs to: a Replicated access_logs_local on every node and a Distributed access_logs sharded by record identity, created ON CLUSTER, checked and completed on every node; a delivery counts once its rows are on their shards (insert_distributed_sync=1). Needs macros {shard} and {replica}.").PlaceHolder("NAME").StringVar(&f.clickhouseCluster)
	app.Flag("clickhouse.insert-quorum", "With --clickhouse.cluster: a delivery counts only once this many replicas of each shard have its rows (insert_quorum; 0 = one replica).").Default("0").IntVar(&f.clickhouseQuorum)
	app.Flag("clickhouse.retention", "Drop access-log records older than this from access_logs and its per-minute rollup access_logs_1m, e.g. 30d: a table TTL from ClickHouse 19.6 on; on older servers whole days are dropped once all their records are older. 0 keeps everything.").Default("0s").SetValue(&f.clickhouseRetention)
	app.Flag("spool.dir", "Directory of the on-disk spool where accepted batches wait until every sink has them.").Default("./data/spool").StringVar(&f.spoolDir)
	app.Flag("spool.max-bytes", "Size bound of the spool; when reached, ingest answers 503 with Retry-After (the platform retries) and drops nothing.").Default("10GiB").BytesVar(&f.spoolMaxBytes)
	app.Flag("spool.segment-bytes", "Size of one spool segment file (0: a sixteenth of --spool.max-bytes, between 1MiB and 64MiB).").Default("0").BytesVar(&f.spoolSegmentBytes)
	app.Flag("ingest.max-body-bytes", "Largest request body as sent (gzip); 413 beyond.").Default(units.Base2Bytes(rtld.DefaultMaxBodyBytes).String()).BytesVar(&f.maxBodyBytes)
	app.Flag("ingest.max-decoded-bytes", "Largest request body after decompression; 413 beyond.").Default(units.Base2Bytes(rtld.DefaultMaxDecodedBytes).String()).BytesVar(&f.maxDecodedBytes)
	app.Flag("ingest.max-record-bytes", "Largest single record (JSON); a batch holding a bigger one gets 413. At most --kafka.max-message-bytes when Kafka is enabled.").Default(units.Base2Bytes(rtld.DefaultMaxRecordBytes).String()).BytesVar(&f.maxRecordBytes)
	app.Flag("ingest.max-in-flight", "Received requests decompressed, decoded and spooled at once; a request waits briefly for a slot, then gets 503 with Retry-After. A slot is taken only once the body has arrived.").Default(strconv.Itoa(rtld.DefaultMaxInFlight)).IntVar(&f.maxInFlight)
	// Memory and slow senders (see the sizing rule in docs/deployment.md).
	app.Flag("ingest.max-memory-bytes", "Memory for request bodies in flight, as received and decompressed; a request beyond it waits briefly, then gets 503 with Retry-After. Size the memory limit from it: see the sizing rule in docs/deployment.md.").Default(units.Base2Bytes(rtld.DefaultMaxMemoryBytes).String()).BytesVar(&f.maxMemoryBytes)
	app.Flag("ingest.body-timeout", "Time a request body may take to arrive; slower senders get 408 and hold no ingest slot meanwhile.").Default(rtld.DefaultBodyTimeout.String()).DurationVar(&f.bodyTimeout)
	app.Flag("ingest.retry-after", "Retry-After sent with 503 answers.").Default(rtld.DefaultRetryAfter.String()).DurationVar(&f.retryAfter)
	app.Flag("dead-letter.max-bytes", "Size bound of the dead-letter store (<spool.dir>/dead-letter), all sinks together; rejected records that do not fit are dropped for that sink (the other sink still has them), counted in edgepipe_rtld_dead_letter_dropped_records_total and logged.").Default(units.Base2Bytes(deadletter.DefaultMaxBytes).String()).BytesVar(&f.deadLetterMaxBytes)
	app.Flag("delivery.ingest-first", "While ingest is saturated, the sinks' workers hold back the batches they read, each at most "+delivery.DefaultMaxDefer.String()+" after it was spooled, so the answers to the platform get the CPU first (edgepipe_rtld_sink_deferred_seconds_total). --no-delivery.ingest-first delivers at once.").Default("true").BoolVar(&f.ingestFirst)
	app.Flag("gap.grace", "How long a missing seq_num may stay missing (the platform retries) before it counts in edgepipe_rtld_seq_gaps_total.").Default(receiver.DefaultGapGrace.String()).DurationVar(&f.gapGrace)
	f.logMetrics.add(app)
	f.reconcile.add(app)
	app.Flag("simulate", "Run against the built-in platform simulator: it serves the API in-process and delivers log batches to this receiver over TLS on loopback.").BoolVar(&f.simulate)
	app.Flag("simulate.traffic-scale", "With --simulate: multiplies the simulated traffic, the Metrics API's counts and the access logs alike (1: about 100 records/s for the first 3 environments).").
		Default(strconv.FormatFloat(defaultSimTrafficScale, 'g', -1, 64)).Float64Var(&f.simTrafficScale)
	app.Flag("simulate.environments", "With --simulate: how many of the simulator's environments to serve when no --environment-id is given (0: all).").Default("3").IntVar(&f.simEnvironments)
	f.web = cli.AddWebFlags(app, ":9781")
	app.Command(cmdRun, "Receive batches and deliver them (the default command).").Default()
	dl := app.Command("dead-letter", "Show and re-deliver the records a sink rejected for good (kept under <spool.dir>/dead-letter/<sink>/). Give the same --spool.dir and sink flags as the receiver runs with.")
	list := dl.Command("list", "List the dead letters: one line per record with its sink, time, reason, batch identity, size and error.")
	list.Flag("sink", "Only this sink's dead letters (kafka or clickhouse).").EnumVar(&f.deadLetterSink, receiver.SinkKafka, receiver.SinkClickHouse)
	list.Flag("json", "Print each dead letter as one JSON object per line, record included.").BoolVar(&f.deadLetterJSON)
	replay := dl.Command("replay", "Deliver the dead letters again through the sink (after the topic or table was fixed); what the sink acknowledges is removed, what it rejects again stays. Safe while the receiver runs; one replay per sink at a time.")
	replay.Flag("sink", "Only this sink's dead letters (kafka or clickhouse); default every sink that has some.").EnumVar(&f.deadLetterSink, receiver.SinkKafka, receiver.SinkClickHouse)
	replay.Flag("timeout", "Give up (keeping what was not delivered) when the sink stays unreachable this long.").Default("5m").DurationVar(&f.replayTimeout)
	app.Command(cmdCheck, "Try once each setting, credential and endpoint the receiver would use with the same flags and variables, "+
		"print a line per check saying what it found or what to fix, and exit 0 only when every check passed. It creates and changes nothing.")
	return f
}

// resolve completes the parsed flags of command cmd.
func (f *flags) resolve(cmd string) {
	f.command = cmd
	f.platform.Resolve()
}

// run parses args and runs the chosen command until ctx is done.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newCommandLine(stdout, stderr)
	cmd, err := f.app.Parse(args)
	if errors.Is(err, cli.ErrPrinted) {
		return nil
	}
	if err != nil {
		return err
	}
	f.resolve(cmd)
	if f.command == cmdCheck {
		return runCheck(ctx, f, stdout)
	}
	if err := checkSizes(f); err != nil {
		return err
	}
	if err := f.reconcile.check(f.clickhouseDSN); err != nil {
		return err
	}
	log := f.app.Logger()

	sec, err := f.readSecrets()
	if err != nil {
		return err
	}
	switch f.command {
	case cmdDeadLetterList:
		return listDeadLetters(f, stdout)
	case cmdDeadLetterReplay:
		return replayDeadLetters(ctx, f, sec.sinkSecrets, log, stdout)
	}
	return runReceiver(ctx, f, sec, log)
}

// runReceiver runs the receiver (the run command) until ctx is done.
func runReceiver(ctx context.Context, f *flags, sec secrets, log *slog.Logger) error {
	cfg := receiverConfig(f, sec, log)
	var err error
	if cfg.LogMetrics, err = f.logMetrics.config(); err != nil {
		return err
	}
	var sim *simulation
	if f.simulate {
		if sim, err = startSimulation(f, log); err != nil {
			return err
		}
		defer sim.Close()
		sim.configure(f, &cfg)
	}
	if err := completeConfig(f, &cfg, sec, sim, log); err != nil {
		return err
	}

	setMemoryLimit(cfg, log)
	rcv, err := newReceiver(ctx, cfg)
	if err != nil {
		return err
	}
	srv, err := newWebServer(f, rcv, log)
	if err != nil {
		_ = rcv.Close()
		return err
	}
	return serve(ctx, f, cfg, rcv, srv, sim, log)
}

// receiverConfig returns the receiver's configuration from the spool,
// ingest and dead-letter flags and the ingest credentials.
func receiverConfig(f *flags, sec secrets, log *slog.Logger) receiver.Config {
	return receiver.Config{
		SpoolDir:          f.spoolDir,
		SpoolMaxBytes:     int64(f.spoolMaxBytes),
		SpoolSegmentBytes: int64(f.spoolSegmentBytes),
		Ingest: rtld.IngestConfig{
			Username:        sec.rtldUsername,
			Password:        sec.rtldPassword,
			MaxBodyBytes:    int64(f.maxBodyBytes),
			MaxDecodedBytes: int64(f.maxDecodedBytes),
			MaxInFlight:     f.maxInFlight,
			MaxRecordBytes:  int(f.maxRecordBytes),
			MaxMemoryBytes:  int64(f.maxMemoryBytes),
			BodyTimeout:     f.bodyTimeout,
			RetryAfter:      f.retryAfter,
		},
		DeadLetterMaxBytes: int64(f.deadLetterMaxBytes),
		EnvironmentIDs:     f.platform.EnvironmentIDs,
		GapGrace:           f.gapGrace,
		NoIngestFirst:      !f.ingestFirst,
		Logger:             log,
	}
}

// completeConfig checks the ingest credentials and adds the sinks and the
// platform's parts (registration, reconciliation) to cfg.
func completeConfig(f *flags, cfg *receiver.Config, sec secrets, sim *simulation, log *slog.Logger) error {
	if cfg.Ingest.Username == "" || cfg.Ingest.Password == "" {
		return errors.New("EDGEPIPE_RTLD_USERNAME and EDGEPIPE_RTLD_PASSWORD (or --rtld.password-file) must be set: every batch is checked against them")
	}
	var err error
	if cfg.Kafka, err = kafkaConfig(f, sec.kafkaUsername, sec.kafkaPassword, log); err != nil {
		return err
	}
	if err := checkRecordLimit(f); err != nil {
		return err
	}
	if cfg.ClickHouse, err = clickhouseConfig(f, sec.clickhousePassword); err != nil {
		return err
	}
	return platformConfig(f, cfg, sim, log)
}

// newReceiver creates the receiver, checks what its sinks can only check
// by connecting (for at most 30 s), and registers the build info.
func newReceiver(ctx context.Context, cfg receiver.Config) (*receiver.Receiver, error) {
	rcv, err := receiver.New(cfg)
	if err != nil {
		return nil, err
	}
	checkCtx, cancelCheck := context.WithTimeout(ctx, 30*time.Second)
	err = rcv.Check(checkCtx)
	cancelCheck()
	if err != nil {
		_ = rcv.Close()
		return nil, err
	}
	if err := rcv.Registry().Register(cli.BuildInfo("rtld-receiver")); err != nil {
		_ = rcv.Close()
		return nil, fmt.Errorf("build info: %w", err)
	}
	return rcv, nil
}

// newWebServer returns the web server of rcv's handler, its metrics and
// the landing page, with the --web.* flags.
func newWebServer(f *flags, rcv *receiver.Receiver, log *slog.Logger) (*cli.Server, error) {
	return f.web.NewServer(cli.Site{
		Landing: web.LandingConfig{
			Name:        "edgepipe rtld-receiver",
			Description: "Receives the CDN platform's real-time access logs (POST /ingest/{environment_id}, HTTP basic auth) and delivers every record to Kafka and ClickHouse.",
			Links: []web.LandingLinks{
				{Address: "/metrics", Text: "Metrics"},
				{Address: "/healthz", Text: "Health"},
				{Address: "/readyz", Text: "Readiness", Description: "ready while the spool takes batches"},
			},
		},
		Metrics:  cli.MetricsHandler(rcv.Registry(), log),
		Registry: rcv.Registry(),
		Handler:  rcv.Handler(),
		Server: &http.Server{
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       2 * time.Minute,
			WriteTimeout:      2 * time.Minute,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    64 << 10,
		},
	}, log)
}

// serve runs the web server, the simulator's ingest listener (sim, when
// not nil) and the receiver until ctx is done or one of them stops.
//
// Shutdown stops taking batches first (the web server, then the
// simulator's ingest listener, each waiting for the batches in flight),
// then the workers, which close the sinks and the spool.
func serve(ctx context.Context, f *flags, cfg receiver.Config, rcv *receiver.Receiver, srv *cli.Server, sim *simulation, log *slog.Logger) error {
	var g rungroup.Group
	g.Add(cli.ContextActor(ctx))
	g.Add(srv.Actor(15 * time.Second))
	if sim != nil {
		g.Add(sim.ingestActor(rcv.Handler(), log))
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	var runErr error // Run's result, also when it ends because it was interrupted
	g.Add(func() error {
		runErr = rcv.Run(runCtx)
		if runCtx.Err() == nil { // ended by itself
			return fmt.Errorf("receiver stopped: %w", errors.Join(runErr, errors.New("ended")))
		}
		return nil
	}, func(error) { stopRun() })
	log.Info("rtld receiver started", "spool", f.spoolDir, "environments", len(cfg.EnvironmentIDs),
		"kafka", cfg.Kafka != nil, "kafka_tls", f.kafkaTLS, "kafka_sasl", f.kafkaSASLMechanism, "clickhouse", cfg.ClickHouse != nil, "clickhouse_cluster", f.clickhouseCluster, "register", f.register, "reconcile", cfg.Reconcile != nil, "simulate", f.simulate,
		"log_metrics", cfg.LogMetrics != nil, "log_metrics_labels", f.logMetrics.labels)
	err := g.Run()
	if err == nil {
		err = runErr
	}
	log.Info("rtld receiver stopped")
	return err
}

// secrets are the receiver's secrets (the API client's are read by
// cli.Platform).
type secrets struct {
	rtldUsername, rtldPassword string
	sinkSecrets
}

// readSecrets reads the receiver's secrets from the environment and the
// files named there or by the --…-file flags.
func (f *flags) readSecrets() (secrets, error) {
	var sec secrets
	for _, s := range []struct {
		secret *cli.Secret
		dst    *string
	}{
		{f.rtldUsername, &sec.rtldUsername},
		{f.rtldPassword, &sec.rtldPassword},
		{f.clickhousePassword, &sec.clickhousePassword},
		{f.kafkaUsername, &sec.kafkaUsername},
		{f.kafkaPassword, &sec.kafkaPassword},
	} {
		var err error
		if *s.dst, err = s.secret.Read(); err != nil {
			return secrets{}, err
		}
	}
	return sec, nil
}

// platformConfig sets up what the receiver asks the platform for: the
// profiles it registers (--register) and the Metrics API it reconciles
// with (--reconcile.delay), on one client that follows the platform's clock
// and uses the simulator's credentials when sim is not nil.
// Without --register, reconciliation needs --api.url and the API
// credentials, and is turned off (with a warning) when they are missing.
func platformConfig(f *flags, cfg *receiver.Config, sim *simulation, log *slog.Logger) error {
	p := f.platform
	reconciling := f.reconcile.delay > 0
	var clientID, clientSecret string
	var err error
	if f.register {
		if clientID, clientSecret, err = registrationCredentials(f, cfg.EnvironmentIDs, sim); err != nil {
			return err
		}
	} else if reconciling {
		if clientID, clientSecret, err = reconciliationCredentials(f, cfg.EnvironmentIDs, sim); err != nil {
			log.Info("log delivery is not checked against the Metrics API", "reason", err)
			reconciling = false
		}
	}
	if !f.register && !reconciling {
		return nil
	}
	clock := reconcile.NewPlatformTime(nil)
	client, err := platform.New(platform.Config{BaseURL: p.APIURL, AuthURL: p.AuthURL, ClientID: clientID, ClientSecret: clientSecret,
		Logger: log, Version: cli.Version(), DateObserver: clock})
	if err != nil {
		return err
	}
	cfg.ProfileAPI = client.RTLD()
	if f.register {
		if cfg.Registrar, err = registrarConfig(f, cfg); err != nil {
			return err
		}
	}
	if reconciling {
		cfg.Reconcile = f.reconcile.config(client, clock, f.profileName)
		cfg.WatchInterval = f.registerInterval
	}
	return nil
}

// apiCredentials returns the API client's credentials: the simulator's
// when sim is not nil, or else those of cli.Platform.
func apiCredentials(f *flags, sim *simulation) (id, secret string, err error) {
	if sim != nil {
		return sim.clientID, sim.clientSecret, nil
	}
	return f.platform.Credentials()
}

// registrationCredentials checks what registering profiles in the
// environments envs needs and returns the API client's credentials.
func registrationCredentials(f *flags, envs []string, sim *simulation) (id, secret string, err error) {
	if len(envs) == 0 {
		return "", "", errors.New("--environment-id is required to register profiles (or --no-register)")
	}
	if f.platform.APIURL == "" {
		return "", "", errors.New("--api.url (or EDGEPIPE_API_URL) is required to register profiles (or --no-register)")
	}
	if id, secret, err = apiCredentials(f, sim); err != nil {
		return "", "", fmt.Errorf("%w; they are needed to register profiles (or --no-register)", err)
	}
	if !strings.HasPrefix(f.publicURL, "https://") {
		return "", "", errors.New("--public-url must be an https URL the platform can reach (the platform posts only to https)")
	}
	return id, secret, nil
}

// reconciliationCredentials returns the API client's credentials for
// reconciling the environments envs without registering profiles, or
// why reconciliation cannot run.
func reconciliationCredentials(f *flags, envs []string, sim *simulation) (id, secret string, err error) {
	switch {
	case f.platform.APIURL == "":
		return "", "", errors.New("no --api.url")
	case len(envs) == 0:
		return "", "", errors.New("no --environment-id")
	}
	return apiCredentials(f, sim)
}

// registrarConfig returns the profile registrar's configuration.
func registrarConfig(f *flags, cfg *receiver.Config) (*rtld.RegistrarConfig, error) {
	percent, err := f.reconcile.downsamplingPercent()
	if err != nil {
		return nil, err
	}
	return &rtld.RegistrarConfig{
		EnvironmentIDs: cfg.EnvironmentIDs, ProfileName: f.profileName, PublicURL: strings.TrimRight(f.publicURL, "/"),
		Username: cfg.Ingest.Username, Password: cfg.Ingest.Password, Fields: cli.SplitList(f.fields),
		Interval: f.registerInterval, DownsamplingPercent: percent,
	}, nil
}

// checkRecordLimit refuses a record limit Kafka could never take: a record
// between the two limits would be accepted and then dead-lettered for Kafka
// every time. A smaller limit on the brokers themselves is found at run
// time (its records are dead-lettered); only the flags are compared here.
func checkRecordLimit(f *flags) error {
	if f.kafkaBrokers == "" || f.maxRecordBytes <= f.kafkaMaxMessageBytes {
		return nil
	}
	return fmt.Errorf("--ingest.max-record-bytes (%s) exceeds --kafka.max-message-bytes (%s): records between the two could never reach Kafka; "+
		"raise --kafka.max-message-bytes (with the brokers' message.max.bytes) or lower --ingest.max-record-bytes", f.maxRecordBytes, f.kafkaMaxMessageBytes)
}

// kafkaConfig returns the Kafka sink's configuration, or nil when no
// brokers are set. The SASL credentials come from the environment (see
// run); they are checked here and never logged.
func kafkaConfig(f *flags, username, password string, log *slog.Logger) (*kafkasink.Config, error) {
	if f.kafkaBrokers == "" {
		return nil, nil
	}
	c := &kafkasink.Config{
		Brokers: cli.SplitList(f.kafkaBrokers), Topic: f.kafkaTopic, Compression: f.kafkaCompression,
		CreateTopic: f.kafkaCreateTopic, Partitions: f.kafkaPartitions, ReplicationFactor: f.kafkaReplication,
		MaxMessageBytes: int64(f.kafkaMaxMessageBytes), WriteTimeout: f.kafkaWriteTimeout, Logger: log,
	}
	files := kafkasink.TLSFiles{CAFile: f.kafkaTLSCAFile, CertFile: f.kafkaTLSCertFile, KeyFile: f.kafkaTLSKeyFile, InsecureSkipVerify: f.kafkaTLSInsecure}
	if f.kafkaTLS {
		tlsCfg, err := files.Config()
		if err != nil {
			return nil, err
		}
		c.TLS = tlsCfg
		if f.kafkaTLSInsecure {
			log.Warn("--kafka.tls.insecure-skip-verify: broker certificates are not verified; use it for testing only")
		}
	} else if files != (kafkasink.TLSFiles{}) {
		return nil, errors.New("--kafka.tls.ca-file, --kafka.tls.cert-file, --kafka.tls.key-file and --kafka.tls.insecure-skip-verify need --kafka.tls")
	}
	mech, err := kafkasink.SASLMechanism(f.kafkaSASLMechanism, username, password)
	if err != nil {
		return nil, err
	}
	c.SASL = mech
	switch {
	case mech == nil && (username != "" || password != ""):
		log.Warn("EDGEPIPE_KAFKA_USERNAME/EDGEPIPE_KAFKA_PASSWORD are set but --kafka.sasl.mechanism is none: Kafka connections are not authenticated")
	case f.kafkaSASLMechanism == kafkasink.SASLPlain && !f.kafkaTLS:
		log.Warn("--kafka.sasl.mechanism=plain without --kafka.tls sends the Kafka password in clear text")
	}
	return c, nil
}

// setMemoryLimit sets the soft memory limit the settings call for
// (receiver.Config.MemoryLimit) unless GOMEMLIMIT chose one.
func setMemoryLimit(cfg receiver.Config, log *slog.Logger) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	limit := cfg.MemoryLimit()
	debug.SetMemoryLimit(limit)
	log.Debug("soft memory limit set from the settings; GOMEMLIMIT overrides it", "limit", units.Base2Bytes(limit).String())
}

func randomSecret() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// clickhouseConfig builds the ClickHouse sink's configuration from the
// --clickhouse.* flags (nil without --clickhouse.dsn).
func clickhouseConfig(f *flags, password string) (*logtable.Config, error) {
	if f.clickhouseDSN == "" {
		return nil, nil
	}
	if f.clickhouseQuorum < 0 || (f.clickhouseQuorum > 1 && f.clickhouseCluster == "") {
		return nil, fmt.Errorf("--clickhouse.insert-quorum %d: want 0 or more, and above 1 only with --clickhouse.cluster (a quorum counts replicas)", f.clickhouseQuorum)
	}
	if err := clickhouse.CheckDSN(f.clickhouseDSN, f.clickhouseCluster, f.clickhouseTLS); err != nil {
		return nil, fmt.Errorf("--clickhouse.dsn: %w", err)
	}
	opts := []clickhouse.Option{clickhouse.WithCluster(f.clickhouseCluster), clickhouse.WithInsertQuorum(f.clickhouseQuorum), clickhouse.WithTLS(f.clickhouseTLS)}
	if password != "" {
		opts = append(opts, clickhouse.WithPassword(password))
	}
	return &logtable.Config{DSN: f.clickhouseDSN, Options: opts, Retention: time.Duration(f.clickhouseRetention)}, nil
}
