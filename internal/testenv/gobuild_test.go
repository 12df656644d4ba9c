package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

func TestGoBuildBuildsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	const pkg = "github.com/edgepipe/edgepipe/cmd/platform-sim"
	bin := GoBuild(t, pkg)
	if again := GoBuild(t, pkg); again != bin {
		t.Fatalf("second GoBuild = %q, want the first build %q", again, bin)
	}
	if filepath.Base(bin) != "platform-sim" || !filepath.IsAbs(bin) {
		t.Fatalf("GoBuild = %q, want an absolute path ending in platform-sim", bin)
	}
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", bin, err, out)
	}
	if !strings.Contains(string(out), "--web.listen-address") {
		t.Fatalf("%s --help does not list --web.listen-address:\n%s", bin, out)
	}
}

func TestGoBuildBinDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "exporter"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(BinDirEnv, dir)
	if got := GoBuild(t, "github.com/edgepipe/edgepipe/cmd/exporter"); got != filepath.Join(dir, "exporter") {
		t.Fatalf("GoBuild with %s = %q, want %q", BinDirEnv, got, filepath.Join(dir, "exporter"))
	}
	r := &recorder{TB: t}
	GoBuild(r, "github.com/edgepipe/edgepipe/cmd/rtld-receiver")
	if !strings.Contains(r.fatal, BinDirEnv) {
		t.Fatalf("GoBuild of a binary missing from %s: fatal %q, want it to name %s", BinDirEnv, r.fatal, BinDirEnv)
	}
}
