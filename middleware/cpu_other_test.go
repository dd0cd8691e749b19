//go:build !unix

package middleware_test

import "time"

// processCPU returns 0: the CPU time is read on Unix only.
func processCPU() time.Duration { return 0 }
