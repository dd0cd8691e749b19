//go:build !unix

package redistest

import (
	"testing"
	"time"
)

// ProcessCPU returns the CPU time that this process has used so far; 0
// where it cannot tell, as here.
func ProcessCPU(tb testing.TB) time.Duration { return 0 }
