package backend_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/backend/connectortest"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestUpstreamConnector runs the connector suite against the Streamable
// HTTP connector in front of the official Go SDK's handler, in process.
// Losing a session is restarting the backend: the new server knows none.
func TestUpstreamConnector(t *testing.T) {
	connectortest.Run(t, func(t *testing.T) connectortest.Harness {
		be := mcptest.NewRestartable(func() http.Handler {
			return backend.SDKHandler(connectortest.Server(nil), &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
		})
		t.Cleanup(be.Stop)
		return connectortest.Harness{
			Connector: backend.Handler(be),
			Lose:      func(t *testing.T, s backend.Session) { be.Restart() },
		}
	})
}

// A backend that answers a call on its GET stream (only a server resuming a
// request stream should): the answer still carries the client's id, not the
// connector's own, so that the relay can relate it to the call.
func TestResponseOnGETStreamKeepsClientID(t *testing.T) {
	calls := make(chan string, 1)
	get := make(chan http.ResponseWriter)
	done := make(chan struct{})
	defer close(done)
	srv := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			get <- w
			<-done
			return
		}
		m := readRequest(r)
		switch m.Method {
		case "initialize":
			answerInitialize(w, m.ID)
		case "tools/call":
			calls <- string(m.ID)
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK) // and nothing: the answer goes to the GET stream
		default:
			w.WriteHeader(http.StatusAccepted)
		}
	})
	unrelated := make(chan []byte, 1)
	s, _, err := backend.Handler(srv).Open(t.Context(), backend.Init{
		Request:   []byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`),
		Unrelated: func(m []byte) { unrelated <- m },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Notify(t.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil {
		t.Fatal(err)
	}
	s.Listen()
	w := <-get
	r, err := s.Call(t.Context(), []byte(`{"jsonrpc":"2.0","id":"c-1","method":"tools/call","params":{"name":"x"}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	own := <-calls
	if own == `"c-1"` {
		t.Fatalf("the backend saw the client's id %s, want the connector's own", own)
	}
	fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{}}\n\n", own)
	w.(http.Flusher).Flush()
	select {
	case m := <-unrelated:
		if !strings.Contains(string(m), `"id":"c-1"`) {
			t.Fatalf("the answer on the GET stream: %s, want the client's id \"c-1\"", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the answer on the GET stream never came")
	}
}

// TestGETStreamOpensOnListen: the backend's GET stream is opened once the
// session is initialized and Listen was called, in either order, and only
// once.
func TestGETStreamOpensOnListen(t *testing.T) {
	for _, listenFirst := range []bool{false, true} {
		t.Run(fmt.Sprint("listen first: ", listenFirst), func(t *testing.T) {
			var gets atomic.Int32
			srv := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet {
					gets.Add(1)
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(http.StatusOK)
					w.(http.Flusher).Flush()
					<-r.Context().Done()
					return
				}
				m := readRequest(r)
				if m.Method == "initialize" {
					answerInitialize(w, m.ID)
					return
				}
				w.WriteHeader(http.StatusAccepted)
			})
			s, _, err := backend.Handler(srv).Open(t.Context(), backend.Init{
				Request: []byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if listenFirst {
				s.Listen()
			}
			if err := s.Notify(t.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil {
				t.Fatal(err)
			}
			// A call round trip: the pump would have sent its GET by now
			// in most runs; the check below holds in all.
			if err := s.Notify(t.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`)); err != nil {
				t.Fatal(err)
			}
			if n := gets.Load(); !listenFirst && n != 0 {
				t.Fatalf("%d GETs before Listen, want none", n)
			}
			s.Listen()
			s.Listen()
			deadline := time.Now().Add(10 * time.Second)
			for gets.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond) // a second GET would show now
			if n := gets.Load(); n != 1 {
				t.Fatalf("%d GETs after Listen, want 1", n)
			}
		})
	}
}

// TestBufferedReply: a call an in-process backend answered before Call
// returned is read without waiting (backend.Buffered), under the client's
// id; a streaming answer is not.
func TestBufferedReply(t *testing.T) {
	release := make(chan struct{})
	srv := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		json.NewDecoder(r.Body).Decode(&m)
		switch {
		case m.Method == "initialize":
			answerInitialize(w, m.ID)
		case m.Params.Name == "quick":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"quick":true}}`, m.ID)
		case m.Params.Name == "slow":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n")
			w.(http.Flusher).Flush()
			<-release
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{}}\n\n", m.ID)
		default:
			w.WriteHeader(http.StatusAccepted)
		}
	})
	s := openSession(t, srv)
	r, err := s.Call(t.Context(), []byte(`{"jsonrpc":"2.0","id":"c-1","method":"tools/call","params":{"name":"quick"}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, ok := r.(backend.Buffered)
	if !ok {
		t.Fatal("an HTTP reply does not implement backend.Buffered")
	}
	m, ok := b.TryNext()
	if !ok || string(m) != `{"jsonrpc":"2.0","id":"c-1","result":{"quick":true}}` {
		t.Fatalf("TryNext = %s %v, want the answer under the client's id", m, ok)
	}
	if m, ok := b.TryNext(); ok {
		t.Fatalf("TryNext after the answer = %s", m)
	}
	if m, err := r.Next(); err != io.EOF {
		t.Fatalf("Next after the answer = %s %v, want io.EOF", m, err)
	}

	r, err = s.Call(t.Context(), []byte(`{"jsonrpc":"2.0","id":"c-2","method":"tools/call","params":{"name":"slow"}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if m, ok := r.(backend.Buffered).TryNext(); ok {
		t.Fatalf("TryNext on a streaming answer = %s", m)
	}
	close(release)
	for _, want := range []string{`"notifications/progress"`, `"id":"c-2"`} {
		m, err := r.Next()
		if err != nil || !strings.Contains(string(m), want) {
			t.Fatalf("Next = %s %v, want %s", m, err, want)
		}
	}
}

// TestReplyResumesBrokenStream: a call's SSE stream that breaks before the
// response is resumed with a GET carrying the backend's last event ID.
func TestReplyResumesBrokenStream(t *testing.T) {
	var own atomic.Value
	lastIDs := make(chan string, 1)
	srv := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			lastIDs <- r.Header.Get("Last-Event-ID")
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "id: e2\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{}}\n\n", own.Load())
			return
		}
		m := readRequest(r)
		switch m.Method {
		case "initialize":
			answerInitialize(w, m.ID)
		case "tools/call":
			own.Store(string(m.ID))
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "id: e1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n")
			// and the stream ends without the response
		default:
			w.WriteHeader(http.StatusAccepted)
		}
	})
	s := openSession(t, srv)
	r, err := s.Call(t.Context(), []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, want := range []string{`"notifications/progress"`, `{"jsonrpc":"2.0","id":7,"result":{}}`} {
		m, err := r.Next()
		if err != nil || !strings.Contains(string(m), want) {
			t.Fatalf("Next = %s %v, want %s", m, err, want)
		}
	}
	if got := <-lastIDs; got != "e1" {
		t.Fatalf("the resuming GET had Last-Event-ID %q, want e1", got)
	}
}

// answerInitialize answers a test backend's initialize request with
// session "s1".
func answerInitialize(w http.ResponseWriter, id json.RawMessage) {
	w.Header().Set("Mcp-Session-Id", "s1")
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"x","version":"1"}}}`, id)
}

// openSession opens a session of the in-process backend srv and sends
// notifications/initialized; it is closed when the test ends.
func openSession(t *testing.T, srv http.Handler) backend.Session {
	t.Helper()
	s, _, err := backend.Handler(srv).Open(t.Context(), backend.Init{
		Request: []byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Notify(t.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil {
		t.Fatal(err)
	}
	return s
}

// testRequest is what the test backends read of a request.
type testRequest struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
}

func readRequest(r *http.Request) testRequest {
	var m testRequest
	json.NewDecoder(r.Body).Decode(&m)
	return m
}

// TestStatelessHeaders: a stateless request goes to the backend with the
// client's headers, but for hop-by-hop ones, those its Connection header
// names, and the session-era Mcp-Session-Id and Last-Event-ID (a client
// naming a backend session it guessed must not reach it).
func TestStatelessHeaders(t *testing.T) {
	var got http.Header
	u := backend.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	}))
	r := httptest.NewRequest("POST", "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	r.Header.Set("X-Kept", "yes")
	r.Header.Set("Mcp-Session-Id", "backend-session-of-someone-else")
	r.Header.Set("Last-Event-Id", "their-cursor")
	r.Header.Set("Connection", "keep-alive, X-Hop")
	r.Header.Set("X-Hop", "drop me")
	r.Header.Set("Keep-Alive", "timeout=5")
	w := httptest.NewRecorder()
	if err := u.ServeStateless(w, r, []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)); err != nil {
		t.Fatal(err)
	}
	if w.Code != 200 {
		t.Fatalf("status %d %s", w.Code, w.Body)
	}
	if got.Get("X-Kept") != "yes" || got.Get("Mcp-Protocol-Version") != "2026-07-28" {
		t.Errorf("end-to-end headers not passed: %v", got)
	}
	for _, k := range []string{"Mcp-Session-Id", "Last-Event-Id", "Connection", "X-Hop", "Keep-Alive"} {
		if v := got.Values(k); len(v) > 0 {
			t.Errorf("%s reached the backend: %q", k, v)
		}
	}
}
