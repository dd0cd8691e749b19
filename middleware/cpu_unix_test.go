//go:build unix

package middleware_test

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time this process has used, in all its
// threads, user and system (getrusage), or 0 if it cannot be read.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
