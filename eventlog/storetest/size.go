package storetest

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/mcprelay/mcprelay/eventlog"
)

// Sizer is a store that reports how many bytes it holds (what
// relay.Limits.MaxStoreBytes bounds).
type Sizer interface {
	eventlog.Store
	Size(ctx context.Context) (int64, error)
}

// SizeGrows checks a store's Size against what is written to it: it
// appends n bytes of event data spread over sessions of at most 1 MiB
// each (within the store's default retention), and requires Size to
// have grown by at least n/2. It logs the figures. Stores measure
// differently (retained bytes, disk usage, server memory), so only
// growth is required, not an exact figure.
func SizeGrows(t *testing.T, st Sizer, n int64) {
	t.Helper()
	ctx := t.Context()
	before, err := st.Size(ctx)
	if err != nil {
		t.Fatalf("Size: %v", err)
	}
	if before < 0 {
		t.Fatalf("Size %d < 0", before)
	}
	data := bytes.Repeat([]byte("x"), 16<<10)
	const perSession = 1 << 20
	for written, i := int64(0), 0; written < n; i++ {
		sid := fmt.Sprintf("size-%d", i)
		if err := st.CreateSession(ctx, &eventlog.Session{ID: sid, Incarnation: 1}); err != nil {
			t.Fatalf("CreateSession: %v", err)
		}
		key := sid + "-k"
		if err := st.CreateStream(ctx, &eventlog.Stream{Key: key, Session: sid, Generation: 1}); err != nil {
			t.Fatalf("CreateStream: %v", err)
		}
		for s := 0; s < perSession && written < n; s += len(data) {
			if _, err := st.Append(ctx, key, false, eventlog.Event{Data: data}); err != nil {
				t.Fatalf("Append: %v", err)
			}
			written += int64(len(data))
		}
	}
	after, err := st.Size(ctx)
	if err != nil {
		t.Fatalf("Size: %v", err)
	}
	t.Logf("Size %d before, %d after %d bytes of events", before, after, n)
	if after-before < n/2 {
		t.Fatalf("Size grew by %d after %d bytes of events, want at least %d", after-before, n, n/2)
	}
}
