package relay_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
	"github.com/mcprelay/mcprelay/relay"
)

// limited is a relay in front of testServer (in process) on store, served
// by calling its handler directly: each request names its own remote
// address.
type limited struct {
	t *testing.T
	h *relay.Handler
}

func newLimited(t *testing.T, store eventlog.Store, lim relay.Limits) *limited {
	t.Helper()
	h, err := relay.New(relay.Options{Backend: backend.SDK(testServer(nil), nil), Store: store, Secret: testSecret, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return &limited{t: t, h: h}
}

func (l *limited) serve(method, sid, auth, remote, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "/mcp", strings.NewReader(body))
	req.RemoteAddr = remote
	req.Header.Set("Accept", "application/json, text/event-stream")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	l.h.ServeHTTP(w, req)
	return w
}

// initialize asks for a new session; the answer is 200 with its ID, or a
// refusal.
func (l *limited) initialize(auth, remote string) *httptest.ResponseRecorder {
	return l.serve("POST", "", auth, remote, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}`)
}

// mustInitialize opens a session and returns its ID.
func (l *limited) mustInitialize(auth, remote string) string {
	l.t.Helper()
	w := l.initialize(auth, remote)
	if w.Code != 200 || w.Header().Get("Mcp-Session-Id") == "" {
		l.t.Fatalf("initialize (%s, %s): %d %s", auth, remote, w.Code, w.Body)
	}
	return w.Header().Get("Mcp-Session-Id")
}

// refused checks a refusal's status and Retry-After.
func refused(t *testing.T, w *httptest.ResponseRecorder, status int, what string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("%s: %d %s, want %d", what, w.Code, w.Body, status)
	}
	if ra, err := strconv.Atoi(w.Header().Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("%s: Retry-After %q", what, w.Header().Get("Retry-After"))
	}
	if w.Header().Get("Mcp-Session-Id") != "" {
		t.Fatalf("%s: a refusal carries a session ID", what)
	}
}

func (l *limited) metric(name string) string {
	w := httptest.NewRecorder()
	l.h.Metrics().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	for line := range strings.Lines(w.Body.String()) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			return v
		}
	}
	return ""
}

// TestSessionRateFlood: one principal creating sessions as fast as it can
// gets its burst, then 429 with Retry-After, while another principal keeps
// creating sessions; unauthenticated clients are limited per remote
// address. The refill (one session per 1000 s) cannot make this test
// depend on its speed.
func TestSessionRateFlood(t *testing.T) {
	store, err := pebblestore.Open(filepath.Join(t.TempDir(), "log"), pebblestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	l := newLimited(t, store, relay.Limits{SessionRate: 0.001, SessionBurst: 5})
	ok, limited := 0, 0
	for i := range 50 {
		w := l.initialize("Bearer mallory", "192.0.2.1:1000")
		switch w.Code {
		case 200:
			ok++
		case http.StatusTooManyRequests:
			refused(t, w, http.StatusTooManyRequests, "flood")
			limited++
		default:
			t.Fatalf("flood request %d: %d %s", i, w.Code, w.Body)
		}
		if i%10 == 0 {
			l.mustInitialize(fmt.Sprintf("Bearer alice-%d", i/10), "192.0.2.1:1000") // another principal, same address
		}
	}
	if ok != 5 || limited != 45 {
		t.Fatalf("flood: %d created, %d refused; want 5 and 45", ok, limited)
	}
	// Without a principal: per remote address.
	for range 5 {
		l.mustInitialize("", "198.51.100.1:1")
	}
	refused(t, l.initialize("", "198.51.100.1:2"), http.StatusTooManyRequests, "the same address, another port")
	l.mustInitialize("", "198.51.100.2:1")
	if got := l.metric(`mcprelay_sessions_rejected_total{reason="rate"}`); got != "46" {
		t.Fatalf(`mcprelay_sessions_rejected_total{reason="rate"} = %q, want 46`, got)
	}
}

// TestSessionCountLimits: past MaxSessionsPerPrincipal a principal gets 429
// while others go on; past MaxSessions everyone gets 503; a session that
// ends gives its place back. Sessions restored by another relay process
// on the same store count but are never refused.
func TestSessionCountLimits(t *testing.T) {
	store := eventlog.NewMemory(eventlog.Retention{})
	l := newLimited(t, store, relay.Limits{MaxSessions: 4, MaxSessionsPerPrincipal: 2})
	a1 := l.mustInitialize("Bearer alice", "192.0.2.1:1")
	l.mustInitialize("Bearer alice", "192.0.2.1:1")
	refused(t, l.initialize("Bearer alice", "192.0.2.1:1"), http.StatusTooManyRequests, "alice's third")
	b1 := l.mustInitialize("Bearer bob", "192.0.2.1:1")
	l.mustInitialize("", "192.0.2.9:1")
	refused(t, l.initialize("Bearer carol", "192.0.2.1:1"), http.StatusServiceUnavailable, "a fifth session")
	if w := l.serve("DELETE", a1, "Bearer alice", "192.0.2.1:1", ""); w.Code != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", w.Code, w.Body)
	}
	l.mustInitialize("Bearer alice", "192.0.2.1:1")
	refused(t, l.initialize("Bearer carol", "192.0.2.1:1"), http.StatusServiceUnavailable, "a fifth session again")
	for reason, want := range map[string]string{"principal_sessions": "1", "max_sessions": "2"} {
		if got := l.metric(`mcprelay_sessions_rejected_total{reason="` + reason + `"}`); got != want {
			t.Errorf("rejected %s: %q, want %q", reason, got, want)
		}
	}

	// Another process on the same store, with room for one session:
	// restoring bob's is never refused, and then it is full.
	l2 := newLimited(t, store, relay.Limits{MaxSessions: 1})
	if w := l2.serve("POST", b1, "Bearer bob", "192.0.2.1:1", `{"jsonrpc":"2.0","method":"notifications/initialized"}`); w.Code != http.StatusAccepted {
		t.Fatalf("restoring bob's session: %d %s", w.Code, w.Body)
	}
	if w := l2.serve("DELETE", a1, "Bearer alice", "192.0.2.1:1", ""); w.Code != http.StatusNotFound {
		t.Fatalf("a deleted session: %d", w.Code)
	}
	refused(t, l2.initialize("Bearer dave", "192.0.2.1:1"), http.StatusServiceUnavailable, "past MaxSessions after a restore")
}

// TestStoreBudget: with a real disk store in a temporary directory and a
// small budget, once the store holds more than the budget new sessions get
// 503 with Retry-After, while a session that exists goes on calling and
// appending; with the memory store (which measures exactly), deleting
// sessions makes room again.
func TestStoreBudget(t *testing.T) {
	fill := func(t *testing.T, store eventlog.Store, n int) {
		t.Helper()
		ctx := t.Context()
		// Random, so that it takes as much room on disk as in memory.
		data := make([]byte, 16<<10)
		for i := 0; i*(1<<20) < n; i++ {
			sid := fmt.Sprintf("filler-%d", i)
			store.CreateSession(ctx, &eventlog.Session{ID: sid, Incarnation: 1})
			store.CreateStream(ctx, &eventlog.Stream{Key: sid, Session: sid, Generation: 1})
			for range 64 {
				rand.Read(data)
				if _, err := store.Append(ctx, sid, false, eventlog.Event{Data: bytes.Clone(data)}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	call := func(t *testing.T, l *limited, sid string) {
		t.Helper()
		l.serve("POST", sid, "", "192.0.2.1:1", `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		w := l.serve("POST", sid, "", "192.0.2.1:1", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"count","arguments":{"n":3}}}`)
		if w.Code != 200 || !strings.Contains(w.Body.String(), "counted 3") {
			t.Fatalf("a call of an existing session past the budget: %d %s", w.Code, w.Body)
		}
	}
	t.Run("pebble", func(t *testing.T) {
		store, err := pebblestore.Open(filepath.Join(t.TempDir(), "log"), pebblestore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		l := newLimited(t, store, relay.Limits{MaxStoreBytes: 4 << 20})
		sid := l.mustInitialize("", "192.0.2.1:1")
		fill(t, store, 8<<20)
		refused(t, l.initialize("", "192.0.2.1:1"), http.StatusServiceUnavailable, "past the store budget")
		call(t, l, sid)
		if got := l.metric(`mcprelay_sessions_rejected_total{reason="store_budget"}`); got != "1" {
			t.Fatalf("rejected store_budget: %q", got)
		}
		if got, _ := strconv.ParseFloat(l.metric("mcprelay_store_bytes"), 64); got < 4<<20 { // 4.194304e+06
			t.Fatalf("mcprelay_store_bytes %v", got)
		}
	})
	t.Run("memory", func(t *testing.T) {
		store := eventlog.NewMemory(eventlog.Retention{})
		l := newLimited(t, store, relay.Limits{MaxStoreBytes: 1 << 20})
		sid := l.mustInitialize("", "192.0.2.1:1")
		fill(t, store, 1<<20)
		refused(t, l.initialize("", "192.0.2.1:1"), http.StatusServiceUnavailable, "past the store budget")
		call(t, l, sid)
		store.DeleteSession(t.Context(), "filler-0")
		l.mustInitialize("", "192.0.2.1:1")
	})
	t.Run("a store without Size", func(t *testing.T) {
		_, err := relay.New(relay.Options{Backend: backend.SDK(testServer(nil), nil), Store: sizeless{eventlog.NewMemory(eventlog.Retention{})}, Limits: relay.Limits{MaxStoreBytes: 1}})
		if err == nil || !strings.Contains(err.Error(), "MaxStoreBytes") {
			t.Fatalf("New: %v", err)
		}
	})
}

// sizeless hides a store's Size.
type sizeless struct{ eventlog.Store }

// TestSessionFloodBounded measures what a flood of session creations
// leaves behind: live heap and store bytes after n initializes from one
// principal and from n distinct addresses, with and without limits. It
// logs the figures and checks only the session counts (no timing or size
// assertion).
func TestSessionFloodBounded(t *testing.T) {
	const n = 2000
	for _, tc := range []struct {
		name string
		lim  relay.Limits
	}{
		{"no limits", relay.Limits{}},
		{"limits", relay.Limits{MaxSessions: 200, MaxSessionsPerPrincipal: 10, SessionRate: 1, SessionBurst: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, err := pebblestore.Open(filepath.Join(t.TempDir(), "log"), pebblestore.Options{Sync: pebblestore.SyncNone})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			l := newLimited(t, store, tc.lim)
			heap0 := liveHeap()
			size0, _ := store.Size(t.Context())
			created := 0
			for i := range n {
				if l.initialize("Bearer flood", "192.0.2.1:1").Code == 200 {
					created++
				}
				if l.initialize("", fmt.Sprintf("10.0.%d.%d:1", i/256, i%256)).Code == 200 {
					created++
				}
			}
			heap1 := liveHeap()
			size1, _ := store.Size(t.Context())
			t.Logf("%d initializes (%d from one principal, %d from distinct addresses): %d sessions; live heap %+.1f MiB, store %+d KiB (pebble disk usage)",
				2*n, n, n, created, float64(heap1-heap0)/(1<<20), (size1-size0)>>10)
			want := 2 * n
			if tc.lim.MaxSessions > 0 {
				want = tc.lim.MaxSessions
			}
			if created != want || l.metric("mcprelay_sessions") != strconv.Itoa(want) {
				t.Fatalf("%d sessions created, %s live; want %d", created, l.metric("mcprelay_sessions"), want)
			}
		})
	}
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
