package testenv

import (
	"fmt"
	"go/build"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder is a testing.TB that records Fatalf and Skipf instead of stopping.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                      {}
func (r *recorder) Fatalf(f string, args ...any) { r.fatal = fmt.Sprintf(f, args...) }
func (r *recorder) Skipf(f string, args ...any)  { r.skip = fmt.Sprintf(f, args...) }

func TestBinaryMissing(t *testing.T) {
	tests := []struct {
		ci        string
		wantFatal bool
	}{{"true", true}, {"", false}, {"false", false}}
	for _, tc := range tests {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{TB: t}
			Binary(r, "edgepipe-no-such-binary")
			msg := r.skip
			if tc.wantFatal {
				msg = r.fatal
			}
			if (r.fatal != "") != tc.wantFatal || (r.skip != "") == tc.wantFatal {
				t.Fatalf("fatal=%q skip=%q, want fatal %v", r.fatal, r.skip, tc.wantFatal)
			}
			if !strings.Contains(msg, "make deps") || !strings.Contains(msg, "edgepipe-no-such-binary") {
				t.Fatalf("message %q should name the binary and `make deps`", msg)
			}
		})
	}
}

func TestBinaryFound(t *testing.T) {
	if p := Binary(t, "sh"); !strings.HasPrefix(p, "/") {
		t.Fatalf("Binary(sh) = %q, want an absolute path", p)
	}
}

func TestBinaryInGOPATHBin(t *testing.T) {
	gopath := t.TempDir()
	if err := os.MkdirAll(filepath.Join(gopath, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	tool := filepath.Join(gopath, "bin", "edgepipe-gopath-tool")
	if err := os.WriteFile(tool, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	saved := build.Default.GOPATH
	build.Default.GOPATH = gopath
	defer func() { build.Default.GOPATH = saved }()
	t.Setenv("PATH", "/nonexistent")
	if got := Binary(t, "edgepipe-gopath-tool"); got != tool {
		t.Fatalf("Binary = %q, want %q", got, tool)
	}
}

func TestFreeAddrIsBindable(t *testing.T) {
	addr := FreeAddr(t)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on FreeAddr %s: %v", addr, err)
	}
	l.Close()
}

func TestUniqueName(t *testing.T) {
	a, b := uniqueName(t, "t_"), uniqueName(t, "t_")
	if a == b {
		t.Fatalf("not unique: %s", a)
	}
	for _, r := range a {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			t.Fatalf("%q has %q, not usable as a ClickHouse or Kafka name", a, r)
		}
	}
}
