//go:build unix

package redistest

import (
	"syscall"
	"testing"
	"time"
)

// ProcessCPU returns the CPU time that this process has used so far, all
// its threads, user and system (getrusage); 0 where it cannot tell.
func ProcessCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
