package pebblestore

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/mcprelay/mcprelay/eventlog"
)

// byteCountingFS counts the bytes written to every file Pebble creates
// (WAL, sstables, manifest, options).
type byteCountingFS struct {
	vfs.FS
	written atomic.Int64
}

func (fs *byteCountingFS) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return f, err
	}
	return &byteCountingFile{File: f, n: &fs.written}, nil
}

func (fs *byteCountingFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	return fs.wrap(fs.FS.Create(name, c))
}

func (fs *byteCountingFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	return fs.wrap(fs.FS.ReuseForWrite(oldname, newname, c))
}

func (fs *byteCountingFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	return fs.wrap(fs.FS.OpenReadWrite(name, c, opts...))
}

type byteCountingFile struct {
	vfs.File
	n *atomic.Int64
}

func (f *byteCountingFile) Write(p []byte) (int, error) {
	n, err := f.File.Write(p)
	f.n.Add(int64(n))
	return n, err
}

func (f *byteCountingFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	f.n.Add(int64(n))
	return n, err
}

// TestAppendDoesNotRewriteRequestID: appends to a stream whose request ID
// is large must not write that ID again each time. 1000 appends of 10-byte
// events to a stream with a 100 KB request ID: what is written must be
// bounded by the events and small per-append records, not 1000 × 100 KB.
func TestAppendDoesNotRewriteRequestID(t *testing.T) {
	const (
		appends = 1000
		idSize  = 100 << 10
	)
	ctx := t.Context()
	fs := &byteCountingFS{FS: vfs.Default}
	s, err := open(filepath.Join(t.TempDir(), "log"), Options{Sync: SyncNone}, time.Now, fs)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := append(append([]byte(`"`), bytes.Repeat([]byte("x"), idSize)...), '"')
	if err := s.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateStream(ctx, &eventlog.Stream{Key: "k", Session: "s", Generation: 1, RequestID: id}); err != nil {
		t.Fatal(err)
	}
	before := fs.written.Load()
	for range appends {
		if _, err := s.Append(ctx, "k", false, eventlog.Event{Data: []byte("0123456789")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Flush(); err != nil { // sstables too, not just the WAL
		t.Fatal(err)
	}
	written := fs.written.Load() - before
	// Per append: the event (key 25 bytes + value), the small stream
	// record and the run record, plus batch and WAL framing; the flush
	// writes them once more and the request ID once.
	const bound = 2*appends*256 + 2*idSize
	t.Logf("%d appends with a %d-byte request ID wrote %d bytes (bound %d)", appends, len(id), written, bound)
	if written > bound {
		t.Errorf("%d appends wrote %d bytes, want at most %d: the request ID is rewritten on every append", appends, written, bound)
	}
	rec, evs, err := s.Read(ctx, "k", 0, appends, nil)
	if err != nil || len(evs) != appends || !bytes.Equal(rec.RequestID, id) {
		t.Fatalf("Read: %d events, request ID of %d bytes, %v", len(evs), len(rec.RequestID), err)
	}
}

// TestUpgradeFormatV1: a directory written in format 1 (identity inside
// the stream record) opens with its streams intact and is upgraded.
func TestUpgradeFormatV1(t *testing.T) {
	ctx := t.Context()
	dir := filepath.Join(t.TempDir(), "log")
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	for i, key := range []string{"a", "b"} {
		if err := s.CreateStream(ctx, &eventlog.Stream{Key: key, Session: "s", Generation: 3, RequestID: []byte(`"req-` + key + `"`)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Append(ctx, key, i == 1, eventlog.Event{Data: []byte("x")}, eventlog.Event{Data: []byte("yy")}); err != nil {
			t.Fatal(err)
		}
	}
	// Rewrite it as format 1 did.
	b := s.db.NewBatch()
	err = s.scan(kindIdent, func(k, v []byte) error {
		var r streamRecord
		if err := decodeIdent(v, &r); err != nil {
			return err
		}
		sk := append([]byte{kindStream}, k[1:]...)
		cv, closer, err := s.db.Get(sk)
		if err != nil {
			return err
		}
		err = decodeStream(cv, &r)
		closer.Close()
		if err != nil {
			return err
		}
		v1 := binary.AppendUvarint(nil, r.rec.Generation)
		v1 = binary.AppendUvarint(v1, r.rec.FirstSeq)
		v1 = binary.AppendUvarint(v1, r.rec.LastSeq)
		var flags byte
		if r.rec.Terminal {
			flags = 1
		}
		v1 = append(v1, flags)
		v1 = binary.AppendVarint(v1, r.terminalAt)
		v1 = binary.AppendUvarint(v1, uint64(r.bytes))
		v1 = appendString(v1, r.rec.Key)
		v1 = appendBytes(v1, r.rec.RequestID, true)
		b.Set(sk, v1, nil)
		return b.Delete(bytes.Clone(k), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	b.Set(keyVersion, []byte{1}, nil)
	if err := b.Commit(nil); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatalf("opening a format 1 directory: %v", err)
	}
	defer s.Close()
	for i, key := range []string{"a", "b"} {
		rec, evs, err := s.Read(ctx, key, 0, 10, nil)
		if err != nil {
			t.Fatalf("Read(%s): %v", key, err)
		}
		if rec.Generation != 3 || string(rec.RequestID) != `"req-`+key+`"` || rec.FirstSeq != 1 || rec.LastSeq != 2 || rec.Terminal != (i == 1) || len(evs) != 2 {
			t.Errorf("stream %s after the upgrade: %+v, %d events", key, rec, len(evs))
		}
	}
	v, closer, err := s.db.Get(keyVersion)
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != formatVersion {
		t.Errorf("format version %d after the upgrade, want %d", v[0], formatVersion)
	}
	closer.Close()
}
