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
// run (the default: "exporter [flags]" is "exporter run [flags]", and
// "exporter --help" lists its flags too) discovers the environments to
// serve (--environment-id, or every environment of --organization-id,
// split between instances with
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
// check (check.go) takes the run command's flags and tries, once, each
// setting, credential and endpoint the run command would use with them,
// one line per check, and exits 0 only when every check passed.
//
// # How optional sinks and commands are organised
//
// The core of the program (this file, config.go, run.go) knows only the
// Prometheus and OTLP sinks. Everything else is an extension (extension.go):
// a type in its own file that adds flags to the run command and commands to
// the application (register), contributes publishers, a resume source and a
// shutdown hook to a run (setup), runs its own commands (command), and
// contributes its checks to `exporter check` (checks). The
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
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kingpin/v2"

	"github.com/edgepipe/edgepipe/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, cli.ErrPrinted) { // ErrPrinted: the metrics were described
		fmt.Fprintln(os.Stderr, "exporter:", err)
		os.Exit(1)
	}
}

// commandLine is the exporter's command line: the shared flags, the run
// command (the default) and the extensions' flags and commands.
type commandLine struct {
	app    *cli.App
	common *commonFlags
	runCmd *kingpin.CmdClause
	run    *runFlags
	exts   []extension
	// checkCmd is `exporter check`, which takes the run command's flags.
	checkCmd *kingpin.CmdClause
}

// newCommandLine declares the exporter's flags and commands; help and
// --version go to stdout, the log to stderr.
func newCommandLine(stdout, stderr io.Writer) *commandLine {
	app := cli.New("exporter", "Export a CDN platform's traffic metrics to Prometheus, OpenTelemetry and more.", stdout, stderr)
	cl := &commandLine{app: app, common: registerCommonFlags(app), exts: extensions()}
	cl.runCmd = app.Command("run", "Poll the Metrics API and serve/publish the metrics (the default command).").Default()
	cl.run = registerRunFlags(cl.runCmd)
	for _, e := range cl.exts {
		e.register(app.Application, cl.runCmd)
	}
	cl.checkCmd = app.Command("check", "Try once each setting, credential and endpoint the run command would use with the same flags and variables, "+
		"print a line per check saying what it found or what to fix, and exit 0 only when every check passed. It creates and changes nothing.")
	cli.ShareFlags(cl.checkCmd, cl.runCmd)
	return cl
}

// run parses args and runs the chosen command until ctx is done.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cl := newCommandLine(stdout, stderr)
	cmd, err := cl.app.Parse(args)
	if errors.Is(err, cli.ErrPrinted) {
		return nil
	}
	if err != nil {
		return err
	}
	if cmd == cl.checkCmd.FullCommand() {
		return runCheck(ctx, cl, stdout)
	}
	h, err := newHost(cl.common, cl.app.Logger())
	if err != nil {
		return err
	}
	defer h.close()

	if cmd == cl.runCmd.FullCommand() {
		return runExporter(ctx, h, cl.run, cl.exts, runDeps{})
	}
	for _, e := range cl.exts {
		handled, err := e.command(ctx, cmd, h)
		if handled {
			return err
		}
	}
	return fmt.Errorf("unknown command %q", cmd)
}
