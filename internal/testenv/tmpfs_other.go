//go:build !linux

package testenv

import "testing"

// TmpFS mounts a tmpfs of size bytes for a test; only on Linux. Elsewhere
// the test is skipped, or fails when CI=true.
func TmpFS(t testing.TB, size int64) string {
	t.Helper()
	missing(t, "mounting a tmpfs for a test needs Linux")
	return ""
}
