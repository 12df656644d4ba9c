// Command demosinks runs the sinks of `make demo` on loopback until it is
// interrupted: a clickhouse-server with its configuration and data under
// -dir (configured as the tests' servers are, internal/sandbox) and a Kafka
// broker (franz-go's kfake) in this process. scripts/demo.sh starts it when
// clickhouse-server is installed and points both programs at it.
//
//	demosinks -dir DIR -clickhouse 127.0.0.1:9792 -clickhouse-http 127.0.0.1:9793 -kafka 127.0.0.1:9794 [-clickhouse-bin PATH]
//
// It prints one line per service once it is ready, and on SIGTERM stops
// ClickHouse (its whole process group) and the broker before it exits;
// ClickHouse is also killed if this process dies. It ignores SIGINT: Ctrl-C
// in the demo's terminal reaches every program at once, and the sinks must
// outlive the programs that flush into them as they stop (the demo sends
// SIGTERM once they have).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/edgepipe/edgepipe/internal/sandbox"
)

func main() {
	dir := flag.String("dir", "./data/demo/sinks", "directory of ClickHouse's configuration, data and logs")
	chAddr := flag.String("clickhouse", "127.0.0.1:9792", "ClickHouse native protocol address")
	chHTTP := flag.String("clickhouse-http", "127.0.0.1:9793", "ClickHouse HTTP address")
	kafkaAddr := flag.String("kafka", "127.0.0.1:9794", "Kafka broker address")
	chBin := flag.String("clickhouse-bin", "", "clickhouse-server (or the multi-call clickhouse) to run (default: found on PATH)")
	flag.Parse()
	signal.Ignore(os.Interrupt)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	err := run(ctx, *kafkaAddr, sandbox.ClickHouseOptions{Dir: filepath.Join(*dir, "clickhouse"), Addr: *chAddr, HTTPAddr: *chHTTP, Bin: *chBin})
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demosinks:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kafkaAddr string, chOpts sandbox.ClickHouseOptions) error {
	kafka, err := sandbox.StartKafka(kafkaAddr)
	if err != nil {
		return err
	}
	defer kafka.Close()
	fmt.Printf("demosinks: kafka broker (kfake) on %s\n", kafka.Addr())
	ch, err := sandbox.StartClickHouse(ctx, chOpts)
	if err != nil {
		return err
	}
	fmt.Printf("demosinks: clickhouse-server (pid %d) on %s (native), %s (HTTP), data in %s\n",
		ch.Pid(), ch.Addr(), ch.HTTPAddr(), chOpts.Dir)
	<-ctx.Done()
	fmt.Println("demosinks: stopping")
	ch.Stop()
	return nil
}
