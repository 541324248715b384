package relay_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
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
// answered 503 with Retry-After, so the client retries, not 500; and the
// call was not sent to the backend, so that the retry does not run it a
// second time. Regression: the request went to the backend before its
// stream was created.
func TestStoreUnavailableIs503(t *testing.T) {
	store := &failingStore{Store: eventlog.NewMemory(eventlog.Retention{})}
	var calls atomic.Int64
	sdk := backend.SDKHandler(testServer(nil), nil)
	counting := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			if bytes.Contains(body, []byte(`"tools/call"`)) {
				calls.Add(1)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		sdk.ServeHTTP(w, r)
	})
	e := newEnv(t, relay.Options{Store: store, Secret: testSecret, Backend: backend.Handler(counting)})
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
	if n := calls.Load(); n != 0 {
		t.Errorf("the backend received %d tools/call the log could not record", n)
	}
	check("initialize", e.do("POST", nil, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
}

// TestRefusedCallLeavesNoOpenStream: a call's stream is created before the
// request goes to the backend; when the backend then refuses the request
// (here a 500), the client gets the backend's answer on its POST, and the
// stream nobody heard of is sealed, not left open in the log for a later
// owner to find and report lost.
func TestRefusedCallLeavesNoOpenStream(t *testing.T) {
	store := eventlog.NewMemory(eventlog.Retention{})
	var refuse atomic.Bool
	sdk := backend.SDKHandler(testServer(nil), nil)
	refusing := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuse.Load() && r.Method == http.MethodPost {
			http.Error(w, "refused", http.StatusInternalServerError)
			return
		}
		sdk.ServeHTTP(w, r)
	})
	e := newEnv(t, relay.Options{Store: store, Secret: testSecret, Backend: backend.Handler(refusing)})
	s := e.initialize("2025-11-25", "")
	refuse.Store(true)
	resp := s.post(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"count","arguments":{"n":1}}}`)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("refused call: %s %s, want the backend's 500", resp.Status, b)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		streams, err := store.Streams(t.Context(), s.id)
		if err != nil {
			t.Fatal(err)
		}
		var open []eventlog.Stream
		for _, st := range streams {
			if st.RequestID != nil && !st.Terminal {
				open = append(open, st)
			}
		}
		if len(open) == 0 {
			if len(streams) < 2 {
				t.Errorf("the session's streams: %+v; want the refused call's among them, sealed", streams)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refused call's stream is still open: %+v", open)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
