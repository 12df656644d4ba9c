//go:build !linux

package testenv

import "syscall"

// sysProcAttr puts a service in its own process group so cleanup can kill
// everything it spawned.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
