package testenv

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ZooKeeperServer is a standalone ZooKeeper (Debian's zookeeper package,
// 3.8) run as a plain java process for one test, with its own zoo.cfg and
// data directory in t.TempDir(), its client port on a free loopback port, the
// admin server off, and the four-letter words ruok, srvr and mntr allowed.
//
// Its tickTime is 500ms, so clients may use session timeouts from 1s to 10s;
// ClickHouse nodes of ClickHouseCluster use 6s, so a killed node's ephemeral
// znodes (a replica's is_active) expire within seconds.
type ZooKeeperServer struct {
	t    testing.TB
	java string
	dir  string
	port int
	mu   sync.Mutex
	proc *process
}

// Jars of Debian's zookeeper package (zookeeper.jar comes with its dependency
// libzookeeper-java). zookeeper.jar's
// manifest lists its dependencies (netty, jute, slf4j-api, ...);
// slf4j-simple, from libslf4j-java which zookeeper depends on, sends the
// server's log to stderr, i.e. the log file, instead of nowhere.
const (
	zooKeeperJar    = "/usr/share/java/zookeeper.jar"
	zooKeeperLogJar = "/usr/share/java/slf4j-simple.jar"
)

// zooKeeperStartTimeout bounds one start (about 1s on an idle machine).
const zooKeeperStartTimeout = 60 * time.Second

// ZooKeeper starts a ZooKeeper server for the test and stops it (SIGKILL to
// its process group) on cleanup. It fails the test if the server does not
// answer "srvr" in standalone mode in time, showing its log. A missing java or
// zookeeper package skips the test (run `make deps`), or fails it when
// CI=true.
func ZooKeeper(t testing.TB) *ZooKeeperServer {
	t.Helper()
	java, err := lookBinary("java")
	if err != nil {
		missing(t, "java not found (ZooKeeper needs it): run `make deps` to install zookeeper and its JRE (%v)", err)
		return nil
	}
	if _, err := os.Stat(zooKeeperJar); err != nil {
		missing(t, "%s not found: run `make deps` to install zookeeper (%v)", zooKeeperJar, err)
		return nil
	}
	zk := &ZooKeeperServer{t: t, java: java, dir: t.TempDir()}
	if err := os.MkdirAll(filepath.Join(zk.dir, "data"), 0o755); err != nil {
		t.Fatalf("testenv: zookeeper dir: %v", err)
	}
	t.Cleanup(zk.Kill)
	for attempt := 0; attempt < 4; attempt++ {
		if err = zk.configure(); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if err = zk.start(); err == nil {
			return zk
		}
		zk.Kill()
		if !addrInUse(zk.logs()) {
			break
		}
	}
	t.Fatalf("testenv: start zookeeper: %v\n--- zookeeper log (%s) ---\n%s", err, zk.dir, zk.logs())
	return nil
}

// configure picks a free client port and writes zoo.cfg.
func (zk *ZooKeeperServer) configure() error {
	port, err := stablePort()
	if err != nil {
		return err
	}
	zk.port = port
	cfg := fmt.Sprintf(zooKeeperConfig, filepath.Join(zk.dir, "data"), port)
	if err := os.WriteFile(filepath.Join(zk.dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("write zoo.cfg: %w", err)
	}
	return nil
}

// start runs the server and waits until it serves.
func (zk *ZooKeeperServer) start() error {
	zk.mu.Lock()
	defer zk.mu.Unlock()
	if zk.proc != nil && !zk.proc.exited() {
		return nil
	}
	cp := zooKeeperJar
	if _, err := os.Stat(zooKeeperLogJar); err == nil {
		cp += ":" + zooKeeperLogJar
	}
	p, err := startProcess("zookeeper", filepath.Join(zk.dir, "zookeeper.log"), zk.java,
		// A small heap and no JIT tiers past C1: quick to start, enough
		// for a few ClickHouse nodes' metadata.
		"-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Dzookeeper.admin.enableServer=false",
		"-cp", cp, "org.apache.zookeeper.server.ZooKeeperServerMain",
		filepath.Join(zk.dir, "zoo.cfg"))
	if err != nil {
		return err
	}
	zk.proc = p
	return waitFor(context.Background(), p, zooKeeperStartTimeout, 100*time.Millisecond, zk.serving)
}

// serving asks "srvr", which answers with the mode once the server serves
// requests ("ruok" answers imok before that).
func (zk *ZooKeeperServer) serving(ctx context.Context) error {
	out, err := zk.Command(ctx, "srvr")
	if err != nil {
		return err
	}
	if !strings.Contains(out, "Mode: standalone") {
		return fmt.Errorf("zookeeper srvr: not serving yet: %q", out)
	}
	return nil
}

// Command sends a four-letter-word command allowed by the server's
// configuration ("ruok", "srvr" or "mntr") and returns the reply, e.g.
// Command(ctx, "mntr") for zk_znode_count and zk_num_alive_connections.
func (zk *ZooKeeperServer) Command(ctx context.Context, cmd string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", zk.Addr())
	if err != nil {
		return "", fmt.Errorf("zookeeper %s: %w", cmd, err)
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	if _, err := io.WriteString(conn, cmd); err != nil {
		return "", fmt.Errorf("zookeeper %s: %w", cmd, err)
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		return "", fmt.Errorf("zookeeper %s: %w", cmd, err)
	}
	return string(b), nil
}

// logs returns the tail of the server's log, for failure messages.
func (zk *ZooKeeperServer) logs() string {
	return fileTail(filepath.Join(zk.dir, "zookeeper.log"), 4000)
}

// Addr returns host:port of the client port, e.g. "127.0.0.1:40123".
func (zk *ZooKeeperServer) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(zk.port))
}

// Port returns the client port.
func (zk *ZooKeeperServer) Port() int { return zk.port }

// Stop shuts the server down (SIGTERM, SIGKILL after 10s) and waits for it
// to exit. Data and port are kept for Start.
func (zk *ZooKeeperServer) Stop() {
	zk.mu.Lock()
	defer zk.mu.Unlock()
	if zk.proc != nil {
		zk.proc.stop(10 * time.Second)
	}
}

// Kill SIGKILLs the server's process group and waits for it to exit. Data
// and port are kept for Start. Kill is also the cleanup.
func (zk *ZooKeeperServer) Kill() {
	zk.mu.Lock()
	defer zk.mu.Unlock()
	if zk.proc != nil {
		zk.proc.kill()
	}
}

// Start starts the server again after Stop or Kill, on the same port and
// data, and waits until it serves. It does nothing if the server is running.
// It fails the test ZooKeeper was started for on error, so call it from that
// test's goroutine; use StartContext elsewhere.
func (zk *ZooKeeperServer) Start() {
	zk.t.Helper()
	if err := zk.StartContext(context.Background()); err != nil {
		zk.t.Fatalf("testenv: %v", err)
	}
}

// StartContext is Start returning an error instead of failing the test.
func (zk *ZooKeeperServer) StartContext(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := zk.start(); err != nil {
		return fmt.Errorf("restart zookeeper: %w\n--- zookeeper log ---\n%s", err, zk.logs())
	}
	return nil
}

// zooKeeperConfig is zoo.cfg; %[1]s is the data directory, %[2]d the client
// port. Standalone (no server.N lines), loopback only, no admin server (it
// would take port 8080), no connection limit (several ClickHouse nodes and
// tests connect from 127.0.0.1).
const zooKeeperConfig = `tickTime=500
dataDir=%[1]s
clientPort=%[2]d
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,mntr
maxClientCnxns=0
autopurge.purgeInterval=0
`
