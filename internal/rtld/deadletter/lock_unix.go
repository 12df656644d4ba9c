//go:build unix

package deadletter

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockReplay takes the replay lock of a sink's directory, or fails at once
// when another process holds it.
func lockReplay(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".replay.lock"), os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		return nil, fmt.Errorf("opening the replay lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errors.New("another dead-letter replay of this sink is running")
		}
		return nil, fmt.Errorf("taking the replay lock: %w", err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
