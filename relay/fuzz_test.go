package relay_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/relay"
)

// FuzzHandler throws arbitrary methods, session IDs, cursors, protocol
// versions and bodies at the handler: it must never panic, never answer
// 5xx for the client's own mistakes, and never hang (the request context
// bounds streams; the body is small).
func FuzzHandler(f *testing.F) {
	h, err := relay.New(relay.Options{Backend: backend.SDK(testServer(nil), nil), Secret: testSecret})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { h.Close() })
	for _, seed := range []struct{ method, sid, cursor, version, body string }{
		{"POST", "", "", "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"f","version":"1"}}}`},
		{"POST", "x", "", "2025-06-18", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`},
		{"POST", "", "", "2026-07-28", `{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}`},
		{"GET", "x", "AQIDBA", "", ""},
		{"DELETE", "x", "", "", ""},
		{"POST", "", "", "", `[{"jsonrpc":"2.0","id":1,"method":"ping"},{}]`},
		{"POST", "", "", "", `{"jsonrpc":"2.0","id":null}`},
	} {
		f.Add(seed.method, seed.sid, seed.cursor, seed.version, seed.body)
	}
	f.Fuzz(func(t *testing.T, method, sid, cursor, version, body string) {
		if len(body) > 1<<16 {
			return
		}
		req := httptest.NewRequest("POST", "/mcp", strings.NewReader(body))
		req.Method = method
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range map[string]string{"Mcp-Session-Id": sid, "Last-Event-ID": cursor, "Mcp-Protocol-Version": version} {
			if v != "" && !strings.ContainsAny(v, "\r\n\x00") {
				req.Header.Set(k, v)
			}
		}
		w := httptest.NewRecorder()
		if method == http.MethodGet {
			// A valid GET is a stream that stays open: bound it.
			ctx, cancel := contextWithTimeout(req)
			defer cancel()
			req = req.WithContext(ctx)
		}
		h.ServeHTTP(w, req)
		if w.Code >= 500 && w.Code != http.StatusBadGateway {
			t.Fatalf("%s %q: status %d: %s", method, body, w.Code, w.Body.String())
		}
	})
}

func contextWithTimeout(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 200*time.Millisecond)
}
