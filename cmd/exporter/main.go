// Command exporter polls the CDN platform's Metrics API and publishes every
// dataset of every environment to Prometheus (scraped on /metrics) and, when
// configured, to OpenTelemetry (OTLP push) and ClickHouse.
//
//	exporter --simulate                         # demo against the built-in simulator
//	EDGEPIPE_CLIENT_ID=… EDGEPIPE_CLIENT_SECRET=… exporter \
//	    --api.url=https://api.example --auth.url=https://id.example \
//	    --organization-id=<org>
//
// # Commands
//
// run (the default) discovers the environments to serve (--environment-id,
// or every environment of --organization-id, split between instances with
// --shard.index/--shard.count), polls every dataset at --granularity and
// hands each batch of buckets to the configured sinks: the Prometheus
// collector served on --web.listen-address (always), OTLP push with
// --otlp.endpoint, and ClickHouse with --clickhouse.dsn, which also tells the
// scheduler where stored data ends so a restart resumes instead of
// re-reading history.
//
// backfill loads the range --from..--to of history into ClickHouse and
// records what it loaded, so running the same command again after an
// interruption continues where it stopped (--restart loads everything again).
//
// # How optional sinks and commands are organised
//
// The core of the program (this file, config.go, run.go) knows only the
// Prometheus and OTLP sinks. Everything else is an extension (extension.go):
// a type in its own file that adds flags to the run command and commands to
// the application (register), contributes publishers, a resume source and a
// shutdown hook to a run (setup), and runs its own commands (command). The
// list of compiled-in extensions is extensions() in extension.go; today they
// are the ClickHouse sink (clickhouse.go) and the backfill command
// (backfill.go). Extensions reach the parsed common flags, the logger, the
// Prometheus registerer and the platform clients through the *host they are
// given, so they never parse flags or build clients themselves.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/alecthomas/kingpin/v2"

	"github.com/edgepipe/edgepipe/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "exporter:", err)
		os.Exit(1)
	}
}

// run parses args and runs the chosen command until ctx is done.
func run(ctx context.Context, args []string, stderr *os.File) error {
	app := kingpin.New("exporter", "Export a CDN platform's traffic metrics to Prometheus, OpenTelemetry and more.")
	app.Version(version.Get().String())
	app.HelpFlag.Short('h')
	common := registerCommonFlags(app)
	runCmd := app.Command("run", "Poll the Metrics API and serve/publish the metrics (the default command).").Default()
	rf := registerRunFlags(runCmd)
	exts := extensions()
	for _, e := range exts {
		e.register(app, runCmd)
	}
	cmd, err := app.Parse(args)
	if err != nil {
		return err
	}
	log, err := newLogger(common.logLevel, common.logFormat, stderr)
	if err != nil {
		return err
	}
	h, err := newHost(common, log)
	if err != nil {
		return err
	}
	defer h.close()

	if cmd == runCmd.FullCommand() {
		return runExporter(ctx, h, rf, exts, runDeps{})
	}
	for _, e := range exts {
		handled, err := e.command(ctx, cmd, h)
		if handled {
			return err
		}
	}
	return fmt.Errorf("unknown command %q", cmd)
}

// newLogger builds the process logger from --log.level and --log.format.
func newLogger(level, format string, w *os.File) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log.level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(format) {
	case "logfmt", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, errors.New("--log.format: want logfmt or json")
}
