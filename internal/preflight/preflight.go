// Package preflight tries, once, each setting, credential and endpoint a
// program's configuration would use, and says in one line per check what
// it found or what to fix: the `exporter check` and `rtld-receiver check`
// commands.
//
// A Check is a name and a function returning a Result; Run runs a list of
// them in order with a timeout each, prints a line per check as it ends and
// a summary, and skips a check whose Needs did not pass ("skipped: needs
// X"). Each program builds its list from its own configuration (cmd/*/
// check.go), from the constructors of this package: the platform's token
// and scopes (platform.go), ClickHouse (clickhouse.go), the receiver's
// public URL and its certificate (tls.go), directories and files
// (files.go) and the OTLP endpoint (otlp.go). The Kafka checks live in
// cmd/rtld-receiver, so that the exporter does not link the Kafka sink.
//
// Checks never create, alter or write anything: they read, list and
// connect. Their messages never contain a secret.
package preflight

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// DefaultTimeout bounds a check whose Timeout is zero.
const DefaultTimeout = 20 * time.Second

// Status is the outcome of a check.
type Status int

// The outcomes of a check.
const (
	// Passed: the check found what the program needs.
	Passed Status = iota
	// Failed: the program cannot work as configured; the message says
	// what to fix.
	Failed
	// Skipped: the check did not run because a check it needs did not
	// pass.
	Skipped
)

// String is the status as the first column of a line shows it.
func (s Status) String() string {
	switch s {
	case Passed:
		return "ok"
	case Failed:
		return "FAIL"
	}
	return ""
}

// Result is what a check found.
type Result struct {
	Status Status
	// Message says what was found (Passed), what is wrong and how to fix
	// it (Failed), or which check is missing (Skipped).
	Message string
}

// Pass is a passed Result; the message says what was found.
func Pass(format string, a ...any) Result {
	return Result{Status: Passed, Message: fmt.Sprintf(format, a...)}
}

// Fail is a failed Result; the message says what is wrong and what to do.
func Fail(format string, a ...any) Result {
	return Result{Status: Failed, Message: fmt.Sprintf(format, a...)}
}

// Check is one thing a program's configuration needs, tried once.
type Check struct {
	// Name says what is checked ("credentials", "scope app.metrics",
	// "ClickHouse"); Needs of later checks refer to it.
	Name string
	// Needs names earlier checks that must pass for this one to run;
	// otherwise it is skipped, naming the first that did not pass.
	Needs []string
	// Timeout bounds Run (DefaultTimeout when zero).
	Timeout time.Duration
	// Run tries the check once, within ctx.
	Run func(ctx context.Context) Result
}

// CheckConfiguration is the name of a program's first check.
const CheckConfiguration = "configuration"

// Configuration is a program's first check, "configuration": it passes
// with summary, a sum-up of the configuration, or fails with err, why the
// program would refuse its flags and variables (a list holding only this
// check then: the others need a configuration the program accepts).
func Configuration(summary func() string, err error) Check {
	return Check{Name: CheckConfiguration, Run: func(context.Context) Result {
		if err != nil {
			return Fail("%v; the other checks need a configuration the program accepts", err)
		}
		return Pass("%s", summary())
	}}
}

// Summary counts the outcomes of Run.
type Summary struct {
	Passed, Failed, Skipped int
}

// Err is nil when every check passed, else an error counting the failed
// and skipped ones (ErrFailed).
func (s Summary) Err() error {
	if s.Failed == 0 && s.Skipped == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d failed, %d skipped", ErrFailed, s.Failed, s.Skipped)
}

// String renders the counts.
func (s Summary) String() string {
	return fmt.Sprintf("%d checks: %d passed, %d failed, %d skipped", s.Passed+s.Failed+s.Skipped, s.Passed, s.Failed, s.Skipped)
}

// ErrFailed is wrapped by Summary.Err when some check did not pass.
var ErrFailed = errors.New("not every check passed")

// Run runs checks in order within ctx and writes one line per check to w
// ("ok    name: message", "FAIL  name: message", "      name: skipped:
// needs X") as each ends, then the summary, which it returns. A name in
// Needs that no earlier check has is a programming error: the check is
// skipped saying so.
func Run(ctx context.Context, w io.Writer, checks []Check) Summary {
	var sum Summary
	status := make(map[string]Status, len(checks))
	for _, c := range checks {
		r := runOne(ctx, c, status)
		status[c.Name] = r.Status
		switch r.Status {
		case Passed:
			sum.Passed++
		case Failed:
			sum.Failed++
		default:
			sum.Skipped++
		}
		fmt.Fprintf(w, "%-4s  %s: %s\n", r.Status, c.Name, oneLine(r.Message))
	}
	fmt.Fprintln(w, sum)
	return sum
}

// runOne runs c unless a check it needs did not pass.
func runOne(ctx context.Context, c Check, status map[string]Status) Result {
	for _, n := range c.Needs {
		st, ran := status[n]
		if !ran {
			return Result{Status: Skipped, Message: "skipped: needs " + n + ", which is not checked (a bug of the check list)"}
		}
		if st != Passed {
			return Result{Status: Skipped, Message: "skipped: needs " + n}
		}
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r := c.Run(cctx)
	if r.Status == Skipped {
		r.Status = Failed // only Run skips
	}
	if r.Status == Failed && errors.Is(cctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		r.Message += fmt.Sprintf(" (gave up after %s)", timeout)
	}
	return r
}

// oneLine joins a multi-line message (a joined error) with "; ".
func oneLine(s string) string {
	var parts []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, "; ")
}
