// Package testenv starts the real services edgepipe's tests run against:
// ClickHouse (Debian's clickhouse-server 18.16), a replicated, sharded
// ClickHouse cluster (ClickHouseCluster: several such servers and a ZooKeeper,
// Debian's zookeeper 3.8 run with java), a Kafka broker (kfake from franz-go,
// checked with kcat/librdkafka) and Prometheus (Debian's 2.42).
//
// Every helper takes a testing.TB, starts its service on free loopback ports
// with its own configuration and data in t.TempDir(), waits until the service
// answers, and registers its shutdown with t.Cleanup. External processes run in
// their own process group and get SIGKILL when the test binary dies
// (Pdeathsig), so nothing outlives a panicking or timed-out test.
//
// A missing binary skips the test with a hint to run `make deps`, except when
// the environment variable CI is "true": then it fails the test, so CI never
// passes by skipping the integration tests.
//
// NewPodman gives a test Debian's podman (runtime runc) with a configuration,
// storage and locks of its own, for tests that build and run edgepipe's
// container image.
//
// GoBuild builds edgepipe's own commands, once per test binary, for tests
// that run them as processes; such a package runs its tests through Main.
// TmpFS mounts a small tmpfs for tests that run a disk full for real.
package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/sandbox"
)

// inCI reports whether missing prerequisites must fail tests instead of
// skipping them.
func inCI() bool { return os.Getenv("CI") == "true" }

// Binary returns the absolute path of the executable name, looked up on PATH
// and then in /usr/bin, /usr/sbin, /usr/local/bin, /usr/local/sbin (sbin is
// often missing from a non-root PATH) and $GOPATH/bin (where `make deps`
// installs helm). When it is not found the test is skipped, or fails when
// CI=true.
func Binary(t testing.TB, name string) string {
	t.Helper()
	path, err := lookBinary(name)
	if err != nil {
		missing(t, "%s not found on PATH or in /usr/bin, /usr/sbin: run `make deps` to install it (%v)", name, err)
	}
	return path
}

func lookBinary(name string) (string, error) { return sandbox.LookBinary(name) }

// missing skips the test, or fails it when CI=true.
func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if inCI() {
		t.Fatalf("CI=true: "+format, args...)
		return
	}
	t.Skipf(format, args...)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. Another
// process may take it before the caller binds it; the service starters in this
// package retry with new ports when that happens.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatalf("testenv: find a free port: %v", err)
	}
	return port
}

// FreeAddr returns "127.0.0.1:PORT" for a port from FreePort.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("listen on 127.0.0.1:0: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stablePort returns a port for a server that keeps its port across
// restarts (ClickHouse, ZooKeeper, a Kafka broker), free a moment ago. It
// is below the kernel's ephemeral range (ip_local_port_range), so while the
// server is down for a test no outgoing connection and no ":0" listener of
// another test can take it, as one did once with a cluster node killed for
// 30 seconds. Where the range cannot be read, or leaves no room below it,
// it is a port like freePort's.
func stablePort() (int, error) {
	const lowest = 10000
	ephemeral := 32768 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil {
				ephemeral = lo
			}
		}
	}
	if ephemeral-lowest < 1000 {
		return freePort()
	}
	for range 100 {
		p := lowest + mathrand.IntN(ephemeral-lowest)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		l.Close()
		return p, nil
	}
	return freePort()
}

// process is an external service process in its own process group. Its
// output goes to a log file so a failing start can show it.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has been waited for
	err     error         // Wait's result, valid after done is closed
}

// startProcess starts bin with args in its own process group, with SIGKILL
// delivered to it if the test binary dies. stdout and stderr are appended to
// logPath.
func startProcess(name, logPath, bin string, args ...string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the whole process group.
func (p *process) signal(sig syscall.Signal) {
	if p.exited() {
		return
	}
	// Negative pid: the process group (Setpgid made pid the group leader).
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs the group. It returns
// once the process has been reaped.
func (p *process) stop(grace time.Duration) {
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.kill()
	}
	// Members of the group that outlived the leader.
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
}

// kill sends SIGKILL to the group and waits until the process is reaped.
func (p *process) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

// logTail returns the last n bytes of the process's log file.
func (p *process) logTail(n int) string {
	return fileTail(p.logPath, n)
}

func fileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

// waitFor calls ready every interval until it returns nil, the process exits,
// or timeout passes. It returns the last error.
func waitFor(ctx context.Context, p *process, timeout, interval time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		last = ready(attempt)
		cancelAttempt()
		if last == nil {
			return nil
		}
		if p != nil && p.exited() {
			exit := p.err
			if exit == nil {
				exit = errors.New("exit status 0")
			}
			return fmt.Errorf("%s exited during start-up (%w): %w", p.name, exit, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w", nameOf(p), timeout, errors.Join(last, ctx.Err()))
		case <-time.After(interval):
		}
	}
}

func nameOf(p *process) string {
	if p == nil {
		return "service"
	}
	return p.name
}

// addrInUse reports whether a log mentions a port clash.
func addrInUse(log string) bool {
	return strings.Contains(log, "Address already in use") || strings.Contains(log, "address already in use")
}

// uniqueName returns a name made of the test's name (lower-case letters,
// digits and '_' only) and a random suffix, usable as a database or topic name.
func uniqueName(t testing.TB, prefix string) string {
	var b strings.Builder
	b.WriteString(prefix)
	for _, r := range strings.ToLower(t.Name()) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		if b.Len() > 40 {
			break
		}
	}
	return fmt.Sprintf("%s_%s", b.String(), strings.ToLower(rand.Text()[:10]))
}
