//go:build !unix

package stdio

import (
	"os"
	"os/exec"
	"syscall"
)

// Without Unix process groups the child alone is stopped, by killing it.

func sysProcAttr() *syscall.SysProcAttr { return nil }

func startCmd(cmd *exec.Cmd) error { return cmd.Start() }

func waitExited(int) {}

type signal int

const (
	sigTerm signal = iota
	sigKill
)

func signalGroup(p *os.Process, _ signal) error { return p.Kill() }
