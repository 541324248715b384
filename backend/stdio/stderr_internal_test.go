package stdio

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestStderrRate checks the stderr rate limit over time in a bubble: a burst
// of 50 lines passes, the rest of a burst is dropped and counted, and the
// budget refills at 50 lines a second.
func TestStderrRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf strings.Builder
		var mu sync.Mutex
		log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			},
		}))
		s := &Session{log: log}
		pr, pw := io.Pipe()
		done := make(chan struct{})
		go func() { s.logStderr(pr); close(done) }()
		count := func() (logged, droppedMsgs int) {
			mu.Lock()
			defer mu.Unlock()
			return strings.Count(buf.String(), `msg="stdio: child's stderr" `), strings.Count(buf.String(), "dropped=")
		}
		for i := range 80 {
			fmt.Fprintf(pw, "burst %d\n", i)
		}
		synctest.Wait()
		if l, d := count(); l != 50 || d != 0 {
			t.Fatalf("after a burst of 80: %d lines logged, %d drop reports; want 50 and none yet", l, d)
		}
		time.Sleep(100 * time.Millisecond) // 5 lines' worth
		for i := range 10 {
			fmt.Fprintf(pw, "later %d\n", i)
		}
		synctest.Wait()
		if l, d := count(); l != 55 || d != 1 || !strings.Contains(buf.String(), "dropped=30") {
			t.Fatalf("100ms later, 10 more: %d lines logged, %d drop reports; want 55 and one of 30:\n%s", l, d, buf.String())
		}
		pw.Close()
		<-done
		if !strings.Contains(buf.String(), "dropped=5") || s.lastStderr != "later 9" {
			t.Fatalf("at the end: want the last 5 drops reported and the last line kept (%q):\n%s", s.lastStderr, buf.String())
		}
	})
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
