package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

// BinDirEnv names the environment variable that points GoBuild at already
// built binaries (e.g. the bin/ of `make build`) instead of building them.
const BinDirEnv = "EDGEPIPE_TEST_BIN_DIR"

// builds caches GoBuild's results for the lifetime of the test binary: each
// package is built once, into dir, which Main removes when the tests end.
var builds struct {
	sync.Mutex
	dir     string // empty until the first build
	running bool   // Main is running the tests
	pkgs    map[string]*builtPackage
}

// builtPackage is one package's build, done once.
type builtPackage struct {
	once sync.Once
	bin  string
	err  error
}

// Main runs the tests of a package that uses GoBuild and then removes the
// binaries GoBuild built. Call it from the package's TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) {
	builds.Lock()
	builds.running = true
	builds.Unlock()
	code := m.Run()
	builds.Lock()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
	}
	builds.Unlock()
	os.Exit(code)
}

// GoBuild builds the main package pkg (an import path, e.g.
// "github.com/edgepipe/edgepipe/cmd/rtld-receiver") the way `make build` does
// (CGO_ENABLED=0, -trimpath) and returns the executable's absolute path. Each
// package is built once per test binary; later calls return the same file.
//
// With the environment variable EDGEPIPE_TEST_BIN_DIR set, it returns the
// executable named like the package's last path element in that directory
// instead, failing the test if there is none.
//
// The calling package must run its tests through Main, which removes the
// binaries afterwards.
func GoBuild(t testing.TB, pkg string) string {
	t.Helper()
	if dir := os.Getenv(BinDirEnv); dir != "" {
		bin, err := filepath.Abs(filepath.Join(dir, path.Base(pkg)))
		if err == nil {
			_, err = os.Stat(bin)
		}
		if err != nil {
			t.Fatalf("testenv: %s: %v", BinDirEnv, err)
		}
		return bin
	}
	return buildOnce(t, pkg)
}

// buildOnce is GoBuild without EDGEPIPE_TEST_BIN_DIR: for test commands
// that `make build` does not build (cmd/chdb-server).
func buildOnce(t testing.TB, pkg string) string {
	t.Helper()
	gobin := Binary(t, "go")
	b, err := buildOf(pkg)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	b.once.Do(func() { b.bin, b.err = goBuild(gobin, pkg) })
	if b.err != nil {
		t.Fatalf("testenv: %v", b.err)
	}
	return b.bin
}

// buildOf returns pkg's cache entry, creating the build directory on first
// use.
func buildOf(pkg string) (*builtPackage, error) {
	builds.Lock()
	defer builds.Unlock()
	if !builds.running {
		return nil, fmt.Errorf("GoBuild(%q): the package's TestMain must call testenv.Main", pkg)
	}
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "edgepipe-test-bin-")
		if err != nil {
			return nil, fmt.Errorf("create build directory: %w", err)
		}
		builds.dir, builds.pkgs = dir, map[string]*builtPackage{}
	}
	b, ok := builds.pkgs[pkg]
	if !ok {
		b = &builtPackage{}
		builds.pkgs[pkg] = b
	}
	return b, nil
}

// goBuild runs `go build` for pkg into its own subdirectory of the build
// directory (so commands with the same last path element do not clash).
func goBuild(gobin, pkg string) (string, error) {
	builds.Lock()
	dir, err := os.MkdirTemp(builds.dir, "")
	builds.Unlock()
	if err != nil {
		return "", fmt.Errorf("create build directory for %s: %w", pkg, err)
	}
	bin := filepath.Join(dir, path.Base(pkg))
	cmd := exec.Command(gobin, "build", "-trimpath", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}
