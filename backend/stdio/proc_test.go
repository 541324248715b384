//go:build linux

package stdio_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/backend/stdio"
)

// proc is one process as /proc shows it.
type proc struct {
	pid, ppid, pgid int
	state           string
}

func procs(t *testing.T) []proc {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		ppid, _ := strconv.Atoi(f[1])
		pgid, _ := strconv.Atoi(f[2])
		out = append(out, proc{pid: pid, ppid: ppid, pgid: pgid, state: f[0]})
	}
	return out
}

// leftovers returns the processes, zombies included, that are children of
// this process or members of one of groups.
func leftovers(t *testing.T, groups map[int]bool) []proc {
	t.Helper()
	var out []proc
	for _, p := range procs(t) {
		if p.ppid == os.Getpid() || groups[p.pgid] {
			out = append(out, p)
		}
	}
	return out
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0] != "Z"
}

// echoCommand is a minimal stdio server: it answers every request whose id
// is a number (the connector's ids are) with an empty result.
var echoCommand = []string{"sed", "-u", "-n", `s/.*"id":\([0-9][0-9]*\).*/{"jsonrpc":"2.0","id":\1,"result":{}}/p`}

func openT(t *testing.T, c *stdio.Connector, id string) *stdio.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s, _, err := c.Open(ctx, backend.Init{Request: []byte(`{"jsonrpc":"2.0","id":` + id + `,"method":"initialize","params":{}}`)})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s.(*stdio.Session)
}

// TestManySessionsLeaveNoProcess opens 200 sessions (200 children at once),
// closes them, and checks /proc: no child of this process, zombie or not,
// and nothing left in the children's process groups.
func TestManySessionsLeaveNoProcess(t *testing.T) {
	const n = 200
	c, err := stdio.New(stdio.Options{Command: echoCommand, MaxChildren: n})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	groups := map[int]bool{}
	var ss []*stdio.Session
	for i := range n {
		s := openT(t, c, strconv.Itoa(i))
		ss = append(ss, s)
		groups[s.PID()] = true
	}
	if got := c.Children(); got != n {
		t.Fatalf("Children() = %d with %d sessions open", got, n)
	}
	if got := len(leftovers(t, groups)); got != n {
		t.Fatalf("/proc shows %d children, want %d", got, n)
	}
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Go(func() { s.Close() })
	}
	wg.Wait()
	if got := c.Children(); got != 0 {
		t.Errorf("Children() = %d after closing every session", got)
	}
	if left := leftovers(t, groups); len(left) != 0 {
		t.Fatalf("%d processes left after closing every session, e.g. %+v", len(left), left[0])
	}
}

