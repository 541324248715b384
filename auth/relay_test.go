package auth

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/mcprelay/mcprelay/relay"
)

// TestSessionSurvivesRefresh: the relay behind the middleware, with sessions
// bound to auth.Identity. A session created with alice's token keeps working
// with her refreshed token (new jti and exp); bob's valid token on it gets
// 404. Without Identity (the relay's default, a hash of Authorization), the
// refreshed token loses the session: that is the behaviour this replaces.
func TestSessionSurvivesRefresh(t *testing.T) {
	is := newTestIssuer(t)
	is.addRSA("r1")
	for _, c := range []struct {
		name        string
		identity    func(*http.Request) string
		wantRefresh int
	}{
		{"identity_from_token", Identity, http.StatusOK},
		{"default_authorization_hash", nil, http.StatusNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, err := relay.New(relay.Options{Backend: backend.SDK(exampleserver.New(nil), nil), Identity: c.identity})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			mux := http.NewServeMux()
			srv := httptest.NewServer(mux)
			defer srv.Close()
			v, clk := newTestVerifier(t, is, Options{Audience: srv.URL + "/mcp"})
			mux.Handle("/mcp", v.Middleware(h))
			token := func(sub string) string {
				c := is.good(sub, clk.now())
				c["aud"] = srv.URL + "/mcp"
				return is.sign("r1", c)
			}
			post := func(tok, session, body string) *http.Response {
				t.Helper()
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/mcp", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.Header.Set("Authorization", "Bearer "+tok)
				if session != "" {
					req.Header.Set("Mcp-Session-Id", session)
					req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
				}
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp
			}

			alice := token("alice")
			resp := post(alice, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
			sid := resp.Header.Get("Mcp-Session-Id")
			if resp.StatusCode != http.StatusOK || sid == "" {
				t.Fatalf("initialize: %s, session %q", resp.Status, sid)
			}
			if resp := post(alice, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
				t.Fatalf("initialized: %s", resp.Status)
			}
			if resp := post(alice, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != http.StatusOK {
				t.Fatalf("tools/list with the first token: %s", resp.Status)
			}

			clk.advance(4 * time.Minute) // a client refreshes before exp
			refreshed := token("alice")
			if refreshed == alice {
				t.Fatal("the refreshed token is the same token")
			}
			if resp := post(refreshed, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`); resp.StatusCode != c.wantRefresh {
				t.Fatalf("tools/list with alice's refreshed token: %s, want %d", resp.Status, c.wantRefresh)
			}
			if resp := post(token("bob"), sid, `{"jsonrpc":"2.0","id":4,"method":"tools/list"}`); resp.StatusCode != http.StatusNotFound {
				t.Fatalf("tools/list with bob's token on alice's session: %s, want 404", resp.Status)
			}
			if resp := post("garbage", sid, `{"jsonrpc":"2.0","id":5,"method":"tools/list"}`); resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("tools/list with a bad token: %s, want 401", resp.Status)
			}
		})
	}
}
