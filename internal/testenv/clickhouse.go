package testenv

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgepipe/edgepipe/internal/sandbox"
)

// ClickHouseServer is a clickhouse-server process started for one test, with its own
// config.xml, users.xml and data directory in t.TempDir(), listening on free
// loopback ports. User "default" has no password.
//
// The CI server is Debian's clickhouse-server 18.16.1 (protocol revision
// 54412). Checked against it with clickhouse-go v2.50 (see clickhouse_test.go):
//   - Native protocol, Ping, Exec, Query, Select and PrepareBatch work, with and
//     without compression (clickhouse.CompressionLZ4 and ZSTD both work).
//   - PrepareBatch needs an explicit column list: "INSERT INTO t (a, b)".
//     "INSERT INTO t" without one fails at Append with
//     "expected 0 arguments, got N" (the batch ends up with no columns on 18.16).
//   - conn.Exec(ctx, "INSERT INTO t (a) VALUES (1)") hangs until the context's
//     deadline: 18.16 waits for the client to send the VALUES as data blocks,
//     which only newer servers parse themselves. Use PrepareBatch, or
//     "INSERT INTO t (a) SELECT …", which run entirely on the server.
//   - Missing on 18.16 (gate on conn.ServerVersion()): DateTime64, Map, IPv4/IPv6
//     types, TTL clauses, column CODECs, "ADD COLUMN IF NOT EXISTS" (check
//     system.columns instead). LowCardinality exists but only with the setting
//     allow_experimental_low_cardinality_type=1 on the CREATE TABLE (e.g.
//     clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{
//     "allow_experimental_low_cardinality_type": 1}))); inserting into and
//     reading from such columns then works without the setting.
//   - Columnar batches (batch.Column(i).Append(slice)), AppendStruct with
//     `ch:"name"` tags and Select into structs work.
//   - Decimal columns take decimal.Decimal (github.com/shopspring/decimal), not
//     float64. UUID, Nullable, Array, Enum8, ReplacingMergeTree(version) and
//     SELECT ... FINAL work.
type ClickHouseServer struct {
	t        testing.TB
	bin      string
	args     []string // after the binary: "server"/"--config-file=…"
	dir      string
	tcpPort  int
	httpPort int
	mu       sync.Mutex
	proc     *process
}

// clickHouseStartTimeout bounds one start (a cold 18.16 start takes well under
// a second on an idle machine; CI machines are busy).
const clickHouseStartTimeout = 60 * time.Second

// ClickHouse starts a ClickHouse server for the test and stops it (SIGKILL to
// its process group) on cleanup. It fails the test if the server does not
// answer a native-protocol ping in time, showing the server's log.
func ClickHouse(t testing.TB) *ClickHouseServer {
	t.Helper()
	ch := newClickHouseServer(t)
	// A port found free may be taken before the server binds it: retry
	// with fresh ports when the log says so.
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		if err = ch.pickPorts(); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if err = ch.writeConfig(""); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		err = ch.start()
		if err == nil {
			return ch
		}
		if !addrInUse(ch.logs()) {
			break
		}
	}
	t.Fatalf("testenv: start clickhouse: %v\n--- clickhouse log (%s) ---\n%s", err, ch.dir, ch.logs())
	return nil
}

// newClickHouseServer prepares a server's directory and registers Kill as
// cleanup; pickPorts and writeConfig come next.
func newClickHouseServer(t testing.TB) *ClickHouseServer {
	t.Helper()
	bin, args := clickHouseCommand(t)
	dir := t.TempDir()
	ch := &ClickHouseServer{t: t, bin: bin, dir: dir}
	ch.args = append(slices.Clone(args), "--config-file="+filepath.Join(dir, "config.xml"))
	t.Cleanup(ch.Kill)
	return ch
}

// clickHouseCommand finds clickhouse-server, or the multi-call clickhouse
// binary of upstream packages ("clickhouse server").
func clickHouseCommand(t testing.TB) (string, []string) {
	t.Helper()
	bin, args, err := sandbox.ClickHouseCommand()
	if err != nil {
		missing(t, "%v", err)
	}
	return bin, args
}

// pickPorts picks fresh native and HTTP ports.
func (ch *ClickHouseServer) pickPorts() error {
	tcp, err := stablePort()
	if err != nil {
		return err
	}
	http, err := stablePort()
	if err != nil {
		return err
	}
	ch.tcpPort, ch.httpPort = tcp, http
	return nil
}

// writeConfig writes the server's configuration for the current ports
// (sandbox.WriteClickHouseConfig, as the demo's server has it); sections is
// added inside <yandex> as is (a cluster node's interserver port,
// zookeeper, remote_servers, macros and distributed_ddl).
func (ch *ClickHouseServer) writeConfig(sections string) error {
	return sandbox.WriteClickHouseConfig(ch.dir, ch.tcpPort, ch.httpPort, sections)
}

// start runs the server and waits for a ping. The caller holds no lock.
func (ch *ClickHouseServer) start() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.proc != nil && !ch.proc.exited() {
		return nil
	}
	p, err := startProcess("clickhouse-server", filepath.Join(ch.dir, "log", "stdout.log"), ch.bin, ch.args...)
	if err != nil {
		return err
	}
	ch.proc = p
	return waitFor(context.Background(), p, clickHouseStartTimeout, 50*time.Millisecond, ch.ping)
}

