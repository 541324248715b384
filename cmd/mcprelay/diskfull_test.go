package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
)

// TestServeOnFullDisk: `mcprelay serve` on a data dir whose disk is full
// (and whose event log needs to write to recover) must exit with the
// reason, not hang. It runs on a real 8 MiB tmpfs (root only).
func TestServeOnFullDisk(t *testing.T) {
	disk := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", disk).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small tmpfs (%v: %s); this test needs root", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", disk).CombinedOutput(); err != nil {
			t.Errorf("umount: %v: %s", err, out)
		}
	})
	dir := filepath.Join(disk, "data")
	st, _, err := openStore("disk", dir, "always", eventlog.Retention{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Something in the WAL that the next start must flush.
	if err := st.CreateSession(t.Context(), &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	f, err := os.Create(filepath.Join(disk, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()

	done := make(chan error, 1)
	go func() {
		done <- serve([]string{"--addr", "127.0.0.1:0", "--data-dir", dir, "--log-level", "error"})
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "no space left on device") {
			t.Fatalf("serve on a full disk: %v, want an error saying why", err)
		}
		t.Logf("serve on a full disk: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve on a full disk neither served nor failed within 30s")
	}
	// Let the abandoned recovery finish (space back) before unmounting.
	os.Remove(filepath.Join(disk, "filler"))
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if st, _, err := openStore("disk", dir, "always", eventlog.Retention{}, nil); err == nil {
			st.Close()
			return
		}
	}
	t.Error("the data dir did not open again after space came back")
}
