package pebblestore_test

import (
	"crypto/rand"
	"path/filepath"
	"testing"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
)

// TestSizeNeverUnderWhatIsHeld: after every append, Size is at least the
// event data appended so far. The data is random, so it takes as much
// room in a table as in the WAL; a WAL opened fresh (not recycled) counts
// at its size on opening in Pebble's own figure, which is why Size must
// count the WAL's logical size too.
func TestSizeNeverUnderWhatIsHeld(t *testing.T) {
	st, err := pebblestore.Open(filepath.Join(t.TempDir(), "log"), pebblestore.Options{Sync: pebblestore.SyncNone})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := t.Context()
	if err := st.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	const event, total = 16 << 10, 12 << 20
	// Retention would drop old events and so make the bound untrue; one
	// stream per MiB stays within it.
	var held int64
	for i := 0; held < total; i++ {
		key := "k" + string(rune('a'+i/64))
		if i%64 == 0 {
			if err := st.CreateStream(ctx, &eventlog.Stream{Key: key, Session: "s", Generation: 1}); err != nil {
				t.Fatal(err)
			}
		}
		data := make([]byte, event)
		rand.Read(data)
		if _, err := st.Append(ctx, key, false, eventlog.Event{Data: data}); err != nil {
			t.Fatal(err)
		}
		held += event
		n, err := st.Size(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n < held {
			t.Fatalf("after %d bytes of events, Size %d", held, n)
		}
	}
}
