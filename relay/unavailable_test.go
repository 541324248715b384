package relay_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/relay"
)

// failingStore is a store whose writes fail with eventlog.ErrUnavailable
// (as the disk store's do once its disk is full) while down is set.
type failingStore struct {
	eventlog.Store
	down atomic.Bool
}

func (f *failingStore) err() error {
	if f.down.Load() {
		return fmt.Errorf("%w: no space left on device", eventlog.ErrUnavailable)
	}
	return nil
}

func (f *failingStore) CreateSession(ctx context.Context, s *eventlog.Session) error {
	if err := f.err(); err != nil {
		return err
	}
	return f.Store.CreateSession(ctx, s)
}

func (f *failingStore) CreateStream(ctx context.Context, s *eventlog.Stream) error {
	if err := f.err(); err != nil {
		return err
	}
	return f.Store.CreateStream(ctx, s)
}

func (f *failingStore) Append(ctx context.Context, key string, terminal bool, evs ...eventlog.Event) (uint64, error) {
	if err := f.err(); err != nil {
		return 0, err
	}
	return f.Store.Append(ctx, key, terminal, evs...)
}

// TestStoreUnavailableIs503: when the event log cannot write
// (eventlog.ErrUnavailable: a full disk), a new session or a new call is
// answered 503 with Retry-After, so the client retries, not 500.
func TestStoreUnavailableIs503(t *testing.T) {
	store := &failingStore{Store: eventlog.NewMemory(eventlog.Retention{})}
	e := newEnv(t, relay.Options{Store: store, Secret: testSecret})
	s := e.initialize("2025-11-25", "")
	store.down.Store(true)

	check := func(what string, resp *http.Response) {
		t.Helper()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s with the event log unavailable: %s (Retry-After %q): %s; want 503 with Retry-After",
				what, resp.Status, resp.Header.Get("Retry-After"), b)
		}
	}
	check("tools/call", s.post(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"count","arguments":{"n":1}}}`))
	check("initialize", e.do("POST", nil, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
}
