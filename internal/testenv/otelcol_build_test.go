package testenv

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestLockFileExcludes(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := lockFile(context.Background(), path, t.Logf)
	if err != nil {
		t.Fatal(err)
	}

	// A second locker (another open file description, as in another test
	// binary) waits while the lock is held...
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if _, err := lockFile(ctx, path, t.Logf); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock while held: %v, want a deadline error", err)
	}

	// ...and gets it once the holder releases it.
	got := make(chan error, 1)
	go func() {
		unlock2, err := lockFile(context.Background(), path, t.Logf)
		if err == nil {
			unlock2()
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond)
	unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("lock after release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("lock not taken 10s after release")
	}
}

func TestOTelCollectorCachePath(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/cache")
	p, err := OTelCollectorCachePath()
	if err != nil {
		t.Fatal(err)
	}
	dir, name := filepath.Split(p)
	if name != otelColBinaryName || filepath.Dir(filepath.Clean(dir)) != "/cache/edgepipe" {
		t.Errorf("cache path %s", p)
	}
	if base := filepath.Base(filepath.Clean(dir)); base != "otelcol-"+otelColKey() || len(otelColKey()) != 16 {
		t.Errorf("cache directory %s, key %s", base, otelColKey())
	}
}

func TestOTelCollectorBinaryFromEnv(t *testing.T) {
	bin := Binary(t, "true")
	t.Setenv(OTelCollectorEnv, bin)
	if got := OTelCollectorBinary(t); got != bin {
		t.Errorf("OTelCollectorBinary = %s, want %s", got, bin)
	}
}
