package redistest

import "syscall"

// sysProcAttr makes the kernel kill a server if the test binary dies
// without stopping it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