func (ch *ClickHouseServer) ping(ctx context.Context) error {
	conn, err := clickhouse.Open(ch.options("default"))
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer conn.Close()
	if err := conn.Ping(ctx); err != nil {
		return fmt.Errorf("ping %s: %w", ch.Addr(), err)
	}
	return nil
}

func (ch *ClickHouseServer) options(database string) *clickhouse.Options {
	return &clickhouse.Options{
		Addr:        []string{ch.Addr()},
		Auth:        clickhouse.Auth{Database: database, Username: "default"},
		DialTimeout: 2 * time.Second,
	}
}

// logs returns the tail of the server's log files, for failure messages.
func (ch *ClickHouseServer) logs() string {
	return "[stdout/stderr]\n" + fileTail(filepath.Join(ch.dir, "log", "stdout.log"), 2000) +
		"\n[clickhouse-server.err.log]\n" + fileTail(filepath.Join(ch.dir, "log", "clickhouse-server.err.log"), 4000)
}

// Addr returns host:port of the native protocol, e.g. "127.0.0.1:40123".
func (ch *ClickHouseServer) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ch.tcpPort))
}

// HTTPAddr returns host:port of the HTTP interface, e.g. "127.0.0.1:40124".
func (ch *ClickHouseServer) HTTPAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ch.httpPort))
}

// DSN returns a clickhouse-go DSN for database, e.g.
// "clickhouse://127.0.0.1:40123/db". The database must exist for queries to
// work (see NewDatabase); the string parses with clickhouse.ParseDSN.
func (ch *ClickHouseServer) DSN(database string) string {
	return "clickhouse://" + ch.Addr() + "/" + database
}

// Conn opens a native-protocol connection to the "default" database and
// closes it on cleanup.
func (ch *ClickHouseServer) Conn(t testing.TB) driver.Conn {
	t.Helper()
	conn, err := clickhouse.Open(ch.options("default"))
	if err != nil {
		t.Fatalf("testenv: open clickhouse %s: %v", ch.Addr(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Exec runs one statement and fails the test on error. Not for
// "INSERT … VALUES" on 18.16 (see ClickHouseServer); INSERT … SELECT works.
func (ch *ClickHouseServer) Exec(t testing.TB, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := clickhouse.Open(ch.options("default"))
	if err != nil {
		t.Fatalf("testenv: open clickhouse: %v", err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("testenv: clickhouse exec %q: %v", sql, err)
	}
}

// QueryUint64 runs a query returning one unsigned integer (e.g.
// "SELECT count() FROM db.t FINAL") and fails the test on error.
func (ch *ClickHouseServer) QueryUint64(t testing.TB, sql string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := clickhouse.Open(ch.options("default"))
	if err != nil {
		t.Fatalf("testenv: open clickhouse: %v", err)
	}
	defer conn.Close()
	var n uint64
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("testenv: clickhouse query %q: %v", sql, err)
	}
	return n
}

// NewDatabase creates a database with a unique name derived from the test's
// name and returns that name.
func (ch *ClickHouseServer) NewDatabase(t testing.TB) string {
	t.Helper()
	name := uniqueName(t, "t_")
	ch.Exec(t, "CREATE DATABASE "+name)
	return name
}

// Stop shuts the server down gracefully (SIGTERM, SIGKILL after 15s) and
// waits for it to exit. Data and ports are kept for Start.
func (ch *ClickHouseServer) Stop() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.proc != nil {
		ch.proc.stop(15 * time.Second)
	}
}

// Kill SIGKILLs the server's process group and waits for it to exit, as a
// crash would. Data and ports are kept for Start. Kill is also the cleanup.
func (ch *ClickHouseServer) Kill() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.proc != nil {
		ch.proc.kill()
	}
}

// Start starts the server again after Stop or Kill, on the same ports and
// with the same data directory, and waits until it answers. It does nothing
// if the server is running. It fails the test ClickHouse was started for if
// the server does not come back, so call it from that test's goroutine; use
// StartContext elsewhere.
func (ch *ClickHouseServer) Start() {
	ch.t.Helper()
	if err := ch.StartContext(context.Background()); err != nil {
		ch.t.Fatalf("testenv: %v", err)
	}
}

// StartContext is Start returning an error instead of failing the test, for
// use from any goroutine (e.g. "restart ClickHouse after 5 seconds").
func (ch *ClickHouseServer) StartContext(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := ch.start(); err != nil {
		return fmt.Errorf("restart clickhouse: %w\n--- clickhouse log ---\n%s", err, ch.logs())
	}
	return nil
}

// Pid returns the server process's id (for measurements of its CPU time),
// or 0 when it is not running.
func (ch *ClickHouseServer) Pid() int {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.proc == nil || ch.proc.exited() {
		return 0
	}
	return ch.proc.cmd.Process.Pid
}

// Running reports whether the server process is alive.
func (ch *ClickHouseServer) Running() bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.proc != nil && !ch.proc.exited()
}
