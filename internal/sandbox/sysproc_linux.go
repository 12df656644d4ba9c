package sandbox

import "syscall"

// sysProcAttr puts a service in its own process group (Stop signals all of
// it) and has the kernel SIGKILL it when the process that started it dies,
// however it dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
