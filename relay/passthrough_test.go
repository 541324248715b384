package relay_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

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
			seen := &mcptest.HeaderRecorder{H: be, Names: []string{"Authorization", "X-Api-Key"}}
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
			rs := serveRestartable(t, start)
			t.Cleanup(be.Stop)
			e := &env{t: t, client: http.DefaultClient, url: rs.url}

			check := func(when, client string, reqs []mcptest.Recorded) {
				t.Helper()
				if len(reqs) == 0 {
					t.Fatalf("%s: the backend saw no request", when)
				}
				for _, r := range reqs {
					want := tc.want(client)
					if tc.forward && tc.header["Authorization"] == nil && r.Method == "DELETE" {
						want = "" // discarding the previous incarnation's session: no request to take it from
					}
					if r.Values[0] != want || r.Values[1] != tc.apiKey {
						t.Errorf("%s: %s %s carried Authorization %q, X-Api-Key %q; want %q, %q", when, r.Method, r.Path, r.Values[0], r.Values[1], want, tc.apiKey)
					}
				}
			}

			s := e.initialize("2025-06-18", "Bearer t1")
			_, resp := s.call(1, 0, false)
			events(t, resp, 0, 5*time.Second)
			check("before the restart", "Bearer t1", seen.Take())

			// A stateless request carries its own token.
			r := e.do("POST", map[string]string{"Authorization": "Bearer t3", "Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "count"},
				`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count","arguments":{"n":0},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"x","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`)
			if r.StatusCode != 200 {
				t.Fatalf("stateless call: %s %s", r.Status, readBody(t, r))
			}
			readBody(t, r)
			stateless := seen.Take()
			if !slices.ContainsFunc(stateless, func(r mcptest.Recorded) bool { return r.Path == "/mcp/stateless" }) {
				t.Fatalf("the stateless request did not reach the stateless endpoint: %+v", stateless)
			}
			check("stateless", "Bearer t3", stateless)

			// Restart: the session is restored by a request with a
			// refreshed token.
			rs.restart()
			// The closed relay ends its backend session (Close does not
			// wait for that), under the session's own headers.
			var closing []mcptest.Recorded
			for deadline := time.Now().Add(5 * time.Second); !slices.ContainsFunc(closing, func(r mcptest.Recorded) bool { return r.Method == "DELETE" }); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the closed relay did not DELETE its backend session: %+v", closing)
				}
				closing = append(closing, seen.Take()...)
			}
			for _, r := range closing {
				if r.Method != "DELETE" || r.Values[0] != tc.want("Bearer t1") || r.Values[1] != tc.apiKey {
					t.Errorf("closing the old relay: %s %s carried Authorization %q, X-Api-Key %q; want DELETE with %q, %q", r.Method, r.Path, r.Values[0], r.Values[1], tc.want("Bearer t1"), tc.apiKey)
				}
			}
			be.Restart()
			s.auth = "Bearer t2"
			_, resp = s.call(1, 0, false)
			events(t, resp, 0, 5*time.Second)
			if n := rs.current().Counts()["restore"]; n != 1 {
				t.Fatalf("restores: %d, want 1", n)
			}
			check("after the restore", "Bearer t2", seen.Take())
		})
	}
}
