package main

import (
	"context"

	"github.com/alecthomas/kingpin/v2"

	"github.com/edgepipe/edgepipe/internal/inventory"
	"github.com/edgepipe/edgepipe/internal/preflight"
	"github.com/edgepipe/edgepipe/internal/schedule"
)

// extension is an optional part of the exporter that lives in its own file
// of this package (the ClickHouse sink and the backfill command); the package
// comment in main.go describes how extensions fit into the program.
type extension interface {
	// register adds the extension's flags to the run command and its own
	// commands to app. It is called once, before the arguments are parsed.
	register(app *kingpin.Application, run *kingpin.CmdClause)
	// setup is called by the run command after parsing, before polling
	// starts. It returns what the extension adds to the run; a zero parts
	// when its flags leave it disabled.
	setup(ctx context.Context, h *host) (parts, error)
	// command runs cmd (kingpin's FullCommand) if it is one of the
	// extension's own commands, and reports whether it was.
	command(ctx context.Context, cmd string, h *host) (handled bool, err error)
	// checks returns the extension's checks for `exporter check` from the
	// run command's flags (none when they leave it disabled), or the error
	// the run command would stop with for those flags. st carries what
	// earlier checks found; its closers run when the checks are done.
	checks(h *host, st *checkState) ([]preflight.Check, error)
}

// parts are what an extension adds to the run command.
type parts struct {
	// publishers receive every batch of every dataset.
	publishers []schedule.NamedPublisher
	// resume, when set, tells the scheduler where stored data ends. At most
	// one extension may provide one.
	resume schedule.ResumeSource
	// inventory, when set, receives the inventory of environments and TLS
	// certificates. At most one extension may provide one.
	inventory inventory.Publisher
	// close is called at shutdown, after polling stopped, with a context
	// bounding how long it may take to flush.
	close func(ctx context.Context) error
}

// extensions lists the optional parts compiled into the exporter, in the
// order their flags appear in --help.
func extensions() []extension {
	return []extension{newClickHouseExtension(), newBackfillExtension()}
}
