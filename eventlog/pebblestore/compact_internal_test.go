package pebblestore

import (
	"errors"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
)

// keysOf returns the stream keys and the number of events in the database.
func keysOf(t *testing.T, s *Store) (streams []string, events int) {
	t.Helper()
	err := s.scan(kindIdent, func(_, v []byte) error {
		var r streamRecord
		err := decodeIdent(v, &r)
		streams = append(streams, r.rec.Key)
		return err
	})
	if err == nil {
		n := 0
		err = s.scan(kindStream, func(_, _ []byte) error { n++; return nil })
		if n != len(streams) {
			t.Errorf("%d stream records, %d identities", n, len(streams))
		}
	}
	if err == nil {
		err = s.scan(kindEvent, func(_, _ []byte) error { events++; return nil })
	}
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(streams)
	return streams, events
}

// TestCompaction checks on the database itself that the background
// goroutine deletes expired terminal streams (records and events) without
// any call touching their session, and keeps everything else. The clock is
// injected, so nothing sleeps.
func TestCompaction(t *testing.T) {
	const grace = time.Minute
	cases := []struct {
		name        string
		advance     time.Duration
		wantStreams []string
		wantEvents  int
	}{
		{"within grace", grace - time.Second, []string{"done1", "done2", "open"}, 2 + 3 + 40},
		{"after grace", grace, []string{"open"}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			var offset atomic.Int64
			base := time.Now()
			clock := func() time.Time { return base.Add(time.Duration(offset.Load())) }
			s, err := open(filepath.Join(t.TempDir(), "log"), Options{Sync: SyncNone, Retention: eventlog.Retention{TerminalGrace: grace}}, clock, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
				t.Fatal(err)
			}
			// done2 has enough events to be deleted by a range tombstone.
			for key, n := range map[string]int{"open": 2, "done1": 3, "done2": 40} {
				if err := s.CreateStream(ctx, &eventlog.Stream{Key: key, Session: "s", Generation: 1}); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Append(ctx, key, key != "open", make([]eventlog.Event, n)...); err != nil {
					t.Fatal(err)
				}
			}
			offset.Store(int64(tc.advance))
			// What the background goroutine runs on each tick; calling it
			// here makes the test deterministic (it may also run itself).
			s.compact()
			keys, events := keysOf(t, s)
			if !slices.Equal(keys, tc.wantStreams) || events != tc.wantEvents {
				t.Errorf("database holds streams %q and %d events, want %q and %d", keys, events, tc.wantStreams, tc.wantEvents)
			}
			_, _, err = s.Read(ctx, "done1", 0, 10, nil)
			if gone := errors.Is(err, eventlog.ErrNotFound); gone != (tc.advance >= grace) {
				t.Errorf("Read(done1) = %v after %v of a %v grace", err, tc.advance, grace)
			}
		})
	}
}
