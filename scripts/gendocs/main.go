// Command gendocs writes the reference pages under docs/reference/ from the
// programs (internal/reference). `make docs` builds the programs and runs
//
//	go run ./scripts/gendocs -bin bin
//
// It starts a clickhouse-server (its own directory, loopback) and a Kafka
// broker (kfake, in-process) for the programs' sinks while they describe
// themselves, and stops them before it exits: it needs clickhouse-server
// (`make deps` installs it).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/edgepipe/edgepipe/internal/reference"
	"github.com/edgepipe/edgepipe/internal/sandbox"
)

func main() {
	bin := flag.String("bin", "bin", "directory holding the built programs (`make build`)")
	root := flag.String("root", ".", "the repository's root; pages go to <root>/"+reference.Dir)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *bin, *root)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gendocs:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, bin, root string) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	work, err := os.MkdirTemp("", "edgepipe-gendocs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	cfg := reference.Config{Binaries: map[string]string{}, WorkDir: work}
	for _, p := range reference.Programs {
		cfg.Binaries[p] = filepath.Join(bin, p)
	}
	addrs := make([]string, 3)
	for i := range addrs {
		if addrs[i], err = sandbox.FreeAddr(); err != nil {
			return err
		}
	}
	ch, err := sandbox.StartClickHouse(ctx, sandbox.ClickHouseOptions{Dir: filepath.Join(work, "clickhouse"), Addr: addrs[0], HTTPAddr: addrs[1]})
	if err != nil {
		return err
	}
	defer ch.Stop()
	kafka, err := sandbox.StartKafka(addrs[2])
	if err != nil {
		return err
	}
	defer kafka.Close()
	cfg.ClickHouseDSN, cfg.KafkaBrokers = ch.DSN("reference"), kafka.Addr()

	pages, err := reference.Generate(ctx, cfg)
	if err != nil {
		return err
	}
	if err := reference.Write(root, pages); err != nil {
		return err
	}
	fmt.Printf("gendocs: wrote %d pages to %s\n", len(pages), filepath.Join(root, reference.Dir))
	return nil
}
