package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestRelayRestartWithDurableStore "kills" the relay (no seal written, as
// with kill -9) and its in-process backend mid-call, then starts a new
// relay on the same store and secret. The session survives under a new
// incarnation, the in-flight request ends in a reset and an error under
// its id, the log level the client set is replayed to the new backend, and
// another principal still gets 404.
func TestRelayRestartWithDurableStore(t *testing.T) {
	store := eventlog.NewMemory(eventlog.Retention{})
	be := mcptest.NewRestartable(func() http.Handler {
		return backend.SDKHandler(testServer(nil), &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	})
	start := func() *relay.Handler {
		up := backend.Handler(be)
		up.StatelessURL = up.URL + "/stateless"
		h, err := relay.New(relay.Options{Backend: up, Store: store, Secret: testSecret})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	rr := serveRestartable(t, start)
	t.Cleanup(be.Stop)
	e := &env{t: t, client: http.DefaultClient, url: rr.url, backend: be}
	c := codec(t)

	s := e.initialize("2025-11-25", "Bearer alice")
	if r := s.post(`{"jsonrpc":"2.0","id":100,"method":"logging/setLevel","params":{"level":"info"}}`); r.StatusCode != 200 {
		t.Fatalf("setLevel: %s", r.Status)
	} else {
		events(t, r, 0, 5*time.Second)
	}
	id, resp := s.call(1000, 20, true)
	first, _ := events(t, resp, 2, 5*time.Second)

	// Crash: the old relay stops without sealing anything; the backend dies.
	rr.restart()
	be.Restart()
	rr.srv.CloseClientConnections()

	if r := e.do("GET", map[string]string{"Mcp-Session-Id": s.id, "Authorization": "Bearer mallory", "Last-Event-ID": lastID(first)}, ""); r.StatusCode != 404 {
		t.Fatalf("another principal after restore: %s, want 404", r.Status)
	}
	r := s.get(lastID(first))
	if r.StatusCode != 200 {
		t.Fatalf("resume after restart: %s", r.Status)
	}
	got, ended := events(t, r, 0, 5*time.Second)
	if !ended {
		t.Fatal("resume of the interrupted call hung")
	}
	// Exactly what the log holds after the cursor (the old relay logged
	// on after the client's last read; the new one sealed the stream with
	// the backend_lost reset and the lost error), then the
	// generation_changed reset.
	cur, err := c.Parse(lastID(first))
	if err != nil {
		t.Fatal(err)
	}
	_, logged, err := store.Read(context.Background(), cur.Stream.String(), cur.Seq, 100000, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want []sse.Event
	for _, ev := range logged {
		want = append(want, sse.Event{ID: c.ID(resume.Cursor{Stream: cur.Stream, Generation: cur.Generation, Seq: ev.Seq}), Type: ev.Type, Data: ev.Data})
	}
	d := dataEvents(got)
	if rs := resets(t, d); len(rs) != 2 || rs[0] != resume.ReasonBackendLost || rs[1] != resume.ReasonGenerationChanged {
		t.Fatalf("resets %v, want [backend_lost generation_changed]", rs)
	}
	if d[len(d)-1].Type != resume.EventReset {
		t.Fatalf("the resume does not end with the generation_changed reset: %+v", d[len(d)-1])
	}
	checkReplay(t, "resume after restart", d[:len(d)-1], want)
	lost := mcptest.Decode(t, d[len(d)-2].Data)
	if lost.Error == nil || lost.Error.Code != resume.CodeRequestLost || string(lost.ID) != fmt.Sprint(id) {
		t.Fatalf("the replay before the generation_changed reset ends with %s, want the request-lost error for id %d", d[len(d)-2].Data, id)
	}

	// The session goes on, under incarnation 2, with its log level.
	_, resp = s.call(3, 0, false)
	evs, _ := events(t, resp, 0, 5*time.Second)
	if cur, err := c.Parse(evs[0].ID); err != nil || cur.Generation != 2 {
		t.Fatalf("after restore: generation %+v %v", cur, err)
	}
	logs := 0
	for _, ev := range dataEvents(evs) {
		if mcptest.Decode(t, ev.Data).Method == "notifications/message" {
			logs++
		}
	}
	if logs != 3 {
		t.Fatalf("got %d log messages, want 3: the log level was not replayed to the new backend", logs)
	}
	if n := rr.current().Counts()["restore"]; n != 1 {
		t.Fatalf("restores: %d", n)
	}
}

// downable answers 503 to everything while down is set.
type downable struct {
	h    http.Handler
	down atomic.Bool
}

func (d *downable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if d.down.Load() {
		http.Error(w, "starting", http.StatusServiceUnavailable)
		return
	}
	d.h.ServeHTTP(w, r)
}

// TestRestoreWhileBackendDown: after a relay restart, a session whose
// backend cannot be re-created yet gets 503 with Retry-After — not 404,
// which would make the client drop a session that still exists — and is
// restored once the backend is back.
func TestRestoreWhileBackendDown(t *testing.T) {
	store := eventlog.NewMemory(eventlog.Retention{})
	be := &downable{h: backend.SDKHandler(testServer(nil), nil)}
	start := func() *relay.Handler {
		h, err := relay.New(relay.Options{Backend: backend.Handler(be), Store: store, Secret: testSecret})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	var current atomic.Pointer[relay.Handler]
	current.Store(start())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { current.Load().ServeHTTP(w, r) }))
	t.Cleanup(func() { current.Load().Close(); srv.CloseClientConnections(); srv.Close() })
	e := &env{t: t, client: http.DefaultClient, url: srv.URL}

	s := e.initialize("2025-11-25", "")
	evs := completedCall(t, s, 2)
	old := current.Load()
	current.Store(start())
	old.Close()
	be.down.Store(true)

	r := s.get(evs[1].ID)
	if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Fatalf("backend down during restore: %s (Retry-After %q), want 503 with Retry-After", r.Status, r.Header.Get("Retry-After"))
	}
	be.down.Store(false)
	r = s.get(evs[1].ID)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("after the backend is back: %s, want 200", r.Status)
	}
	got, ended := events(t, r, 0, 5*time.Second)
	if !ended {
		t.Fatalf("replay after restore did not end: %+v", got)
	}
	// The call's events after the cursor, exactly (progress 2, the
	// result), then a generation_changed reset: the stream is of the
	// incarnation before the restore.
	d := dataEvents(got)
	if rs := resets(t, d); len(rs) != 1 || rs[0] != resume.ReasonGenerationChanged || d[len(d)-1].Type != resume.EventReset {
		t.Fatalf("replay after restore: resets %v, want the events, then one generation_changed reset", rs)
	}
	checkReplay(t, "replay after restore", d[:len(d)-1], dataEvents(evs)[1:])
}

// TestStoredSessionExpires: a session idle past the timeout while no
// process held it (the relay was down) is not restored: 404, and it is
// deleted from the store. One used recently is restored. Before, a session
// idle far past --session-idle-timeout was still restored.
func TestStoredSessionExpires(t *testing.T) {
	store := eventlog.NewMemory(eventlog.Retention{})
	be := mcptest.NewRestartable(func() http.Handler { return backend.SDKHandler(testServer(nil), nil) })
	t.Cleanup(be.Stop)
	var current atomic.Pointer[relay.Handler]
	start := func() {
		h, err := relay.New(relay.Options{Backend: backend.Handler(be), Store: store, Secret: testSecret, SessionIdleTimeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if old := current.Swap(h); old != nil {
			old.Close()
		}
	}
	start()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { current.Load().ServeHTTP(w, r) }))
	t.Cleanup(func() { current.Load().Close(); srv.CloseClientConnections(); srv.Close() })
	e := &env{t: t, client: http.DefaultClient, url: srv.URL, backend: be}
	idle := e.initialize("2025-11-25", "")
	recent := e.initialize("2025-11-25", "")
	age := func(id string, d time.Duration) {
		rec, err := store.Session(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		rec.Created, rec.LastUsed = time.Now().Add(-d-time.Hour), time.Now().Add(-d)
		if err := store.UpdateSession(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
	age(idle.id, 2*time.Hour)
	age(recent.id, 10*time.Minute)
	start() // a restart: the sessions are in the store only

	if resp := idle.post(`{"jsonrpc":"2.0","id":1,"method":"ping"}`); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a session idle for 2h with a 1h timeout: %s, want 404", resp.Status)
	}
	if _, err := store.Session(context.Background(), idle.id); !errors.Is(err, eventlog.ErrNotFound) {
		t.Fatalf("the expired session is still in the store: %v", err)
	}
	if resp := recent.post(`{"jsonrpc":"2.0","id":1,"method":"ping"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("a session idle for 10 minutes: %s, want it restored", resp.Status)
	}
}

// TestLastUseRecorded: requests record the session's last use in the store
// (at most every eighth of the idle timeout), so that expiry survives the
// process.
func TestLastUseRecorded(t *testing.T) {
	store := eventlog.NewMemory(eventlog.Retention{})
	e := newEnv(t, relay.Options{Store: store, SessionIdleTimeout: 800 * time.Millisecond})
	s := e.initialize("2025-11-25", "")
	time.Sleep(150 * time.Millisecond)
	before := time.Now()
	if resp := s.post(`{"jsonrpc":"2.0","id":1,"method":"ping"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("ping: %s", resp.Status)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		rec, err := store.Session(context.Background(), s.id)
		if err != nil {
			t.Fatal(err)
		}
		if !rec.LastUsed.Before(before.Add(-time.Millisecond)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("LastUsed %v, want at least %v", rec.LastUsed, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
