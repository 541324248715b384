package relay_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcprelay/mcprelay/backend"
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
