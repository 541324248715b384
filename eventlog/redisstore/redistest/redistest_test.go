package redistest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// fatalTB records the first Fatalf and ends the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestMissingServerFails: without redis-server on the PATH, Start fails
// the test with a message saying how to install it; it never skips.
func TestMissingServerFails(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(f)
	}()
	<-done
	if !strings.Contains(f.msg, "redis-server is not installed") || !strings.Contains(f.msg, "apt-get install") {
		t.Errorf("Start without redis-server: Fatalf(%q), want a message naming redis-server and how to install it", f.msg)
	}
	if t.Skipped() {
		t.Errorf("Start skipped the test")
	}
}

func TestKillRestart(t *testing.T) {
	s := Start(t)
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") || s.URL() != "redis://"+s.Addr()+"/0" {
		t.Errorf("Addr %q, URL %q", s.Addr(), s.URL())
	}
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("PING: %v", err)
	}
	addr := s.Addr()
	s.Kill()
	if err := ping(addr); err == nil {
		t.Fatalf("PING answered after Kill")
	}
	s.Kill() // a second kill does nothing
	s.Restart(t)
	if s.Addr() != addr {
		t.Errorf("restarted on %s, want %s", s.Addr(), addr)
	}
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
}
