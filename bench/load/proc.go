package load

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// TreeMem is the resident memory of a process and all its descendants.
type TreeMem struct {
	RSS   uint64 `json:"rss"`   // sum of VmRSS, bytes
	Root  uint64 `json:"root"`  // VmRSS of the process itself, bytes
	Procs int    `json:"procs"` // the process and its descendants
}

// ReadTreeMem sums VmRSS (/proc/PID/status) over pid and every process
// descending from it, found by parent pid (/proc/*/stat), so that children
// in process groups of their own (a stdio server per session) count too.
// Linux only.
func ReadTreeMem(pid int) (TreeMem, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return TreeMem{}, err
	}
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
	var m TreeMem
	todo := []int{pid}
	for len(todo) > 0 {
		p := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
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
		todo = append(todo, children[p]...)
	}
	return m, nil
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
