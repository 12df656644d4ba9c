package preflight

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestRun: one line per check in order, a check whose need did not pass
// is skipped naming it, a check that runs out of time says so, and the
// summary counts every outcome; Err is nil only when all passed.
func TestRun(t *testing.T) {
	ok := func(context.Context) Result { return Pass("fine") }
	checks := []Check{
		{Name: "a", Run: ok},
		{Name: "b", Run: func(context.Context) Result { return Fail("broken:\nfix it") }},
		{Name: "c", Needs: []string{"a"}, Run: ok},
		{Name: "d", Needs: []string{"a", "b"}, Run: ok},
		{Name: "e", Needs: []string{"d"}, Run: ok},
		{Name: "f", Timeout: 10 * time.Millisecond, Run: func(ctx context.Context) Result {
			<-ctx.Done()
			return Fail("%v", ctx.Err())
		}},
		{Name: "g", Needs: []string{"nope"}, Run: ok},
		{Name: "h", Run: func(context.Context) Result { return Result{Status: Skipped, Message: "not mine to say"} }},
	}
	var out bytes.Buffer
	sum := Run(context.Background(), &out, checks)
	want := []string{
		"ok    a: fine",
		"FAIL  b: broken:; fix it",
		"ok    c: fine",
		"      d: skipped: needs b",
		"      e: skipped: needs d",
		"FAIL  f: context deadline exceeded (gave up after 10ms)",
		"      g: skipped: needs nope, which is not checked (a bug of the check list)",
		"FAIL  h: not mine to say",
		"8 checks: 2 passed, 3 failed, 3 skipped",
	}
	if got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), strings.Join(want, "\n"))
	}
	if sum != (Summary{Passed: 2, Failed: 3, Skipped: 3}) || !errors.Is(sum.Err(), ErrFailed) {
		t.Errorf("summary %+v, err %v", sum, sum.Err())
	}
	if err := (Summary{Passed: 3}).Err(); err != nil {
		t.Errorf("all passed: %v", err)
	}
}

func TestScopeGranted(t *testing.T) {
	for _, tc := range []struct {
		granted, want string
		ok            bool
	}{
		{"app.metrics app.accounts", "app.accounts", true},
		{"app.metrics+app.rtld", "app.rtld", true},
		{"app", "app.config", true},
		{"app.metrics", "app.metrics:read", true},
		{"app.metrics", "app.metricsx", false},
		{"app.accounts", "app.config", false},
	} {
		if got := scopeGranted(tc.granted, tc.want); got != tc.ok {
			t.Errorf("scopeGranted(%q, %q) = %v", tc.granted, tc.want, got)
		}
	}
}
