//go:build unix

package redistest

import "syscall"

var sigStop, sigCont = syscall.SIGSTOP, syscall.SIGCONT
