package pebblestore_test

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
)

// dirSize is the sum of the sizes of the files under dir.
func dirSize(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		if errors.Is(err, fs.ErrNotExist) { // deleted by a compaction meanwhile
			err = nil
		}
		return err
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return n
}

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// churn runs n session lifecycles like the relay's: create the session, its
// standalone stream and a request stream, append events (the last
// terminal), delete the session.
func churn(t *testing.T, st eventlog.Store, from, n int, data []byte) {
	t.Helper()
	ctx := t.Context()
	for i := from; i < from+n; i++ {
		id := fmt.Sprintf("session-%08d", i)
		if err := st.CreateSession(ctx, &eventlog.Session{ID: id, Incarnation: 1, InitializeParams: data[:256], Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
		for j, key := range []string{id + "/standalone", id + "/req"} {
			rid := []byte(`"1"`)
			if j == 0 {
				rid = nil
			}
			if err := st.CreateStream(ctx, &eventlog.Stream{Key: key, Session: id, Generation: 1, RequestID: rid}); err != nil {
				t.Fatal(err)
			}
		}
		evs := make([]eventlog.Event, 8)
		for k := range evs {
			evs[k].Data = data
		}
		if _, err := st.Append(ctx, id+"/req", true, evs...); err != nil {
			t.Fatal(err)
		}
		if err := st.DeleteSession(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSessionChurn: sessions created, used and deleted must cost nothing
// once deleted, in memory and on disk, and a restart must not read them.
// Three rounds of 5000 create/append/delete cycles (8 events of 4 KiB per
// session, a terminal request stream, default 5m grace): the Go heap,
// measured once Pebble has settled (Store.Settle, export_test.go), must
// not grow by more than 512 KiB from the second round to the third (a
// leak of 100 bytes per deleted session grew it by 1.5 MB), and the data
// dir must shrink
// back to a bound independent of the sessions deleted. The memory store
// runs the same rounds.
func TestSessionChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("15000 session lifecycles")
	}
	const (
		cycles   = 5000
		heapSlop = 512 << 10 // growth from round 2 to round 3
		diskMax  = 40 << 20  // data dir once nothing is live
	)
	data := make([]byte, 4096)
	rand.Read(data) // incompressible
	t.Run("pebblestore", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "log")
		st, err := pebblestore.Open(dir, pebblestore.Options{Sync: pebblestore.SyncNone})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { st.Close() }()
		var heaps []uint64
		for r := range 3 {
			churn(t, st, r*cycles, cycles, data)
			if err := st.Settle(30 * time.Second); err != nil {
				t.Fatal(err)
			}
			heaps = append(heaps, heapAfterGC())
			t.Logf("round %d: heap %d bytes, data dir %d bytes", r+1, heaps[r], dirSize(t, dir))
		}
		if grew := int64(heaps[2]) - int64(heaps[1]); grew > heapSlop {
			t.Errorf("heap grew by %d bytes over %d cycles of sessions that no longer exist (bound %d)", grew, cycles, heapSlop)
		}
		// Sessions that live long enough for their events to be flushed
		// to tables, then are deleted.
		ctx := t.Context()
		for i := range 2000 {
			id := fmt.Sprintf("long-%d", i)
			if err := st.CreateSession(ctx, &eventlog.Session{ID: id, Incarnation: 1}); err != nil {
				t.Fatal(err)
			}
			if err := st.CreateStream(ctx, &eventlog.Stream{Key: id, Session: id, Generation: 1}); err != nil {
				t.Fatal(err)
			}
			evs := make([]eventlog.Event, 8)
			for k := range evs {
				evs[k].Data = data
			}
			if _, err := st.Append(ctx, id, false, evs...); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("2000 live sessions of 32 KiB: data dir %d bytes", dirSize(t, dir))
		time.Sleep(2 * time.Second) // let flushes of their events finish
		for i := range 2000 {
			if err := st.DeleteSession(ctx, fmt.Sprintf("long-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		// The background goroutine compacts away what was deleted.
		var size int64
		deleted := time.Now()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if size = dirSize(t, dir); size <= diskMax || time.Now().After(deadline) {
				break
			}
		}
		t.Logf("data dir with no live session, %v after the last delete: %d bytes", time.Since(deleted), size)
		if ents, err := os.ReadDir(dir); err == nil {
			for _, e := range ents {
				if fi, err := e.Info(); err == nil && fi.Size() > 1<<20 {
					t.Logf("  %s: %d bytes", e.Name(), fi.Size())
				}
			}
		}
		if size > diskMax {
			t.Errorf("data dir holds %d bytes with no live session after %d deleted ones (bound %d)", size, 3*cycles+2000, diskMax)
		}
		st.Close()
		start := time.Now()
		st, err = pebblestore.Open(dir, pebblestore.Options{Sync: pebblestore.SyncNone})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("reopen took %v", time.Since(start))
	})
	t.Run("memory", func(t *testing.T) {
		st := eventlog.NewMemory(eventlog.Retention{})
		defer st.Close()
		var heaps []uint64
		for r := range 3 {
			churn(t, st, r*cycles, cycles, data)
			heaps = append(heaps, heapAfterGC())
			t.Logf("round %d: heap %d bytes", r+1, heaps[r])
		}
		if grew := int64(heaps[2]) - int64(heaps[1]); grew > heapSlop {
			t.Errorf("heap grew by %d bytes over %d cycles of sessions that no longer exist (bound %d)", grew, cycles, heapSlop)
		}
	})
}

// TestIdleDiskReservation: an idle store must not reserve much disk. Pebble
// preallocates its WAL at about 1.1 × the memtable size.
func TestIdleDiskReservation(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	st, err := pebblestore.Open(dir, pebblestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.CreateSession(t.Context(), &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	var allocated int64
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		var sys syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, e.Name()), &sys); err == nil {
			allocated += sys.Blocks * 512
		}
	}
	const bound = 16 << 20
	t.Logf("idle data dir: %d bytes allocated", allocated)
	if allocated > bound {
		t.Errorf("an idle store allocates %d bytes of disk, want at most %d", allocated, bound)
	}
}
