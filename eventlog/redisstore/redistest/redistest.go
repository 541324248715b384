// Package redistest runs a real redis-server for tests: one private
// process per call of [Start], listening on a free port of 127.0.0.1 only,
// with its own data directory, stopped when the test ends.
//
// Tests that need Redis fail, never skip, when redis-server is not on the
// PATH: CI installs it (scripts/test does), and a developer can run
// `apt-get install -y redis-server`.
//
//	srv := redistest.Start(t)
//	st, err := redisstore.Open(t.Context(), redisstore.Options{URL: srv.URL()})
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Options configure StartWith. The zero value is usable.
type Options struct {
	// AppendOnly turns on the append-only file (--appendonly yes), so that
	// data survives Kill and Restart. Default off: nothing survives.
	AppendOnly bool
	// AppendFsync is --appendfsync when AppendOnly is set: "always",
	// "everysec" or "no". Default "everysec", Redis's own default.
	AppendFsync string
}

// Server is one running (or killed) redis-server.
type Server struct {
	opts Options
	dir  string
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// startTimeout bounds how long a server has to answer PING after exec.
const startTimeout = 10 * time.Second

// Start launches a redis-server with the default Options; see StartWith.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith launches a redis-server bound to 127.0.0.1 on a free port, in a
// fresh temporary directory, with RDB snapshots off (--save "") and
// protected mode on, and waits until it answers PING. The server is killed
// when t ends. StartWith fails t if redis-server is not installed.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redistest: redis-server is not installed (%v); install it with `apt-get install -y redis-server` — tests that need Redis fail rather than skip", err)
	}
	if opts.AppendFsync == "" {
		opts.AppendFsync = "everysec"
	}
	s := &Server{opts: opts, dir: t.TempDir()}
	t.Cleanup(s.Kill)
	var err error
	for range 5 { // another process may take the free port before redis binds it
		if s.port, err = freePort(); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		if err = s.start(); err == nil {
			return s
		}
	}
	t.Fatalf("redistest: %v", err)
	return nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start() error {
	appendOnly := "no"
	if s.opts.AppendOnly {
		appendOnly = "yes"
	}
	cmd := exec.Command("redis-server",
		"--bind", "127.0.0.1",
		"--port", strconv.Itoa(s.port),
		"--dir", s.dir,
		"--save", "",
		"--appendonly", appendOnly,
		"--appendfsync", s.opts.AppendFsync,
		"--protected-mode", "yes",
		"--daemonize", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"),
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(startTimeout)
	for {
		if err := ping(s.Addr()); err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited at start: %s", s.port, s.logTail())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("redis-server on port %d did not answer PING within %v: %s", s.port, startTimeout, s.logTail())
		}
	}
}

// ping sends PING in RESP and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is redis://host:port/0, for redisstore.Options.URL.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Dir is the server's data directory.
func (s *Server) Dir() string { return s.dir }

// Kill stops the server with SIGKILL and waits for it to exit. Killing a
// stopped server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

// Restart kills the server if it runs and starts it again on the same port
// with the same data directory and options. What survives depends on
// Options.AppendOnly.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	var err error
	for range 50 { // the port may linger briefly after the kill
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("redistest: restart: %v", err)
}

// ScriptCalls returns how many scripts (EVAL and EVALSHA) the server has
// run, from INFO commandstats: tests count a store's round trips with it.
func (s *Server) ScriptCalls(t testing.TB) int {
	t.Helper()
	info, err := infoSection(s.Addr(), "commandstats")
	if err != nil {
		t.Fatalf("redistest: INFO commandstats: %v", err)
	}
	n := 0
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		c, err := strconv.Atoi(calls)
		if err != nil {
			t.Fatalf("redistest: commandstats line %q: %v", line, err)
		}
		n += c
	}
	return n
}

// infoSection runs INFO section on the server at addr and returns its text.
func infoSection(addr, section string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "*2\r\n$4\r\nINFO\r\n$%d\r\n%s\r\n", len(section), section); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if !strings.HasPrefix(head, "$") || err != nil || size < 0 {
		return "", fmt.Errorf("INFO answered %q", strings.TrimSpace(head))
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(r, body); err != nil {
		return "", err
	}
	return string(body), nil
}
