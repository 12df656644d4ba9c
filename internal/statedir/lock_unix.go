//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package statedir

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lock takes an exclusive advisory lock (flock) on path, without waiting,
// and returns the function that releases it. The kernel releases it when
// the process dies, so a crash never leaves the directory locked.
func lock(path string) (func() error, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (%s is locked; two exporters must never share a state directory)", ErrLocked, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() error {
		return errors.Join(syscall.Flock(int(f.Fd()), syscall.LOCK_UN), f.Close())
	}, nil
}
