package pebblestore

import (
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
)

// TestCreateStreamUnsyncedSyncs: under SyncAlways an unsynced stream
// record costs no fsync of its own; the stream's first Append (one fsync)
// or Sync makes it durable.
func TestCreateStreamUnsyncedSyncs(t *testing.T) {
	ctx := t.Context()
	fs := newSyncCountingFS()
	s, err := open(filepath.Join(t.TempDir(), "log"), Options{Sync: SyncAlways}, time.Now, fs)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateSession(ctx, &eventlog.Session{ID: "a"}); err != nil {
		t.Fatal(err)
	}
	step := func(what string, want int64, f func() error) {
		t.Helper()
		before := fs.syncs.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := fs.syncs.Load() - before; got != want {
			t.Errorf("%s: %d WAL fsyncs, want %d", what, got, want)
		}
	}
	step("CreateStreamUnsynced", 0, func() error {
		return s.CreateStreamUnsynced(ctx, &eventlog.Stream{Key: "k1", Session: "a"})
	})
	step("its terminal Append", 1, func() error {
		_, err := s.Append(ctx, "k1", true, eventlog.Event{Data: []byte(`{}`)})
		return err
	})
	step("CreateStream", 1, func() error {
		return s.CreateStream(ctx, &eventlog.Stream{Key: "k2", Session: "a"})
	})
	step("Sync", 1, func() error { return s.Sync(ctx) })
}

// TestCreateStreamUnsyncedCrash: what a crash keeps of an unsynced stream
// record, losing every write that was not fsynced.
func TestCreateStreamUnsyncedCrash(t *testing.T) {
	ctx := t.Context()
	cases := []struct {
		name    string
		after   func(s *Store) error // after CreateStreamUnsynced
		kept    bool
		lastSeq uint64
	}{
		{"nothing after it", func(*Store) error { return nil }, false, 0},
		{"an Append of the stream", func(s *Store) error {
			_, err := s.Append(ctx, "k", false, eventlog.Event{Data: []byte(`{}`)})
			return err
		}, true, 1},
		{"an Append of another session's stream", func(s *Store) error {
			_, err := s.Append(ctx, "other", false, eventlog.Event{Data: []byte(`{}`)})
			return err
		}, true, 0},
		{"Sync", func(s *Store) error { return s.Sync(ctx) }, true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCrashFS(t)
			s := c.open(SyncAlways, eventlog.Retention{})
			for _, id := range []string{"a", "b"} {
				if err := s.CreateSession(ctx, &eventlog.Session{ID: id}); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.CreateStream(ctx, &eventlog.Stream{Key: "other", Session: "b"}); err != nil {
				t.Fatal(err)
			}
			if err := s.CreateStreamUnsynced(ctx, &eventlog.Stream{Key: "k", Session: "a", RequestID: []byte(`7`)}); err != nil {
				t.Fatal(err)
			}
			if err := tc.after(s); err != nil {
				t.Fatal(err)
			}
			c.crash(s, 0, rand.New(rand.NewPCG(1, 2)))
			s = c.open(SyncAlways, eventlog.Retention{})
			defer s.Close()
			rec, _, err := s.Read(ctx, "k", 0, 10, nil)
			switch {
			case !tc.kept:
				if !errors.Is(err, eventlog.ErrNotFound) {
					t.Fatalf("after a crash an unsynced record nothing followed: Read = %+v, %v; want ErrNotFound (the test's crash keeps unsynced writes?)", rec, err)
				}
			case err != nil:
				t.Fatalf("the record was lost in the crash: %v", err)
			case rec.LastSeq != tc.lastSeq || string(rec.RequestID) != "7":
				t.Fatalf("after the crash: %+v, want LastSeq %d and request ID 7", rec, tc.lastSeq)
			}
		})
	}
}
