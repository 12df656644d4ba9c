package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// Command is one of edgepipe's programs (see GoBuild) running as a child
// process, its stdout and stderr in one log file.
type Command struct {
	t      testing.TB
	cmd    *exec.Cmd
	log    string
	exited chan struct{} // closed once the process was waited for
	err    error         // Wait's result, valid once exited is closed
}

// StartCommand starts bin with args; env entries ("K=V") are added to this
// process's environment, and override it. The process is killed when the
// test ends if it still runs, and its log is shown if the test failed.
func StartCommand(t testing.TB, bin string, args []string, env ...string) *Command {
	t.Helper()
	c := &Command{t: t, log: filepath.Join(t.TempDir(), filepath.Base(bin)+".log"), exited: make(chan struct{})}
	f, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(bin, args...)
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stdout, c.cmd.Stderr = f, f
	if err := c.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		c.err = c.cmd.Wait()
		f.Close()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", filepath.Base(bin), fileTail(c.log, 60))
		}
	})
	return c
}

// Pid returns the process's ID.
func (c *Command) Pid() int { return c.cmd.Process.Pid }

// Log returns what the process wrote so far.
func (c *Command) Log() string {
	b, _ := os.ReadFile(c.log)
	return string(b)
}

// WaitLog waits up to timeout until the log matches re and returns the
// match and its submatches. It fails the test when the process ends or the
// time is up first.
func (c *Command) WaitLog(re *regexp.Regexp, timeout time.Duration) []string {
	c.t.Helper()
	deadline := time.After(timeout)
	for {
		if m := re.FindStringSubmatch(c.Log()); m != nil {
			return m
		}
		select {
		case <-c.exited:
			if m := re.FindStringSubmatch(c.Log()); m != nil {
				return m
			}
			c.t.Fatalf("%s ended (%v) before its log matched %s", filepath.Base(c.cmd.Path), c.err, re)
		case <-deadline:
			c.t.Fatalf("%s's log did not match %s within %s", filepath.Base(c.cmd.Path), re, timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// listeningOn is exporter-toolkit's log line naming a listener's address.
var listeningOn = regexp.MustCompile(`msg="Listening on" address=(\S+)`)

// ListenAddr waits until the program logs, as exporter-toolkit does, the
// address its web server listens on (e.g. with --web.listen-address=
// 127.0.0.1:0) and returns it.
func (c *Command) ListenAddr(timeout time.Duration) string {
	c.t.Helper()
	return c.WaitLog(listeningOn, timeout)[1]
}

// Stop sends SIGINT and waits up to 30 s for the process to end, returning
// its exit error.
func (c *Command) Stop() error {
	_ = c.cmd.Process.Signal(os.Interrupt)
	select {
	case <-c.exited:
		return c.err
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
		return errors.New("did not exit within 30 s of SIGINT")
	}
}

// RunCommand runs bin with args to its end (at most a minute) and returns
// its stdout, its stderr and its exit code. env is as for StartCommand.
func RunCommand(t testing.TB, bin string, args []string, env ...string) (stdout, stderr string, code int) {
	t.Helper()
	return RunCommandEnv(t, bin, args, append(os.Environ(), env...))
}

// RunCommandEnv is RunCommand with environ as the command's whole
// environment (nothing of the test's).
func RunCommandEnv(t testing.TB, bin string, args, environ []string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = environ
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("run %s %q: %v", bin, args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("%s %q did not end within a minute", bin, args)
	}
	return out.String(), errOut.String(), code
}

// ProcessArgs returns the command line of the process pid as the kernel
// shows it to every user of the machine (/proc/<pid>/cmdline, NUL bytes
// as spaces).
func ProcessArgs(t testing.TB, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatalf("process arguments: %v", err)
	}
	return string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
}
