package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestTmpFSRunsOutOfSpace(t *testing.T) {
	dir := TmpFS(t, 1<<20)
	err := os.WriteFile(filepath.Join(dir, "big"), make([]byte, 2<<20), 0o600)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing 2 MiB into a 1 MiB tmpfs: %v, want ENOSPC", err)
	}
}
