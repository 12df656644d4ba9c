//go:build unix

package preflight

import "syscall"

// writable reports whether this process may create files in dir
// (access(2) with W_OK|X_OK), without writing anything.
func writable(dir string) error {
	const wOK, xOK = 0x2, 0x1
	return syscall.Access(dir, wOK|xOK)
}
