//go:build unix

package stdio

import (
	"os"
	"syscall"
)

// signalGroup sends sig to the child's process group (the child leads it).
func signalGroup(p *os.Process, sig syscall.Signal) error {
	return syscall.Kill(-p.Pid, sig)
}

var (
	sigTerm = syscall.SIGTERM
	sigKill = syscall.SIGKILL
)
