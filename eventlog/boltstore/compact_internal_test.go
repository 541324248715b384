package boltstore

import (
	"errors"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mcprelay/mcprelay/eventlog"
)

// TestCompaction checks on the file itself that the writer's background
// step deletes expired terminal streams (records, index entries and events)
// and keeps everything else. The clock is injected, so nothing sleeps.
func TestCompaction(t *testing.T) {
	const grace = time.Minute
	cases := []struct {
		name        string
		advance     time.Duration
		wantStreams []string // left in the streams bucket
		wantEvents  int      // left in the events bucket
	}{
		{"within grace", grace - time.Second, []string{"done1", "done2", "open"}, 2 + 3 + 4},
		{"after grace", grace, []string{"open"}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			var offset atomic.Int64
			base := time.Now()
			clock := func() time.Time { return base.Add(time.Duration(offset.Load())) }
			s, err := open(filepath.Join(t.TempDir(), "log.db"), Options{Sync: SyncNone, Retention: eventlog.Retention{TerminalGrace: grace}}, clock)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
				t.Fatal(err)
			}
			for key, n := range map[string]int{"open": 2, "done1": 3, "done2": 4} {
				if err := s.CreateStream(ctx, &eventlog.Stream{Key: key, Session: "s", Generation: 1}); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Append(ctx, key, key != "open", make([]eventlog.Event, n)...); err != nil {
					t.Fatal(err)
				}
			}
			offset.Store(int64(tc.advance))
			// Two ops one after the other: the writer runs its compaction
			// step after committing the first and before taking the second.
			for _, id := range []string{"kick1", "kick2"} {
				if err := s.CreateSession(ctx, &eventlog.Session{ID: id}); err != nil {
					t.Fatal(err)
				}
			}
			var keys []string
			events := 0
			err = s.db.View(func(tx *bolt.Tx) error {
				tx.Bucket(bucketStreams).ForEach(func(k, _ []byte) error { keys = append(keys, string(k)); return nil })
				events = tx.Bucket(bucketEvents).Stats().KeyN
				if n := tx.Bucket(bucketIndex).Stats().KeyN; n != len(keys) {
					t.Errorf("index has %d entries for %d streams", n, len(keys))
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(keys, tc.wantStreams) || events != tc.wantEvents {
				t.Errorf("file holds streams %q and %d events, want %q and %d", keys, events, tc.wantStreams, tc.wantEvents)
			}
			_, _, err = s.Read(ctx, "done1", 0, 10, nil)
			if gone := errors.Is(err, eventlog.ErrNotFound); gone != (tc.advance >= grace) {
				t.Errorf("Read(done1) = %v after %v of a %v grace", err, tc.advance, grace)
			}
		})
	}
}
