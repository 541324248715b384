//go:build linux

package stdio

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"unsafe"
)

// On Linux every child gets a parent-death signal (SIGKILL), so that a relay
// killed with SIGKILL leaves no child behind. The kernel sends it when the
// thread that forked the child exits, not the process: children are
// therefore forked from one goroutine locked to its OS thread for the life
// of the process. A locked goroutine owns its thread, no other goroutine
// runs on it, and it never returns, so that thread never exits.

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

var spawner struct {
	once sync.Once
	reqs chan spawnReq
}

func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// startCmd starts cmd from the spawner thread.
func startCmd(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawner.reqs <- spawnReq{cmd, done}
	return <-done
}

// waitExited blocks until process pid has exited, without reaping it: while
// it is a zombie its pid, which is also its process group's id, cannot be
// reused, so the group can still be signalled safely.
func waitExited(pid int) {
	const pPID = 1
	const wNoWait = 0x1000000
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info[0])), syscall.WEXITED|wNoWait, 0, 0)
		if errno != syscall.EINTR {
			return
		}
	}
}
