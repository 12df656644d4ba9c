// Command otelcol-build builds the OpenTelemetry Collector that edgepipe's
// tests run (testenv.BuildOTelCollector: ocb on
// internal/testenv/testdata/otelcol-builder.yaml) into the user's cache
// directory, unless it is already there, and prints its path. `make deps`
// runs it so that the tests never wait for the build.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

func main() {
	if err := run(); err != nil {
		slog.Error("build the OpenTelemetry Collector", "err", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) { slog.Info(fmt.Sprintf(format, args...)) }
	bin, err := testenv.BuildOTelCollector(ctx, logf)
	if err != nil {
		return err
	}
	_, err = fmt.Println(bin)
	return err
}
