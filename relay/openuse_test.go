package relay_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/relay"
)

// TestOpenStreamKeepsStoredSessionCurrent: a session whose only use for
// longer than the idle timeout is a call streaming to its client is in
// use: after a crash of its relay, the client's resume restores it. The
// relay records the use in the store while the connection is open.
// Regression: the record said the session was last used when it was
// created, and the restore found it expired (404).
func TestOpenStreamKeepsStoredSessionCurrent(t *testing.T) {
	store := eventlog.NewMemory(eventlog.Retention{})
	const timeout = 800 * time.Millisecond
	rr := serveRestartable(t, func() *relay.Handler {
		h, err := relay.New(relay.Options{Backend: backend.SDK(testServer(nil), nil), Store: store, Secret: testSecret, SessionIdleTimeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		return h
	})
	e := &env{t: t, client: http.DefaultClient, url: rr.url}
	s := e.initialize("2025-11-25", "")
	_, resp := s.call(40, 75, true) // 3 s
	first, _ := events(t, resp, 2, 5*time.Second)
	time.Sleep(2 * timeout) // no request: the call's stream is the only use
	rr.restart()            // a crash: the new relay knows the session only from the store
	r := s.get(lastID(first))
	if r.StatusCode != http.StatusOK {
		t.Fatalf("resume %v after the last request, with the call streaming until the crash: %s, want 200", 2*timeout, r.Status)
	}
}
