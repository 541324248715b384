package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/internal/hostile"
	"github.com/mcprelay/mcprelay/internal/mcptest"
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
	s.get("") // a client that listens: the relay opens the backend's GET
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
	var m mcptest.Message
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

// Ids are matched by their JSON value: a backend (the Go SDK) that decodes
// and re-encodes 1.0 as 1, -0 as 0 or "\u0061" as "a" still answers the
// call. Before, the relay missed the response: the client got the result,
// then a -32001 for the same id.
func TestIDsMatchByValue(t *testing.T) {
	e := newEnv(t, relay.Options{})
	s := e.initialize("2025-11-25", "")
	for _, id := range []string{`1.0`, `-0`, `"\u0061"`, `1e1`, `7`} {
		resp := s.post(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"count","arguments":{"n":1}}}`)
		evs, ended := events(t, resp, 0, 10*time.Second)
		data := dataEvents(evs)
		if !ended || len(data) != 1 {
			t.Fatalf("id %s: ended=%v, %d events, want the response alone: %+v", id, ended, len(data), evs)
		}
		if m := mcptest.Decode(t, data[0].Data); m.Result == nil || m.Error != nil {
			t.Errorf("id %s: %s, want the result", id, data[0].Data)
		}
		if n := e.relay.Counts()["lost"]; n != 0 {
			t.Fatalf("id %s: %d requests reported lost", id, n)
		}
	}
}

// Ids the relay refuses: too long (it keeps ids with every stream), not a
// string or number, not UTF-8.
func TestBadIDs(t *testing.T) {
	e := newEnv(t, relay.Options{})
	s := e.initialize("2025-11-25", "")
	for name, id := range map[string]string{
		"too long":  `"` + strings.Repeat("x", 401) + `"`,
		"object":    `{"a":1}`,
		"bool":      `true`,
		"bad utf-8": "\"\xff\xfe\"",
	} {
		resp := s.post(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/list"}`)
		if b := readBody(t, resp); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %s %s, want 400", name, resp.Status, b)
		}
	}
}

// A backend that never answers a POST: the client gets a 504 with a
// JSON-RPC error under its id within the response timeout, and the backend
// request is abandoned. Before, the client got nothing at all.
func TestBackendHangs(t *testing.T) {
	up := &hostile.Upstream{Next: backend.SDKHandler(testServer(nil), nil), HangMethod: "tools/call"}
	be := backend.Handler(up)
	be.ResponseTimeout = 300 * time.Millisecond
	e := newEnv(t, relay.Options{Backend: be})
	s := e.initialize("2025-11-25", "")
	start := time.Now()
	resp := s.post(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"count","arguments":{"n":1}}}`)
	body := readBody(t, resp)
	var m mcptest.Message
	if resp.StatusCode != http.StatusGatewayTimeout || json.Unmarshal([]byte(body), &m) != nil || m.Error == nil || m.Error.Code != resume.CodeRequestLost || string(m.ID) != "3" {
		t.Fatalf("got %s %s, want 504 with a -32001 error under id 3", resp.Status, body)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("answered after %v", d)
	}
	// The session goes on.
	if resp := s.post(`{"jsonrpc":"2.0","id":4,"method":"ping"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("ping after the timeout: %s", resp.Status)
	}
}

// A backend JSON answer over 16 MiB is refused as too large, never relayed
// cut short as a broken message: the call fails with -32001.
func TestBackendOversizeJSON(t *testing.T) {
	up := &hostile.Upstream{Next: backend.SDKHandler(testServer(nil), nil), OversizeMethod: "tools/list", OversizeBytes: backend.MaxMessageBytes + 10}
	e := newEnv(t, relay.Options{Backend: backend.Handler(up)})
	s := e.initialize("2025-11-25", "")
	resp := s.post(`{"jsonrpc":"2.0","id":8,"method":"tools/list"}`)
	evs, ended := events(t, resp, 0, 20*time.Second)
	data := dataEvents(evs)
	if !ended || len(data) == 0 {
		t.Fatalf("ended=%v, %d events", ended, len(data))
	}
	for _, ev := range data[:len(data)-1] {
		if ev.Type != resume.EventReset {
			t.Fatalf("a part of the oversized answer was relayed: %.100s", ev.Data)
		}
	}
	if m := mcptest.Decode(t, data[len(data)-1].Data); m.Error == nil || m.Error.Code != resume.CodeRequestLost {
		t.Fatalf("last event %.200s, want a -32001 error", data[len(data)-1].Data)
	}
}

