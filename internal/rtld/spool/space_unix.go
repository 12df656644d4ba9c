//go:build unix

package spool

import (
	"errors"
	"syscall"
)

// freeBytes returns the space available to this process in dir's file
// system.
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil //nolint:unconvert // Bsize is int64 on linux/amd64 only (uint32 on darwin, int32 on linux/386)
}

// isNoSpace reports whether err means the disk (or the quota) is full.
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
