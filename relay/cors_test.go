package relay_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// corsRelay serves h.CORS(h) for a relay with AllowedOrigins origins.
func corsRelay(t *testing.T, origins ...string) string {
	t.Helper()
	up := mcptest.NewRestartable(func() http.Handler {
		return backend.SDKHandler(testServer(nil), &mcp.StreamableHTTPOptions{})
	})
	h, err := relay.New(relay.Options{Backend: backend.Handler(up), AllowedOrigins: origins})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h.CORS(h))
	t.Cleanup(func() {
		h.Close()
		srv.CloseClientConnections()
		srv.Close()
		up.Stop()
	})
	return srv.URL
}

func TestCORSPreflight(t *testing.T) {
	url := corsRelay(t, "http://127.0.0.1:5173")
	for _, c := range []struct {
		name   string
		hdr    map[string]string
		status int
		want   map[string]string // response headers; "" = absent
	}{
		{"allowed origin", map[string]string{"Origin": "http://127.0.0.1:5173", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type,mcp-session-id,mcp-protocol-version"}, 204, map[string]string{
			"Access-Control-Allow-Origin":  "http://127.0.0.1:5173",
			"Access-Control-Allow-Methods": "GET, POST, DELETE",
			"Access-Control-Allow-Headers": "Content-Type, Accept, Authorization, Mcp-Session-Id, MCP-Protocol-Version, Last-Event-ID",
		}},
		{"origin not listed", map[string]string{"Origin": "http://127.0.0.1:5174", "Access-Control-Request-Method": "POST"}, 403, map[string]string{"Access-Control-Allow-Origin": ""}},
		{"loopback origin not listed", map[string]string{"Origin": "http://localhost:5173", "Access-Control-Request-Method": "GET"}, 403, map[string]string{"Access-Control-Allow-Origin": ""}},
		{"foreign host", map[string]string{"Origin": "http://127.0.0.1:5173", "Access-Control-Request-Method": "POST", "Host": "evil.example"}, 403, map[string]string{"Access-Control-Allow-Origin": ""}},
		{"not a preflight", nil, 204, map[string]string{"Allow": "GET, POST, DELETE, OPTIONS", "Access-Control-Allow-Origin": ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := send(t, "OPTIONS", url, "", c.hdr)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			for k, v := range c.want {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
		})
	}
}

// TestCORSResponses: responses to a listed origin carry
// Access-Control-Allow-Origin and expose the session headers; a request
// from another origin is refused (403) without them; without a list no
// origin gets CORS.
func TestCORSResponses(t *testing.T) {
	const init = `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"o","version":"1"}}}`
	post := func(url, origin string) *http.Response {
		return send(t, "POST", url, init, map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream", "Origin": origin})
	}
	url := corsRelay(t, "http://127.0.0.1:5173")
	resp := post(url, "http://127.0.0.1:5173")
	if resp.StatusCode != 200 || resp.Header.Get("Mcp-Session-Id") == "" {
		t.Fatalf("allowed origin: %s, session %q", resp.Status, resp.Header.Get("Mcp-Session-Id"))
	}
	if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "http://127.0.0.1:5173" {
		t.Errorf("Access-Control-Allow-Origin %q", got)
	}
	if got := resp.Header.Get("Access-Control-Expose-Headers"); got != "Mcp-Session-Id, MCP-Protocol-Version, WWW-Authenticate" {
		t.Errorf("Access-Control-Expose-Headers %q", got)
	}
	resp = post(url, "http://127.0.0.1:5174")
	if resp.StatusCode != 403 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("origin not listed: %s, Access-Control-Allow-Origin %q", resp.Status, resp.Header.Get("Access-Control-Allow-Origin"))
	}
	unlisted := corsRelay(t)
	resp = post(unlisted, "http://localhost:5173")
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("no list, loopback origin: %s, Access-Control-Allow-Origin %q", resp.Status, resp.Header.Get("Access-Control-Allow-Origin"))
	}
	if resp := send(t, "OPTIONS", unlisted, "", map[string]string{"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"}); resp.StatusCode != 403 {
		t.Errorf("no list, preflight from a loopback origin: %s, want 403", resp.Status)
	}
}
