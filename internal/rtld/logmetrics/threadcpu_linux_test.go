package logmetrics

import (
	"syscall"
	"time"
)

// threadCPU returns the CPU time the calling thread has used (lock the
// goroutine to its thread around a measurement): unlike the wall time it
// hardly moves when other work shares the machine.
func threadCPU() time.Duration {
	const rusageThread = 1 // RUSAGE_THREAD
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
