package relay_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// seenHeaders records the headers of every request a backend receives.
type seenHeaders struct {
	h  http.Handler
	mu sync.Mutex
	// reqs holds "METHOD PATH" and the headers asked for, per request.
	reqs []seenRequest
}

type seenRequest struct {
	what          string
	authz, apiKey string
}

func (s *seenHeaders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.reqs = append(s.reqs, seenRequest{r.Method + " " + r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("X-Api-Key")})
	s.mu.Unlock()
	s.h.ServeHTTP(w, r)
}

// take returns the requests seen since the last take.
func (s *seenHeaders) take() []seenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.reqs
	s.reqs = nil
	return out
}

// TestUpstreamHeaders: what the backend receives of the client's
// Authorization and the operator's upstream headers, on session requests
// (initialize, calls, the GET stream), on stateless requests, and after a
// restart when the session is restored by a request bearing a refreshed
// token. By default nothing of the client's goes upstream.
func TestUpstreamHeaders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		forward bool
		header  http.Header
		// want is the Authorization the backend must see when the
		// client's (for this request or, on session requests, for the
		// request that opened or restored the session) is client.
		want   func(client string) string
		apiKey string
	}{
		{name: "default forwards nothing", want: func(string) string { return "" }},
		{name: "upstream headers", header: http.Header{"Authorization": {"Bearer relay-own"}, "x-api-key": {"k1"}},
			want: func(string) string { return "Bearer relay-own" }, apiKey: "k1"},
		{name: "forward authorization", forward: true, want: func(c string) string { return c }},
		{name: "forward with another upstream header", forward: true, header: http.Header{"X-Api-Key": {"k2"}},
			want: func(c string) string { return c }, apiKey: "k2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := eventlog.NewMemory(eventlog.Retention{})
			be := mcptest.NewRestartable(func() http.Handler {
				return backend.SDKHandler(testServer(nil), &mcp.StreamableHTTPOptions{})
			})
			seen := &seenHeaders{h: be}
			start := func() *relay.Handler {
				up := backend.Handler(seen)
				up.StatelessURL = up.URL + "/stateless"
				up.Header = tc.header
				h, err := relay.New(relay.Options{Backend: up, Store: store, Secret: testSecret,
					ForwardAuthorization: tc.forward,
					// One principal whatever the token: a refreshed
					// token keeps the session.
					Identity: func(*http.Request) string { return "alice" },
				})
				if err != nil {
					t.Fatal(err)
				}
				return h
			}
			var current atomic.Pointer[relay.Handler]
			current.Store(start())
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { current.Load().ServeHTTP(w, r) }))
			t.Cleanup(func() { current.Load().Close(); srv.CloseClientConnections(); srv.Close(); be.Stop() })
			e := &env{t: t, url: srv.URL}

			check := func(when, client string, reqs []seenRequest) {
				t.Helper()
				if len(reqs) == 0 {
					t.Fatalf("%s: the backend saw no request", when)
				}
				for _, r := range reqs {
					want := tc.want(client)
					if tc.forward && tc.header["Authorization"] == nil && r.what == "DELETE /mcp" {
						want = "" // discarding the previous incarnation's session: no request to take it from
					}
					if r.authz != want || r.apiKey != tc.apiKey {
						t.Errorf("%s: %s carried Authorization %q, X-Api-Key %q; want %q, %q", when, r.what, r.authz, r.apiKey, want, tc.apiKey)
					}
				}
			}

			s := e.initialize("2025-06-18", "Bearer t1")
			_, resp := s.call(1, 0, false)
			events(t, resp, 0, 5*time.Second)
			check("before the restart", "Bearer t1", seen.take())

			// A stateless request carries its own token.
			r := e.do("POST", map[string]string{"Authorization": "Bearer t3", "Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "count"},
				`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count","arguments":{"n":0},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"x","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`)
			if r.StatusCode != 200 {
				t.Fatalf("stateless call: %s %s", r.Status, readBody(t, r))
			}
			readBody(t, r)
			stateless := seen.take()
			if !slices.ContainsFunc(stateless, func(r seenRequest) bool { return r.what == "POST /mcp/stateless" }) {
				t.Fatalf("the stateless request did not reach the stateless endpoint: %+v", stateless)
			}
			check("stateless", "Bearer t3", stateless)

			// Restart: the session is restored by a request with a
			// refreshed token.
			old := current.Load()
			current.Store(start())
			old.Close()
			be.Restart()
			s.auth = "Bearer t2"
			_, resp = s.call(1, 0, false)
			events(t, resp, 0, 5*time.Second)
			if n := current.Load().Counts()["restore"]; n != 1 {
				t.Fatalf("restores: %d, want 1", n)
			}
			check("after the restore", "Bearer t2", seen.take())
		})
	}
}
