package testenv

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// OTelCollectorBuilderVersion is the version of the OpenTelemetry Collector
// Builder (ocb) that builds the test collector. The core components of
// testdata/otelcol-builder.yaml carry the same version.
const OTelCollectorBuilderVersion = "v0.165.0"

// OTelCollectorEnv names the environment variable that points the tests at a
// prebuilt collector binary instead of the cached build.
const OTelCollectorEnv = "EDGEPIPE_OTELCOL"

// otelColBinaryName is the dist.name of the manifest.
const otelColBinaryName = "otelcol-edgepipe"

//go:embed testdata/otelcol-builder.yaml
var otelColManifest []byte

// otelColBuild remembers, for the lifetime of the test binary, the result of
// the first OTelCollectorBinary call, so a failed build is not retried by
// every test.
var otelColBuild struct {
	once sync.Once
	bin  string
	err  error
}

// OTelCollectorBinary returns the path of the test collector: the file named
// by EDGEPIPE_OTELCOL if set (the test fails if it is not an executable),
// otherwise the cached build of testdata/otelcol-builder.yaml, built now if
// missing (see BuildOTelCollector; `make deps` builds it ahead). A build that
// fails skips the test, or fails it when CI=true.
func OTelCollectorBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(OTelCollectorEnv); p != "" {
		bin, err := filepath.Abs(p)
		if err == nil {
			err = checkExecutable(bin)
		}
		if err != nil {
			t.Fatalf("testenv: %s: %v", OTelCollectorEnv, err)
		}
		return bin
	}
	otelColBuild.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		otelColBuild.bin, otelColBuild.err = BuildOTelCollector(ctx, t.Logf)
	})
	if otelColBuild.err != nil {
		missing(t, "testenv: OpenTelemetry Collector not available: %v\n(run `make deps` to build it, or set %s to a collector binary)", otelColBuild.err, OTelCollectorEnv)
	}
	return otelColBuild.bin
}

// OTelCollectorCachePath returns where the build of the embedded manifest
// is cached: <user cache dir>/edgepipe/otelcol-<hash>/otelcol-edgepipe, the
// hash covering the manifest, the builder version and the platform.
func OTelCollectorCachePath() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find the user cache directory: %w", err)
	}
	return filepath.Join(base, "edgepipe", "otelcol-"+otelColKey(), otelColBinaryName), nil
}

// otelColKey identifies a build: the manifest, the builder and the target
// platform.
func otelColKey() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s/%s\n", OTelCollectorBuilderVersion, runtime.GOOS, runtime.GOARCH)
	h.Write(otelColManifest)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// BuildOTelCollector returns the path of the cached collector binary
// (OTelCollectorCachePath), building it first if it is missing: `go run
// go.opentelemetry.io/collector/cmd/builder@OTelCollectorBuilderVersion`
// on the embedded manifest, in a scratch directory of its own (its own
// go.mod, so the collector's dependency versions never touch edgepipe's), then
// the binary is renamed into place. A lock file beside the cache directory
// makes concurrent callers (parallel test binaries, `make deps`) wait for one
// build instead of running several. The build takes minutes; logf reports
// progress.
func BuildOTelCollector(ctx context.Context, logf func(format string, args ...any)) (string, error) {
	bin, err := OTelCollectorCachePath()
	if err != nil {
		return "", err
	}
	if checkExecutable(bin) == nil {
		return bin, nil
	}
	dir := filepath.Dir(bin)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", fmt.Errorf("create collector cache directory: %w", err)
	}
	unlock, err := lockFile(ctx, dir+".lock", logf)
	if err != nil {
		return "", err
	}
	defer unlock()
	if checkExecutable(bin) == nil { // built while we waited
		return bin, nil
	}
	gobin, err := lookBinary("go")
	if err != nil {
		return "", fmt.Errorf("the collector is built with go: %w", err)
	}
	scratch, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".build-")
	if err != nil {
		return "", fmt.Errorf("create collector build directory: %w", err)
	}
	defer os.RemoveAll(scratch)
	manifest, err := otelColManifestFor(filepath.Join(scratch, "src"), gobin)
	if err != nil {
		return "", err
	}
	manifestPath := filepath.Join(scratch, "builder.yaml")
	if err := os.WriteFile(manifestPath, manifest, 0o644); err != nil {
		return "", fmt.Errorf("write collector manifest: %w", err)
	}
	logPath := filepath.Join(scratch, "build.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return "", fmt.Errorf("create collector build log: %w", err)
	}
	defer logFile.Close()

	logf("testenv: building the OpenTelemetry Collector with ocb %s into %s (takes minutes, once per machine)", OTelCollectorBuilderVersion, dir)
	start := time.Now()
	cmd := exec.CommandContext(ctx, gobin, "run", "go.opentelemetry.io/collector/cmd/builder@"+OTelCollectorBuilderVersion,
		"--config", manifestPath)
	cmd.Dir = scratch
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-buildvcs=false")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("ocb %s: %w\n--- build log ---\n%s", OTelCollectorBuilderVersion, err, fileTail(logPath, 6000))
	}
	built := filepath.Join(scratch, "src", otelColBinaryName)
	if err := checkExecutable(built); err != nil {
		return "", fmt.Errorf("ocb finished without a binary: %w\n%s", err, fileTail(logPath, 6000))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create collector cache directory: %w", err)
	}
	// Keep the resolved go.mod beside the binary: it records every module
	// version the collector was built from.
	if err := os.Rename(filepath.Join(scratch, "src", "go.mod"), filepath.Join(dir, "go.mod")); err != nil {
		return "", fmt.Errorf("keep the collector's go.mod: %w", err)
	}
	if err := os.Rename(built, bin); err != nil {
		return "", fmt.Errorf("move the collector into the cache: %w", err)
	}
	if fi, err := os.Stat(bin); err == nil {
		logf("testenv: built %s (%.1f MiB) in %s", bin, float64(fi.Size())/(1<<20), time.Since(start).Round(time.Second))
	}
	return bin, nil
}

// otelColManifestFor returns the embedded manifest with dist.output_path
// set to out and dist.go to gobin (the go command ocb runs; it would look
// for one on PATH).
func otelColManifestFor(out, gobin string) ([]byte, error) {
	var m map[string]any
	if err := yaml.Unmarshal(otelColManifest, &m); err != nil {
		return nil, fmt.Errorf("parse collector manifest: %w", err)
	}
	dist, ok := m["dist"].(map[string]any)
	if !ok {
		return nil, errors.New("collector manifest has no dist section")
	}
	dist["output_path"] = out
	dist["go"] = gobin
	b, err := yaml.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("write collector manifest: %w", err)
	}
	return b, nil
}

// lockFile takes an exclusive flock on path (created if needed), polling
// until ctx ends, and returns its release.
func lockFile(ctx context.Context, path string, logf func(format string, args ...any)) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	waiting := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !waiting {
			logf("testenv: waiting for another process building the collector (lock %s)", path)
			waiting = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// checkExecutable returns nil if path is a regular file with an execute bit.
func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}
