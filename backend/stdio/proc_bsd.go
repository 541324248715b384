//go:build unix && !linux

package stdio

import (
	"os/exec"
	"syscall"
)

// Outside Linux there is no parent-death signal: a relay killed with
// SIGKILL leaves its children running until they read end of file on stdin.

func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func startCmd(cmd *exec.Cmd) error { return cmd.Start() }

// waitExited returns at once: the group is signalled after the child is
// reaped, when its id could in principle be reused.
func waitExited(int) {}
