// Package sandbox starts throwaway services on loopback for `make demo` and
// `make docs`: a clickhouse-server with its own configuration and data
// directory, and a Kafka broker (kfake, in this process). Tests start their
// services through internal/testenv, which writes ClickHouse's
// configuration with WriteClickHouseConfig too, so the demo's server is
// configured as the tests' are.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"go/build"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// WriteClickHouseConfig writes the configuration of a clickhouse-server of
// its own under dir: config.xml (listening on 127.0.0.1 at tcpPort, native
// protocol, and httpPort; data, logs and temporary files under dir; small
// caches; UTC) with sections added inside <yandex> as they are (a cluster
// node's interserver port, zookeeper, remote_servers, macros), users.xml
// (user default, no password, from loopback only, no quota) and the
// directories they name. Writing it again (other ports) keeps the data.
func WriteClickHouseConfig(dir string, tcpPort, httpPort int, sections string) error {
	for _, sub := range []string{"data", "tmp", "user_files", "format_schemas", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return fmt.Errorf("clickhouse directory: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "users.xml"), []byte(clickHouseUsersXML), 0o644); err != nil {
		return fmt.Errorf("write clickhouse users.xml: %w", err)
	}
	cfg := fmt.Sprintf(clickHouseConfigXML, dir, tcpPort, httpPort, sections)
	if err := os.WriteFile(filepath.Join(dir, "config.xml"), []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("write clickhouse config.xml: %w", err)
	}
	return nil
}

// ClickHouseCommand finds clickhouse-server (Debian's package), or the
// multi-call clickhouse binary of upstream packages ("clickhouse server"),
// on PATH or in the usual directories. Append
// --config-file=<dir>/config.xml to run it.
func ClickHouseCommand() (bin string, args []string, err error) {
	if p, err := LookBinary("clickhouse-server"); err == nil {
		return p, nil, nil
	}
	if p, err := LookBinary("clickhouse"); err == nil {
		return p, []string{"server"}, nil
	}
	return "", nil, errors.New("clickhouse-server not found on PATH or in /usr/bin, /usr/sbin: `make deps` installs it")
}

// LookBinary returns the absolute path of the executable name, looked up on
// PATH and then in /usr/bin, /usr/sbin, /usr/local/bin, /usr/local/sbin
// (sbin is often missing from a non-root PATH) and $GOPATH/bin (where
// `make deps` installs helm).
func LookBinary(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return filepath.Abs(p)
	}
	dirs := []string{"/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"}
	for _, gopath := range filepath.SplitList(build.Default.GOPATH) {
		dirs = append(dirs, filepath.Join(gopath, "bin"))
	}
	for _, dir := range dirs {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %q not found", name)
}

// ClickHouse is a clickhouse-server started by StartClickHouse.
type ClickHouse struct {
	dir            string
	addr, httpAddr string
	cmd            *exec.Cmd
	done           chan struct{} // closed once the process has been waited for
}

// clickHouseStartTimeout bounds a start (well under a second on an idle
// machine; busy ones are slower).
const clickHouseStartTimeout = 90 * time.Second

// ClickHouseOptions say where a server started by StartClickHouse lives.
type ClickHouseOptions struct {
	// Dir holds its configuration, data and logs (WriteClickHouseConfig).
	Dir string
	// Addr and HTTPAddr are where it listens, host:port on loopback:
	// the native protocol and the HTTP interface.
	Addr, HTTPAddr string
	// Bin is clickhouse-server, or the multi-call clickhouse binary;
	// empty: found by ClickHouseCommand.
	Bin string
}

// StartClickHouse configures a server as o says, starts it in its own
// process group (killed with this process on Linux) with its output in
// <Dir>/log/stdout.log, and waits until it answers a ping.
func StartClickHouse(ctx context.Context, o ClickHouseOptions) (*ClickHouse, error) {
	bin, args, err := ClickHouseCommand()
	if o.Bin != "" {
		bin, args, err = o.Bin, nil, nil
		if filepath.Base(o.Bin) == "clickhouse" {
			args = []string{"server"}
		}
	}
	if err != nil {
		return nil, err
	}
	addr, httpAddr, dir := o.Addr, o.HTTPAddr, o.Dir
	tcpPort, err := port(addr)
	if err != nil {
		return nil, err
	}
	httpPort, err := port(httpAddr)
	if err != nil {
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	if err := WriteClickHouseConfig(dir, tcpPort, httpPort, ""); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "log", "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append(args, "--config-file="+filepath.Join(dir, "config.xml"))...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	c := &ClickHouse{dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(tcpPort)),
		httpAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)), cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(c.done)
	}()
	if err := c.waitReady(ctx); err != nil {
		c.Stop()
		return nil, fmt.Errorf("clickhouse-server (log in %s): %w\n%s", filepath.Join(dir, "log"), err, c.errorLog())
	}
	return c, nil
}

