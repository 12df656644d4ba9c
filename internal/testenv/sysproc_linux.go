package testenv

import "syscall"

// sysProcAttr puts a service in its own process group (so cleanup can kill
// everything it spawned) and has the kernel SIGKILL it when the test binary
// dies, even by a panic or a -timeout abort that skips t.Cleanup.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
