package relay_test

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/relay"
)

// TestBackendGETOpensWithTheClientsGET: the relay opens the backend's GET
// stream for a session only once its client opened a GET (an idle session
// whose client never listens holds no backend stream), and keeps it open
// after the client leaves and across a re-created backend session, so
// that what the backend sends meanwhile waits in the log.
func TestBackendGETOpensWithTheClientsGET(t *testing.T) {
	var gets atomic.Int32
	back := mcptest.NewRestartable(func() http.Handler {
		return backend.SDKHandler(testServer(nil), &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	})
	counting := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			gets.Add(1)
		}
		back.ServeHTTP(w, r)
	})
	e := newEnv(t, relay.Options{Backend: backend.Handler(counting)})
	t.Cleanup(back.Stop)
	s := e.initialize("2025-11-25", "")
	_, resp := s.call(1, 0, false)
	if evs, ended := events(t, resp, 0, 10*time.Second); !ended {
		t.Fatalf("call: %+v", evs)
	}
	if n := gets.Load(); n != 0 {
		t.Fatalf("the backend saw %d GETs before the client opened one, want 0", n)
	}
	waitGETs := func(want int32) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for gets.Load() < want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := gets.Load(); n < want {
			t.Fatalf("the backend saw %d GETs, want %d", n, want)
		}
	}
	get := s.get("")
	waitGETs(1)
	get.Body.Close() // the client leaves; the relay keeps listening

	// A re-created backend session is listened to at once, without a
	// new GET of the client's.
	back.Restart()
	_, resp = s.call(1, 0, false) // finds the backend session lost and re-creates it
	events(t, resp, 0, 10*time.Second)
	waitGETs(2)
	if n := e.relay.Counts()["reincarnation"]; n != 1 {
		t.Fatalf("%d re-creations, want 1", n)
	}
}

// TestRestoredSessionListens: a session whose client opened a GET listens
// again as soon as a restarted relay restores it, before the client opens
// a GET again (the store's record says it listens); one whose client never
// listened still opens no backend GET.
func TestRestoredSessionListens(t *testing.T) {
	var mu sync.Mutex
	listened := map[string]bool{} // backend sessions that got a GET
	sdk := backend.SDKHandler(testServer(nil), nil)
	counting := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			mu.Lock()
			listened[r.Header.Get("Mcp-Session-Id")] = true
			mu.Unlock()
		}
		sdk.ServeHTTP(w, r)
	})
	store := eventlog.NewMemory(eventlog.Retention{})
	rr := serveRestartable(t, func() *relay.Handler {
		h, err := relay.New(relay.Options{Backend: backend.Handler(counting), Store: store, Secret: testSecret})
		if err != nil {
			t.Fatal(err)
		}
		return h
	})
	e := &env{t: t, client: http.DefaultClient, url: rr.url}
	old := map[string]bool{} // backend sessions of the relay before the restart
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for id := range listened {
			if !old[id] {
				n++
			}
		}
		return n
	}
	waitListened := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); count() < want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d backend sessions got a GET, want %d", count(), want)
			}
		}
	}
	deaf := e.initialize("2025-11-25", "")
	s := e.initialize("2025-11-25", "")
	get := s.get("")
	waitListened(1)
	get.Body.Close()

	// The old relay's backend sessions are not closed by a restart (as by
	// a kill -9; its backend GET reconnects once the new relay discards
	// the session): only new backend sessions count from here.
	mu.Lock()
	maps.Copy(old, listened)
	mu.Unlock()
	rr.restart()
	for _, c := range []*rawSession{deaf, s} {
		_, resp := c.call(1, 0, false) // restores the session
		if evs, ended := events(t, resp, 0, 10*time.Second); !ended {
			t.Fatalf("call after the restart: %+v", evs)
		}
	}
	waitListened(1)
	time.Sleep(200 * time.Millisecond)
	if n := count(); n != 1 {
		t.Fatalf("%d new backend sessions got a GET, want 1: the session that never listened opened one", n)
	}
}

// TestCloseEndsBackendStreams: Close ends the backend's GET streams of the
// sessions it served, also without replicas (whose sessions stay in the
// store for the next process): no request of a closed relay's stays open
// on the backend, and no goroutine of its lives on. Regression: the
// backend's GET stayed open after Close, and reconnected when it ended.
func TestCloseEndsBackendStreams(t *testing.T) {
	var open atomic.Int32
	sdk := backend.SDKHandler(testServer(nil), nil)
	counting := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			open.Add(1)
			defer open.Add(-1)
		}
		sdk.ServeHTTP(w, r)
	})
	h, err := relay.New(relay.Options{Backend: backend.Handler(counting), Store: eventlog.NewMemory(eventlog.Retention{}), Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	e := &env{t: t, client: http.DefaultClient, url: srv.URL}
	for range 3 {
		s := e.initialize("2025-11-25", "")
		get := s.get("")
		defer get.Body.Close()
	}
	for deadline := time.Now().Add(5 * time.Second); open.Load() < 3; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d backend GETs open, want 3", open.Load())
		}
	}
	h.Close()
	for deadline := time.Now().Add(5 * time.Second); open.Load() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d backend GETs still open 5s after Close", open.Load())
		}
	}
}