// TestCloseStopsEveryChild: Connector.Close stops the children of sessions
// never closed, and Open fails afterwards.
func TestCloseStopsEveryChild(t *testing.T) {
	c, err := stdio.New(stdio.Options{Command: echoCommand})
	if err != nil {
		t.Fatal(err)
	}
	groups := map[int]bool{}
	for i := range 5 {
		groups[openT(t, c, strconv.Itoa(i)).PID()] = true
	}
	c.Close()
	if left := leftovers(t, groups); len(left) != 0 || c.Children() != 0 {
		t.Fatalf("after Close: Children() = %d, /proc shows %+v", c.Children(), left)
	}
	_, _, err = c.Open(t.Context(), backend.Init{Request: []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize"}`)})
	if !errors.Is(err, stdio.ErrClosed) {
		t.Fatalf("Open after Close: %v, want ErrClosed", err)
	}
}

// TestStopGrace: a child that ignores SIGTERM is killed after StopGrace.
func TestStopGrace(t *testing.T) {
	const grace = 300 * time.Millisecond
	c := newConnector(t, "ignore-term", stdio.Options{StopGrace: grace})
	s := openT(t, c, "1")
	start := time.Now()
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return in 20s: the child was never killed")
	}
	if d := time.Since(start); d < grace {
		t.Fatalf("Close returned after %v, before the grace of %v", d, grace)
	}
	if alive(s.PID()) {
		t.Fatal("the child still runs after Close")
	}
}

// TestMaxChildren: beyond MaxChildren, Open is refused with an
// UnavailableError until a session ends.
func TestMaxChildren(t *testing.T) {
	c, err := stdio.New(stdio.Options{Command: echoCommand, MaxChildren: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a := openT(t, c, "1")
	openT(t, c, "2")
	_, _, err = c.Open(t.Context(), backend.Init{Request: []byte(`{"jsonrpc":"2.0","id":3,"method":"initialize"}`)})
	var ue *backend.UnavailableError
	if !errors.As(err, &ue) || ue.RetryAfter <= 0 || !errors.Is(err, stdio.ErrTooManyChildren) {
		t.Fatalf("third Open: %v, want an UnavailableError with RetryAfter wrapping ErrTooManyChildren", err)
	}
	a.Close()
	openT(t, c, "4")
}

// TestStartBackoff: a command that exits at once is started a handful of
// times, not in a loop, however often Open is called; Open reports the
// exit status and the last stderr line, and Env and Dir reach the child.
func TestStartBackoff(t *testing.T) {
	dir := t.TempDir()
	spawns := filepath.Join(dir, "spawns")
	c, err := stdio.New(stdio.Options{
		Command:      []string{"sh", "-c", `echo x >> spawns; echo "fatal: $CONFIG missing in $PWD" >&2; exit 3`},
		Env:          []string{"CONFIG=relay.toml"},
		Dir:          dir,
		StartBackoff: stdio.Backoff{Min: 100 * time.Millisecond, Max: 400 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const window = 1500 * time.Millisecond
	opens := 0
	var last error
	for start := time.Now(); time.Since(start) < window; opens++ {
		_, _, err := c.Open(t.Context(), backend.Init{Request: []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize"}`)})
		var ue *backend.UnavailableError
		if !errors.As(err, &ue) || !errors.Is(err, stdio.ErrStartFailing) || ue.RetryAfter > 400*time.Millisecond {
			t.Fatalf("Open: %v, want an UnavailableError wrapping ErrStartFailing, RetryAfter at most the maximum", err)
		}
		last = err
		time.Sleep(time.Millisecond)
	}
	b, _ := os.ReadFile(spawns)
	n := strings.Count(string(b), "x")
	// 0, 0.1, 0.3, 0.7, 1.1, 1.5 s: at most 6 starts, plus one for slow exits.
	if n < 3 || n > 7 {
		t.Fatalf("%d starts in %v (%d Opens), want 3 to 7", n, window, opens)
	}
	want := `exit status 3; last stderr line: "fatal: relay.toml missing in ` + dir + `"`
	if !strings.Contains(last.Error(), want) {
		t.Fatalf("Open's error %q does not hold %q", last, want)
	}
	t.Logf("%d starts, %d Opens in %v", n, opens, window)
}

func init() {
	// parent: a relay-like process that opens three sessions whose children
	// outlive end of file on stdin, prints their pids, and waits to be killed.
	childModes["parent"] = func() {
		exe, _ := os.Executable()
		c, err := stdio.New(stdio.Options{Command: []string{exe}, Env: []string{childEnv + "=linger"}})
		if err != nil {
			panic(err)
		}
		for i := range 3 {
			s, _, err := c.Open(context.Background(), backend.Init{Request: []byte(`{"jsonrpc":"2.0","id":` + strconv.Itoa(i) + `,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"p","version":"1"}}}`)})
			if err != nil {
				panic(err)
			}
			fmt.Println(s.(*stdio.Session).PID())
		}
		fmt.Println("ready")
		for {
			time.Sleep(time.Hour)
		}
	}
	// linger: serves, then keeps running after its stdin ended.
	childModes["linger"] = linger
}

// TestParentKilledLeavesNoChild: a relay-like process killed with SIGKILL
// leaves none of its children running (parent-death signal), even children
// that would not exit on end of file on stdin.
func TestParentKilledLeavesNoChild(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"=parent")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "ready" {
		pid, err := strconv.Atoi(sc.Text())
		if err != nil {
			t.Fatalf("parent printed %q", sc.Text())
		}
		pids = append(pids, pid)
	}
	if len(pids) != 3 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("parent started %d children, want 3", len(pids))
	}
	for _, pid := range pids {
		if !alive(pid) {
			t.Fatalf("child %d not running before the parent is killed", pid)
		}
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL) // in case the test failed
		}
	})
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("child %d still runs 10s after its parent was killed", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestThreadExitKeepsChild: a child started from a goroutine whose OS thread
// then exits (a goroutine that returns while locked to its thread) keeps
// running: the parent-death signal is tied to the thread that forks.
func TestThreadExitKeepsChild(t *testing.T) {
	c := newConnector(t, "serve", stdio.Options{})
	type opened struct {
		s   backend.Session
		err error
	}
	got := make(chan opened, 1)
	var o opened
	release := make(chan struct{})
	defer close(release)
	for range 10 {
		go func() {
			runtime.LockOSThread()
			if syscall.Gettid() == os.Getpid() {
				// The main thread is never terminated (the runtime parks
				// it): keep it busy and try again from another thread.
				got <- opened{}
				<-release
				runtime.UnlockOSThread()
				return
			}
			// Never unlocked: the thread exits with the goroutine.
			s, _, err := c.Open(t.Context(), backend.Init{Request: []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)})
			got <- opened{s, err}
		}()
		if o = <-got; o.s != nil || o.err != nil {
			break
		}
	}
	if o.err != nil || o.s == nil {
		t.Fatalf("Open: %v", o.err)
	}
	s := o.s.(*stdio.Session)
	time.Sleep(300 * time.Millisecond) // the thread has exited; a signal would be immediate
	if !alive(s.PID()) {
		t.Fatal("the child died when the thread that opened its session exited")
	}
	r, err := s.Call(t.Context(), []byte(`{"jsonrpc":"2.0","id":2,"method":"ping"}`), nil)
	if err != nil {
		t.Fatalf("Call: %v", err)
	}
	if _, err := r.Next(); err != nil {
		t.Fatalf("ping: %v", err)
	}
}

// TestOneStartAfterBackoff: once the backoff is over, concurrent Opens try
// one start, not one each.
func TestOneStartAfterBackoff(t *testing.T) {
	dir := t.TempDir()
	c, err := stdio.New(stdio.Options{
		Command:      []string{"sh", "-c", `echo x >> spawns; sleep 0.3; exit 3`},
		Dir:          dir,
		StartBackoff: stdio.Backoff{Min: 50 * time.Millisecond, Max: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := backend.Init{Request: []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize"}`)}
	if _, _, err := c.Open(t.Context(), req); !errors.Is(err, stdio.ErrStartFailing) {
		t.Fatalf("first Open: %v", err)
	}
	time.Sleep(100 * time.Millisecond) // past the backoff
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if _, _, err := c.Open(t.Context(), req); !errors.Is(err, stdio.ErrStartFailing) {
				t.Errorf("Open: %v, want ErrStartFailing", err)
			}
		})
	}
	wg.Wait()
	b, _ := os.ReadFile(filepath.Join(dir, "spawns"))
	if n := strings.Count(string(b), "x"); n != 2 {
		t.Fatalf("%d starts, want 2: the first and one for the 10 concurrent Opens", n)
	}
}

// TestCloseDuringOpens: Connector.Close while sessions are being opened
// leaves no process behind and does not hang.
func TestCloseDuringOpens(t *testing.T) {
	c, err := stdio.New(stdio.Options{Command: echoCommand})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	groups := map[int]bool{}
	for i := range 30 {
		wg.Go(func() {
			s, _, err := c.Open(t.Context(), backend.Init{Request: []byte(`{"jsonrpc":"2.0","id":` + strconv.Itoa(i) + `,"method":"initialize"}`)})
			if err == nil {
				mu.Lock()
				groups[s.(*stdio.Session).PID()] = true
				mu.Unlock()
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return in 20s")
	}
	wg.Wait()
	c.Close()
	mu.Lock()
	defer mu.Unlock()
	if left := leftovers(t, groups); len(left) != 0 || c.Children() != 0 {
		t.Fatalf("after Close: Children() = %d, /proc shows %+v", c.Children(), left)
	}
}
