package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TmpFS mounts a tmpfs of size bytes on a new directory and returns the
// directory; the test's cleanup unmounts it. It needs root (or
// CAP_SYS_ADMIN): where the mount fails the test is skipped, or fails when
// CI=true. Tests use it to run out of disk space for real.
func TmpFS(t testing.TB, size int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV,
		fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		missing(t, "cannot mount a %d-byte tmpfs on %s (needs root or CAP_SYS_ADMIN): %v", size, dir, err)
		return ""
	}
	t.Cleanup(func() { unmount(t, dir) })
	return dir
}

// unmount unmounts dir, waiting briefly for processes that still hold
// files there, then detaching it lazily.
func unmount(t testing.TB, dir string) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Unmount(dir, 0)
		if err == nil {
			return
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
				t.Errorf("testenv: unmounting the tmpfs on %s: %v", dir, err)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
