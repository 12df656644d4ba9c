//go:build !linux

package sandbox

import "syscall"

// sysProcAttr puts a service in its own process group (Stop signals all of
// it).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