// Client-supplied session IDs and cursors are cut short in the log: a
// 100 KB header must not make a 100 KB log line.
func TestLogValuesBounded(t *testing.T) {
	var buf syncBuffer
	e := newEnv(t, relay.Options{Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	s := e.initialize("2025-11-25", "")
	if resp := s.get(strings.Repeat("A", 100_000)); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("huge cursor: %s", resp.Status)
	}
	h := s.headers()
	h["Mcp-Session-Id"] = strings.Repeat("S", 100_000)
	h["Last-Event-ID"] = "x"
	e.do("GET", h, "")
	for _, line := range strings.Split(buf.String(), "\n") {
		if len(line) > 2000 {
			t.Fatalf("log line of %d bytes: %.200s…", len(line), line)
		}
	}
	if !strings.Contains(buf.String(), "resume rejected") {
		t.Fatalf("the rejection was not logged: %s", buf.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// flakyStore fails every Append and DeleteSession while failing is set,
// as a store does while Redis restarts or a disk is full.
type flakyStore struct {
	eventlog.Store
	failing atomic.Bool
	failed  atomic.Int64
}

func (f *flakyStore) DeleteSession(ctx context.Context, id string) error {
	if f.failing.Load() {
		f.failed.Add(1)
		return errors.New("flaky: store unavailable")
	}
	return f.Store.DeleteSession(ctx, id)
}

func (f *flakyStore) Append(ctx context.Context, key string, terminal bool, evs ...eventlog.Event) (uint64, error) {
	if f.failing.Load() {
		f.failed.Add(1)
		return 0, errors.New("flaky: store unavailable")
	}
	return f.Store.Append(ctx, key, terminal, evs...)
}

// A store that refuses appends for a while loses nothing: the relay holds
// the events and retries, and the client receives every progress
// notification and the result, without a gap. Before, each failed append
// was dropped and the client saw a silent gap, or waited forever when the
// response was the one dropped.
func TestStoreOutageLosesNothing(t *testing.T) {
	st := &flakyStore{Store: eventlog.NewMemory(eventlog.Retention{})}
	e := newEnv(t, relay.Options{Store: st})
	s := e.initialize("2025-11-25", "")
	_, resp := s.call(20, 20, true)
	first, _ := events(t, resp, 3, 5*time.Second)
	st.failing.Store(true)
	time.Sleep(400 * time.Millisecond)
	st.failing.Store(false)
	rest, ended := events(t, resp, 0, 20*time.Second)
	if !ended {
		t.Fatal("the call did not end")
	}
	if st.failed.Load() == 0 {
		t.Fatal("no append failed: the test did not test anything")
	}
	if r := resets(t, rest); len(r) != 0 {
		t.Fatalf("resets %v: nothing was lost, nothing to announce", r)
	}
	p := progressOf(t, append(first, rest...))
	for i, v := range p {
		if v != float64(i+1) {
			t.Fatalf("progress %v: a gap", p)
		}
	}
	if len(p) != 20 {
		t.Fatalf("%d progress notifications, want 20", len(p))
	}
	last := mcptest.Decode(t, dataEvents(rest)[len(dataEvents(rest))-1].Data)
	if last.Result == nil {
		t.Fatalf("the call ended without its result: %+v", last)
	}
}

// A DELETE the store cannot carry out is a 503, and the session lives on;
// before, the client got 204 while the session stayed in the store.
func TestDeleteStoreFailure(t *testing.T) {
	st := &flakyStore{Store: eventlog.NewMemory(eventlog.Retention{})}
	e := newEnv(t, relay.Options{Store: st})
	s := e.initialize("2025-11-25", "")
	st.failing.Store(true)
	if resp := e.do("DELETE", s.headers(), ""); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("DELETE while the store fails: %s, want 503 with Retry-After", resp.Status)
	}
	st.failing.Store(false)
	if resp := s.post(`{"jsonrpc":"2.0","id":1,"method":"ping"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("the session after a failed DELETE: %s", resp.Status)
	}
	if resp := e.do("DELETE", s.headers(), ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: %s", resp.Status)
	}
	if _, err := st.Session(context.Background(), s.id); !errors.Is(err, eventlog.ErrNotFound) {
		t.Fatalf("the session is still in the store: %v", err)
	}
}

// readFailStore fails Read while failing is set.
type readFailStore struct {
	eventlog.Store
	failing atomic.Bool
}

func (f *readFailStore) Read(ctx context.Context, key string, after uint64, max int, buf []eventlog.Event) (eventlog.Stream, []eventlog.Event, error) {
	if f.failing.Load() {
		return eventlog.Stream{}, nil, errors.New("flaky: store unavailable")
	}
	return f.Store.Read(ctx, key, after, max, buf)
}

// A stream whose log cannot be read ends with retry, so the client comes
// back; before, it ended cleanly, as if complete, and the client took the
// call for finished without its response.
func TestStoreReadFailureAsksToRetry(t *testing.T) {
	st := &readFailStore{Store: eventlog.NewMemory(eventlog.Retention{})}
	e := newEnv(t, relay.Options{Store: st})
	s := e.initialize("2025-11-25", "")
	_, resp := s.call(5, 50, true)
	first, _ := events(t, resp, 1, 5*time.Second)
	st.failing.Store(true)
	rest, ended := events(t, resp, 0, 5*time.Second)
	st.failing.Store(false)
	if !ended {
		t.Fatal("the stream neither ended nor asked to retry")
	}
	if len(rest) == 0 || rest[len(rest)-1].Retry == 0 {
		t.Fatalf("the stream ended without retry: %+v", rest)
	}
	// The client comes back and gets the rest, then the response.
	resp = s.get(lastID(append(first, rest...)))
	evs, ended := events(t, resp, 0, 10*time.Second)
	if d := dataEvents(evs); !ended || len(d) == 0 || mcptest.Decode(t, d[len(d)-1].Data).Result == nil {
		t.Fatalf("after the retry: ended=%v %+v", ended, evs)
	}
}
