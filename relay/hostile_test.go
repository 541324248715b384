package relay_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/internal/hostile"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/resume"
)

// A backend that answers GET with 404 (it defines only POST) must not make
// the relay re-create the session: a POST shows the session is alive.
// Before the connector seam, each 404 re-created the backend session at
// once, forever (13,366 re-creations in 20 s for one idle session).
func TestBackendGET404IsNotSessionLoss(t *testing.T) {
	up := &hostile.Upstream{Next: backend.SDKHandler(testServer(nil), nil), GET404: true}
	e := newEnv(t, relay.Options{Backend: backend.Handler(up)})
	s := e.initialize("2025-11-25", "")
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) && up.GETs.Load() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // room for a loop to show itself
	if n := up.Initializes.Load(); n != 1 {
		t.Fatalf("backend saw %d initialize requests, want 1 (the session was re-created)", n)
	}
	if n := e.relay.Counts()["reincarnation"]; n != 0 {
		t.Fatalf("%d re-creations, want 0", n)
	}
	if n := up.GETs.Load(); n != 1 {
		t.Fatalf("backend saw %d GETs, want 1: a GET answered 404 is not retried", n)
	}
	_, resp := s.call(2, 0, false)
	evs, ended := events(t, resp, 0, 10*time.Second)
	if !ended || len(dataEvents(evs)) != 1 {
		t.Fatalf("a call after the GET 404: ended=%v %d events", ended, len(dataEvents(evs)))
	}
}

// A backend that answers one method's POSTs with 404 while the session
// lives on: the client's call fails with the request-lost error, the
// client is never told its session is gone (404), and the session goes on.
func TestBackendPOST404OnOneCall(t *testing.T) {
	up := &hostile.Upstream{Next: backend.SDKHandler(testServer(nil), nil), NotFoundMethod: "tools/call"}
	e := newEnv(t, relay.Options{Backend: backend.Handler(up)})
	s := e.initialize("2025-11-25", "")
	resp := s.post(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"count","arguments":{"n":1}}}`)
	body := readBody(t, resp)
	if resp.StatusCode == http.StatusNotFound {
		t.Fatalf("the client was told its session is gone: %s %s", resp.Status, body)
	}
	var m rpc
	if err := json.Unmarshal([]byte(body), &m); err != nil || m.Error == nil || m.Error.Code != resume.CodeRequestLost || string(m.ID) != "5" {
		t.Fatalf("want a JSON-RPC error %d under id 5, got %s %s", resume.CodeRequestLost, resp.Status, body)
	}
	if n := up.Initializes.Load(); n > 3 {
		t.Fatalf("%d initialize requests for one call: re-creation is not bounded", n)
	}
	resp = s.post(`{"jsonrpc":"2.0","id":6,"method":"tools/list"}`)
	if b := readBody(t, resp); resp.StatusCode != 200 || !strings.Contains(b, `"count"`) {
		t.Fatalf("the session does not go on: %s %s", resp.Status, b)
	}
}

// A backend that keeps losing the session is not re-created in a loop: past
// a few re-creations a minute the client gets 503 with Retry-After.
func TestBackendRecreationIsBounded(t *testing.T) {
	up := &hostile.Upstream{Next: backend.SDKHandler(testServer(nil), nil), NotFoundMethod: "tools/call"}
	e := newEnv(t, relay.Options{Backend: backend.Handler(up)})
	s := e.initialize("2025-11-25", "")
	var last *http.Response
	for i := range 10 {
		last = s.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"count","arguments":{"n":1}}}`, 100+i))
		readBody(t, last)
	}
	if n := up.Initializes.Load(); n > 6 {
		t.Fatalf("%d initialize requests: re-creation is not bounded", n)
	}
	if last.StatusCode != http.StatusServiceUnavailable || last.Header.Get("Retry-After") == "" {
		t.Fatalf("past the bound: %s (Retry-After %q), want 503 with Retry-After", last.Status, last.Header.Get("Retry-After"))
	}
}
