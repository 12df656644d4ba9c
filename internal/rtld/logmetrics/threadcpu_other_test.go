//go:build !linux

package logmetrics

import "time"

// threadCPU is not measured outside Linux.
func threadCPU() time.Duration { return 0 }
