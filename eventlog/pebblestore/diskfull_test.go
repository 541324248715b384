package pebblestore_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
)

// smallDisk mounts an 8 MiB tmpfs on a fresh directory for the test, or
// skips the test if that is not possible (not root).
func smallDisk(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small tmpfs (%v: %s); the disk-full test needs root", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// lockedBuffer is a log sink safe for Pebble's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// fill writes a file of zeros until the file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			return
		}
	}
}

// TestDiskFull runs the store on a real 8 MiB tmpfs until the disk is
// full. The store must not panic (which would kill the process): the
// write that hits the full disk and every later one fail with an error
// wrapping eventlog.ErrUnavailable, reads still return what was
// acknowledged, and the reason is logged. Opening on the full disk fails
// promptly with the reason instead of hanging. Once space is back, a
// reopened store has every acknowledged event and takes writes again.
func TestDiskFull(t *testing.T) {
	disk := smallDisk(t)
	ctx := t.Context()
	dir := filepath.Join(disk, "log")
	var logs lockedBuffer
	opts := pebblestore.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	st, err := pebblestore.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateStream(ctx, &eventlog.Stream{Key: "k", Session: "s", Generation: 1}); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(disk, "filler")
	fill(t, filler)
	// Leave about 1 MiB, so that some appends succeed first.
	if fi, err := os.Stat(filler); err != nil || os.Truncate(filler, fi.Size()-1<<20) != nil {
		t.Fatalf("shrinking the filler: %v", err)
	}

	data := bytes.Repeat([]byte("x"), 16<<10)
	var acked uint64
	var werr error
	for i := range 10000 {
		last, err := st.Append(ctx, "k", false, eventlog.Event{Data: fmt.Appendf(bytes.Clone(data), "%d", i)})
		if err != nil {
			werr = err
			break
		}
		acked = last
	}
	t.Logf("%d appends acknowledged before: %v", acked, werr)
	if !errors.Is(werr, eventlog.ErrUnavailable) {
		t.Fatalf("append on a full disk: %v, want an error wrapping eventlog.ErrUnavailable", werr)
	}
	for _, err := range []error{
		func() error { _, err := st.Append(ctx, "k", false, eventlog.Event{Data: []byte("later")}); return err }(),
		st.CreateSession(ctx, &eventlog.Session{ID: "s2"}),
		st.DeleteSession(ctx, "s"),
	} {
		if !errors.Is(err, eventlog.ErrUnavailable) {
			t.Errorf("write after the failure: %v, want eventlog.ErrUnavailable", err)
		}
	}
	if err := st.Ready(ctx); !errors.Is(err, eventlog.ErrUnavailable) {
		t.Errorf("Ready after the failure: %v, want eventlog.ErrUnavailable", err)
	}
	rec, evs, err := st.Read(ctx, "k", 0, 1<<20, nil)
	if err != nil || rec.LastSeq != acked || uint64(len(evs)) != acked {
		t.Errorf("Read after the failure: %+v, %d events, %v; want the %d acknowledged", rec, len(evs), err, acked)
	}
	if _, err := st.Session(ctx, "s"); err != nil {
		t.Errorf("Session after the failure: %v", err)
	}
	st.Close()
	if !bytes.Contains([]byte(logs.String()), []byte("level=ERROR")) {
		t.Errorf("nothing logged at error level:\n%s", logs.String())
	}

	// Opening on the full disk: an error with the reason, promptly.
	fill(t, filepath.Join(disk, "filler2"))
	done := make(chan error, 1)
	go func() {
		st, err := pebblestore.Open(dir, opts)
		if err == nil {
			st.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Logf("Open on a full disk: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("Open on a full disk did not return within 20s")
	}

	// Space is back: everything acknowledged is there, writes work.
	for _, f := range []string{filler, filepath.Join(disk, "filler2")} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	// The instance that failed to open may hold the directory for up to a
	// few seconds more, until its recovery completes and it is closed.
	for deadline := time.Now().Add(15 * time.Second); ; {
		st, err = pebblestore.Open(dir, opts)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reopen after freeing space: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer st.Close()
	rec, evs, err = st.Read(ctx, "k", 0, 1<<20, nil)
	if err != nil || uint64(len(evs)) < acked || rec.LastSeq < acked {
		t.Fatalf("after reopen: %+v, %d events, %v; want the %d acknowledged", rec, len(evs), err, acked)
	}
	for i, e := range evs[:acked] {
		if !bytes.Equal(e.Data, fmt.Appendf(bytes.Clone(data), "%d", i)) {
			t.Fatalf("event %d after reopen differs", e.Seq)
		}
	}
	if _, err := st.Append(ctx, "k", false, eventlog.Event{Data: []byte("after")}); err != nil {
		t.Errorf("append after reopen: %v", err)
	}
}