// errorLog returns the end of the server's error log, for messages.
func (c *ClickHouse) errorLog() string {
	b, err := os.ReadFile(filepath.Join(c.dir, "log", "clickhouse-server.err.log"))
	if err != nil {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func port(addr string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("address %q: %w", addr, err)
	}
	return strconv.Atoi(p)
}

// waitReady pings the server until it answers, it exits or the start
// timeout passes.
func (c *ClickHouse) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, clickHouseStartTimeout)
	defer cancel()
	for {
		err := c.ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("exited during start-up: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("no answer: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *ClickHouse) ping(ctx context.Context) error {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.addr}, Auth: clickhouse.Auth{Username: "default"}, DialTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return conn.Ping(ctx)
}

// Addr is the native protocol's host:port.
func (c *ClickHouse) Addr() string { return c.addr }

// HTTPAddr is the HTTP interface's host:port.
func (c *ClickHouse) HTTPAddr() string { return c.httpAddr }

// DSN is the clickhouse-go DSN of database (which the programs' sinks
// create), e.g. clickhouse://127.0.0.1:9000/cdn.
func (c *ClickHouse) DSN(database string) string { return "clickhouse://" + c.addr + "/" + database }

// Pid is the server's process ID.
func (c *ClickHouse) Pid() int { return c.cmd.Process.Pid }

// Stop shuts the server down (SIGTERM to its process group, SIGKILL after
// 15 s) and returns once it has exited.
func (c *ClickHouse) Stop() {
	pgid := -c.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
	}
	_ = syscall.Kill(pgid, syscall.SIGKILL) // what outlived the leader, or the leader
	<-c.done
}

// clickHouseConfigXML is the server config (WriteClickHouseConfig); %[1]s is the directory, %[2]d the
// native port, %[3]d the HTTP port, %[4]s further sections (empty for a
// single server: no interserver port, no ZooKeeper). Small caches (tests run
// several servers on small machines), UTC, logs in the directory.
const clickHouseConfigXML = `<?xml version="1.0"?>
<yandex>
    <logger>
        <level>information</level>
        <log>%[1]s/log/clickhouse-server.log</log>
        <errorlog>%[1]s/log/clickhouse-server.err.log</errorlog>
        <size>10M</size>
        <count>1</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>%[2]d</tcp_port>
    <http_port>%[3]d</http_port>
    <path>%[1]s/data/</path>
    <tmp_path>%[1]s/tmp/</tmp_path>
    <user_files_path>%[1]s/user_files/</user_files_path>
    <format_schema_path>%[1]s/format_schemas/</format_schema_path>
    <users_config>%[1]s/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mark_cache_size>67108864</mark_cache_size>
    <uncompressed_cache_size>67108864</uncompressed_cache_size>
    <max_concurrent_queries>200</max_concurrent_queries>
    <max_connections>1024</max_connections>
    <keep_alive_timeout>3</keep_alive_timeout>
    <mlock_executable>false</mlock_executable>
    <builtin_dictionaries_reload_interval>3600</builtin_dictionaries_reload_interval>
    <max_session_timeout>3600</max_session_timeout>
    <default_session_timeout>60</default_session_timeout>
    <query_log>
        <database>system</database>
        <table>query_log</table>
        <flush_interval_milliseconds>1000</flush_interval_milliseconds>
    </query_log>
%[4]s</yandex>
`

// clickHouseUsersXML: user default without password from loopback, no quota
// limits.
const clickHouseUsersXML = `<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <max_memory_usage>2000000000</max_memory_usage>
            <load_balancing>random</load_balancing>
            <poll_interval>1</poll_interval>
        </default>
        <readonly>
            <readonly>1</readonly>
        </readonly>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>::1</ip>
                <ip>127.0.0.1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
`
