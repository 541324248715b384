package redisreplicas_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/relay/redisreplicas"
)

// TestUpstreamHeadersAcrossReplicas: two replicas on one Redis in front of
// one remote backend. A session created on A is called through B
// (forwarded to A, its owner), then A goes away and B takes the session
// over with a new backend session. What the backend receives follows the
// rule at every step: by default never the client's Authorization, only
// the upstream headers; with forwarding, the token of the request that
// created the session (even when a forwarded request carries another),
// and after the takeover the token of the request that restored it.
func TestUpstreamHeadersAcrossReplicas(t *testing.T) {
	rds := redistest.Start(t)
	for _, tc := range []struct {
		name    string
		forward bool
		// want is what the backend must see: before the takeover (the
		// session was created with t1), after it (restored with t3).
		before, after string
	}{
		{name: "default", before: "|k", after: "|k"},
		{name: "forward authorization", forward: true, before: "Bearer t1|k", after: "Bearer t3|k"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := &mcptest.HeaderRecorder{H: backend.SDKHandler(exampleserver.New(nil), nil), Names: []string{"Authorization", "X-Api-Key", "Mcp-Session-Id"}}
			be := httptest.NewServer(seen)
			t.Cleanup(be.Close) // after the replicas (cleanups run last first)
			prefix := fmt.Sprintf("hdr%d", time.Now().UnixNano())
			start := func() (*relay.Handler, *httptest.Server) {
				var h atomic.Pointer[relay.Handler]
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.Load().ServeHTTP(w, r) }))
				st, err := redisstore.Open(t.Context(), redisstore.Options{URL: rds.URL(), Prefix: prefix})
				if err != nil {
					t.Fatal(err)
				}
				secret, err := st.LoadOrCreateSecret(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				up := backend.Remote(be.URL)
				up.Header = http.Header{"X-Api-Key": {"k"}}
				rh, err := relay.New(relay.Options{
					Backend: up, Store: st, Secret: secret, LeaseTTL: time.Second,
					Cluster:              redisreplicas.New(st, srv.URL),
					ForwardAuthorization: tc.forward,
					Identity:             func(*http.Request) string { return "alice" },
				})
				if err != nil {
					t.Fatal(err)
				}
				h.Store(rh)
				t.Cleanup(func() { rh.Close(); srv.CloseClientConnections(); srv.Close(); st.Close() })
				return rh, srv
			}
			a, srvA := start()
			_, srvB := start()

			post := func(url, sid, token, body string) *http.Response {
				t.Helper()
				return postAs(t, url, sid, token, body)
			}
			call := func(url, sid, token string) {
				t.Helper()
				resp := post(url, sid, token, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_simple_text","arguments":{}}}`)
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !strings.Contains(string(b), "simple text response") {
					t.Fatalf("tools/call through %s: %s %s", url, resp.Status, b)
				}
			}
			// check compares what the backend saw since the last check with
			// want, but for requests of the backend sessions in skip (a
			// previous owner's, which keeps the token it was created with
			// until it is closed). It returns the backend sessions seen.
			check := func(when, want string, skip map[string]bool) map[string]bool {
				t.Helper()
				got := seen.Take()
				if len(got) == 0 {
					t.Fatalf("%s: the backend saw nothing", when)
				}
				sessions := map[string]bool{}
				for _, g := range got {
					auth, key, bsid := g.Values[0], g.Values[1], g.Values[2]
					sessions[bsid] = bsid != ""
					if g.Method == "DELETE" || skip[bsid] {
						continue // a previous owner's session (or its discarding): not this request's
					}
					if v := auth + "|" + key; v != want {
						t.Errorf("%s: the backend saw %s %q (backend session %q), want %q", when, g.Method, v, bsid, want)
					}
				}
				return sessions
			}

			resp := post(srvA.URL, "", "Bearer t1", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			sid := resp.Header.Get("Mcp-Session-Id")
			if resp.StatusCode != 200 || sid == "" {
				t.Fatalf("initialize: %s", resp.Status)
			}
			if r := post(srvA.URL, sid, "Bearer t1", `{"jsonrpc":"2.0","method":"notifications/initialized"}`); r.Body.Close() != nil || r.StatusCode != http.StatusAccepted {
				t.Fatalf("initialized: %s", r.Status)
			}
			call(srvB.URL, sid, "Bearer t2") // forwarded to A
			onA := check("created on A, called through B", tc.before, nil)

			// A goes away (its leases lapse); B takes the session over.
			a.Close()
			srvA.CloseClientConnections()
			srvA.Close()
			deadline := time.Now().Add(30 * time.Second)
			for {
				resp := post(srvB.URL, sid, "Bearer t3", `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"test_simple_text","arguments":{}}}`)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
				if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
					t.Fatalf("after A went away: %s", resp.Status)
				}
				seen.Take() // what A's dying session sent
				time.Sleep(100 * time.Millisecond)
			}
			call(srvB.URL, sid, "Bearer t4")
			check("taken over by B", tc.after, onA)
		})
	}
}
