package pebblestore

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/mcprelay/mcprelay/eventlog"
)

// syncCountingFS counts the fsyncs of WAL files (*.log) and keeps, for
// each, how many bytes were written and how many of them an fsync covered.
type syncCountingFS struct {
	vfs.FS
	syncs atomic.Int64

	mu    sync.Mutex
	files []*syncCountingFile
}

func newSyncCountingFS() *syncCountingFS { return &syncCountingFS{FS: vfs.Default} }

func (fs *syncCountingFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	sf := &syncCountingFile{File: f, n: &fs.syncs}
	fs.mu.Lock()
	fs.files = append(fs.files, sf)
	fs.mu.Unlock()
	return sf, nil
}

func (fs *syncCountingFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs *syncCountingFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

// written returns, for each WAL file so far, the bytes written to it.
func (fs *syncCountingFS) written() []int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	out := make([]int64, len(fs.files))
	for i, f := range fs.files {
		out[i] = f.written.Load()
	}
	return out
}

// unsynced returns a description of the first WAL file whose bytes up to
// upTo[i] (the whole file past len(upTo)) are not all covered by an
// fsync, or "".
func (fs *syncCountingFS) unsynced(upTo []int64) string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for i, f := range fs.files {
		want := f.written.Load()
		if i < len(upTo) {
			want = upTo[i]
		}
		if got := f.synced.Load(); got < want {
			return fmt.Sprintf("WAL file %d: %d bytes written, %d synced", i, want, got)
		}
	}
	return ""
}

type syncCountingFile struct {
	vfs.File
	n       *atomic.Int64
	written atomic.Int64
	synced  atomic.Int64 // bytes an fsync has covered
}

func (f *syncCountingFile) Write(p []byte) (int, error) {
	n, err := f.File.Write(p)
	f.written.Add(int64(n))
	return n, err
}

// sync runs an fsync that covers what was written when it started.
func (f *syncCountingFile) sync(fsync func() error) error {
	f.n.Add(1)
	at := f.written.Load()
	err := fsync()
	if err == nil {
		for old := f.synced.Load(); old < at && !f.synced.CompareAndSwap(old, at); old = f.synced.Load() {
		}
	}
	return err
}

func (f *syncCountingFile) Sync() error     { return f.sync(f.File.Sync) }
func (f *syncCountingFile) SyncData() error { return f.sync(f.File.SyncData) }
func (f *syncCountingFile) SyncTo(length int64) (full bool, err error) {
	f.n.Add(1)
	full, err = f.File.SyncTo(length)
	if err == nil {
		for old := f.synced.Load(); old < length && !f.synced.CompareAndSwap(old, length); old = f.synced.Load() {
		}
	}
	return full, err
}

// TestSharedFsync checks that under SyncAlways concurrent appends of
// different sessions share WAL fsyncs and that each is still synced: when
// an Append returns, an fsync has covered every WAL byte written before it
// began (and, appended one at a time, every byte written so far). With
// SyncNone no append causes an fsync.
func TestSharedFsync(t *testing.T) {
	const writers, each = 32, 20
	cases := []struct {
		name     string
		sync     SyncPolicy
		writers  int
		minSyncs int64 // inclusive
		maxSyncs int64 // exclusive
	}{
		{"always shares fsyncs", SyncAlways, writers, 1, writers * each},
		{"always syncs each append", SyncAlways, 1, each, math.MaxInt64},
		{"none never syncs", SyncNone, writers, 0, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			fs := newSyncCountingFS()
			s, err := open(filepath.Join(t.TempDir(), "log"), Options{Sync: tc.sync}, time.Now, fs)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for i := range tc.writers {
				id := fmt.Sprint("s", i)
				if err := s.CreateSession(ctx, &eventlog.Session{ID: id}); err != nil {
					t.Fatal(err)
				}
				if err := s.CreateStream(ctx, &eventlog.Stream{Key: id, Session: id}); err != nil {
					t.Fatal(err)
				}
			}
			before := fs.syncs.Load()
			var wg sync.WaitGroup
			for i := range tc.writers {
				key := fmt.Sprint("s", i)
				wg.Go(func() {
					for range each {
						start := fs.written()
						if _, err := s.Append(ctx, key, false, eventlog.Event{Data: []byte("x")}); err != nil {
							t.Error(err)
							return
						}
						if tc.sync != SyncAlways {
							continue
						}
						if tc.writers == 1 {
							start = nil // nothing else writes: all of it
						}
						if u := fs.unsynced(start); u != "" {
							t.Errorf("Append returned before its fsync: %s", u)
							return
						}
					}
				})
			}
			wg.Wait()
			appends := tc.writers * each
			syncs := fs.syncs.Load() - before
			t.Logf("%d appends, %d WAL fsyncs", appends, syncs)
			if syncs < tc.minSyncs || syncs >= tc.maxSyncs {
				t.Errorf("%d appends caused %d WAL fsyncs, want [%d, %d)", appends, syncs, tc.minSyncs, tc.maxSyncs)
			}
		})
	}
}
