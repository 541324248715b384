package pebblestore

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/mcprelay/mcprelay/eventlog"
)

// syncCountingFS counts the fsyncs of WAL files (*.log).
type syncCountingFS struct {
	vfs.FS
	syncs atomic.Int64
}

func newSyncCountingFS() *syncCountingFS { return &syncCountingFS{FS: vfs.Default} }

func (fs *syncCountingFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return &syncCountingFile{File: f, n: &fs.syncs}, nil
}

func (fs *syncCountingFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs *syncCountingFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

type syncCountingFile struct {
	vfs.File
	n *atomic.Int64
}

func (f *syncCountingFile) Sync() error     { f.n.Add(1); return f.File.Sync() }
func (f *syncCountingFile) SyncData() error { f.n.Add(1); return f.File.SyncData() }
func (f *syncCountingFile) SyncTo(length int64) (bool, error) {
	f.n.Add(1)
	return f.File.SyncTo(length)
}

// TestSharedFsync checks that under SyncAlways concurrent appends of
// different sessions share WAL fsyncs, and that each is still synced: with
// SyncNone no append causes an fsync.
func TestSharedFsync(t *testing.T) {
	const writers, each = 32, 20
	cases := []struct {
		name     string
		sync     SyncPolicy
		minSyncs int64 // inclusive
		maxSyncs int64 // exclusive
	}{
		{"always shares fsyncs", SyncAlways, 1, writers * each},
		{"none never syncs", SyncNone, 0, 1},
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
			for i := range writers {
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
			for i := range writers {
				key := fmt.Sprint("s", i)
				wg.Go(func() {
					for range each {
						if _, err := s.Append(ctx, key, false, eventlog.Event{Data: []byte("x")}); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			syncs := fs.syncs.Load() - before
			t.Logf("%d appends, %d WAL fsyncs", writers*each, syncs)
			if syncs < tc.minSyncs || syncs >= tc.maxSyncs {
				t.Errorf("%d appends caused %d WAL fsyncs, want [%d, %d)", writers*each, syncs, tc.minSyncs, tc.maxSyncs)
			}
		})
	}
}
