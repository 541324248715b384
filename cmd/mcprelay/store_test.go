package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/mcprelay/mcprelay/eventlog"
)

// TestLoadSecretConcurrent: relays starting at once on a fresh data dir
// all get the same complete secret; none reads a file still being written.
func TestLoadSecretConcurrent(t *testing.T) {
	const rounds, starters = 200, 8
	for r := range rounds {
		path := filepath.Join(t.TempDir(), "secret")
		got := make([][]byte, starters)
		errs := make([]error, starters)
		var wg sync.WaitGroup
		for i := range starters {
			wg.Go(func() { got[i], errs[i] = loadSecret(path) })
		}
		wg.Wait()
		for i := range starters {
			if errs[i] != nil {
				t.Fatalf("round %d, starter %d: %v", r, i, errs[i])
			}
			if len(got[i]) != 32 || !bytes.Equal(got[i], got[0]) {
				t.Fatalf("round %d: starter %d got secret %x, starter 0 %x", r, i, got[i], got[0])
			}
		}
		ents, _ := os.ReadDir(filepath.Dir(path))
		if len(ents) != 1 {
			t.Fatalf("round %d: data dir holds %d files, want only the secret", r, len(ents))
		}
	}
}

// TestMissingSecretNextToEventLog: a data dir whose event log holds data
// but whose secret is gone must not start with a new secret.
func TestMissingSecretNextToEventLog(t *testing.T) {
	dir := t.TempDir()
	st, secret, err := openStore("disk", dir, "always", eventlog.Retention{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSession(t.Context(), &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	if err := os.Remove(filepath.Join(dir, secretName)); err != nil {
		t.Fatal(err)
	}
	st, again, err := openStore("disk", dir, "always", eventlog.Retention{}, nil)
	if err == nil {
		st.Close()
		t.Fatalf("started with a new secret (%x, was %x) next to an existing event log", again, secret)
	}
	if !strings.Contains(err.Error(), "missing") || !strings.Contains(err.Error(), filepath.Join(dir, eventsName)) {
		t.Errorf("error %q does not say the secret is missing next to the event log", err)
	}
	if _, err := os.Stat(filepath.Join(dir, secretName)); err == nil {
		t.Error("a new secret was written")
	}
	// A data dir without an event log still gets a secret on first start.
	fresh := t.TempDir()
	st, _, err = openStore("disk", fresh, "always", eventlog.Retention{}, nil)
	if err != nil {
		t.Fatalf("fresh data dir: %v", err)
	}
	st.Close()
}

// TestDataDirInUse: a second relay on a data dir in use is told which
// process holds it; once the first closes, the directory is free again.
func TestDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	st, _, err := openStore("disk", dir, "always", eventlog.Retention{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = openStore("disk", dir, "always", eventlog.Retention{}, nil)
	want := fmt.Sprintf("data dir %s is in use by another mcprelay (pid %d)", dir, os.Getpid())
	if err == nil || err.Error() != want {
		t.Errorf("second open: %v, want %q", err, want)
	}
	st.Close()
	st, _, err = openStore("disk", dir, "always", eventlog.Retention{}, nil)
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	st.Close()
}

// TestDataDirInUseByAnotherProcess: "mcprelay serve" on a data dir that
// another process's relay holds fails at once, naming that process.
func TestDataDirInUseByAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	st, _, err := openStore("disk", dir, "always", eventlog.Retention{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, stderr, status := runMain(t, "serve", "--addr", "127.0.0.1:0", "--data-dir", dir)
	want := fmt.Sprintf("mcprelay: data dir %s is in use by another mcprelay (pid %d)\n", dir, os.Getpid())
	if status != 1 || stderr != want {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and\n%s", status, stderr, want)
	}
}
