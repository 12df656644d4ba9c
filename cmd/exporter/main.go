// Command exporter polls the CDN platform's Metrics API and publishes every
// dataset of every environment to Prometheus (scraped on /metrics) and,
// when configured, to OpenTelemetry (OTLP push).
//
//	exporter --simulate                         # demo against the built-in simulator
//	EDGEPIPE_CLIENT_ID=… EDGEPIPE_CLIENT_SECRET=… exporter \
//	    --api.url=https://api.example --auth.url=https://id.example \
//	    --organization-id=<org>
//
// # Hooks for optional parts (ClickHouse sink, backfill)
//
// Optional parts live in their own files of this package and plug in through
// the extension interface (extension.go), without editing this file:
//
//  1. In your file (clickhouse.go, backfill.go) define a type implementing
//     extension: register(app, run) adds your flags to the run command
//     (e.g. --clickhouse.dsn) and your own commands to app (e.g. backfill);
//     setup(ctx, h) returns your publishers, ResumeSource and closer for the
//     run command (nil parts when your flags leave you disabled); command(ctx,
//     name, h) runs your own commands.
//  2. Add your constructor to the list in extensions() in extension.go
//     (the one line outside your files).
//
// The *host handed to setup and command gives you the parsed common flags
// (h.common: API, credentials, environments, organizations, granularity,
// shard), the logger, the Prometheus registerer, the build version and
// h.clients(ctx), which builds the platform, metrics and accounts clients from
// the flags (starting the simulator first under --simulate), and
// h.environments(ctx), the sharded environment discovery.
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
