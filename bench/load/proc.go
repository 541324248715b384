package load

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// TreeMem is the resident memory of a process and all its descendants.
type TreeMem struct {
	RSS   uint64 `json:"rss"`   // sum of VmRSS, bytes
	Root  uint64 `json:"root"`  // VmRSS of the process itself, bytes
	Procs int    `json:"procs"` // the process and its descendants
}

// ReadTreeMem sums VmRSS (/proc/PID/status) over pid and every process
// descending from it (see tree). Linux only.
func ReadTreeMem(pid int) (TreeMem, error) {
	var m TreeMem
	for _, p := range tree(pid) {
		rss, err := vmRSS(p)
		if err != nil {
			if p == pid {
				return TreeMem{}, fmt.Errorf("load: memory of process %d: %w", pid, err)
			}
			continue
		}
		if p == pid {
			m.Root = rss
		}
		m.RSS += rss
		m.Procs++
	}
	return m, nil
}

// ReadTreeCPU sums the CPU time (user and system, /proc/PID/stat) that pid
// and every process descending from it have used so far. Linux only.
func ReadTreeCPU(pid int) (time.Duration, error) {
	var total time.Duration
	for _, p := range tree(pid) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/stat")
		var d time.Duration
		var ok bool
		if err == nil {
			d, ok = statCPU(b)
		}
		if !ok {
			if p == pid {
				return 0, fmt.Errorf("load: CPU time of process %d: %v", pid, err)
			}
			continue
		}
		total += d
	}
	return total, nil
}

// SelfCPU returns the CPU time (user and system) this process has used so
// far, its children not counted: what the load generator itself costs.
func SelfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("load: getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// tree returns pid and every process descending from it, found by parent
// pid (/proc/*/stat), so that children in process groups of their own (a
// stdio server per session) count too.
func tree(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	children := map[int][]int{}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // exited meanwhile
		}
		p, pp, ok := parseStat(b)
		if ok {
			children[pp] = append(children[pp], p)
		}
	}
	var all []int
	todo := []int{pid}
	for len(todo) > 0 {
		p := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		all = append(all, p)
		todo = append(todo, children[p]...)
	}
	return all
}

// userHZ is the unit of the times in /proc/PID/stat (USER_HZ, 100 on
// every Linux architecture's user ABI).
const userHZ = 100

// statCPU reads utime + stime (fields 14 and 15) of a /proc/PID/stat line.
func statCPU(b []byte) (time.Duration, bool) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * time.Second / userHZ, true
}

// parseStat reads the pid and parent pid of a /proc/PID/stat line: "pid
// (comm) state ppid ...", where comm may hold spaces and parentheses.
func parseStat(b []byte) (pid, ppid int, ok bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return 0, 0, false
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return pid, ppid, err == nil
}

// vmRSS reads VmRSS of a process in bytes (0 for a zombie, which has none).
func vmRSS(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	return statusRSS(b), nil
}

// statusRSS reads VmRSS out of a /proc/PID/status file, in bytes.
func statusRSS(b []byte) uint64 {
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
