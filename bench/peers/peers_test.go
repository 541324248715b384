package peers_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mcprelay/mcprelay/bench/load"
	"github.com/mcprelay/mcprelay/bench/peers"
)

var servers = []struct {
	name      string
	handler   func() http.Handler
	resumable bool
	lossy     bool // drops notifications now and then (mcp-go's queue)
}{
	{"minimal flushing every event", func() http.Handler { return peers.Minimal(peers.MinimalOptions{FlushEvery: true}) }, true, false},
	{"minimal batched", func() http.Handler { return peers.Minimal(peers.MinimalOptions{}) }, true, false},
	{"minimal without GET", func() http.Handler { return peers.Minimal(peers.MinimalOptions{NoGET: true}) }, false, false},
	{"go sdk", func() http.Handler { return peers.GoSDK(false) }, false, false},
	{"go sdk with store", func() http.Handler { return peers.GoSDK(true) }, true, false},
	{"mcp-go", func() http.Handler { return peers.MCPGo(false) }, false, true},
	{"mcp-go with store", func() http.Handler { return peers.MCPGo(true) }, true, true},
}

func TestServers(t *testing.T) {
	for _, tt := range servers {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler())
			defer srv.Close()
			c := load.NewClient(srv.URL)
			defer c.CloseIdle()
			ctx := t.Context()
			s, err := c.Initialize(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Delete(ctx)
			if err := s.Call(ctx, peers.ToolSimple); err != nil {
				t.Fatalf("%s: %v", peers.ToolSimple, err)
			}
			// mcp-go drops notifications beyond its queue of 100: stay under it.
			const n = 50
			st, err := s.Stream(ctx, n, 10)
			if err != nil {
				t.Fatalf("%s: %v", peers.ToolStream, err)
			}
			if st.Progress != n && !(tt.lossy && st.Progress > 0) {
				t.Fatalf("received %d of %d notifications", st.Progress, n)
			}
			if !tt.resumable || st.Progress != n {
				return
			}
			if st.KeptID == "" {
				t.Fatal("the 10th notification carried no event ID")
			}
			rs, err := load.ResumeSettled(ctx, s, st.KeptID)
			if err != nil {
				t.Fatal(err)
			}
			if rs.Progress != n-10 || !rs.Response {
				t.Errorf("resume from the 10th: %d notifications, response %v; want %d and the response", rs.Progress, rs.Response, n-10)
			}
		})
	}
}

func TestMinimalStatuses(t *testing.T) {
	tests := []struct {
		name   string
		opts   peers.MinimalOptions
		method string
		sid    string
		lei    string
		want   int
	}{
		{"GET without GET support", peers.MinimalOptions{NoGET: true}, http.MethodGet, "", "", http.StatusMethodNotAllowed},
		{"GET of an unknown session", peers.MinimalOptions{}, http.MethodGet, "nope", "", http.StatusNotFound},
		{"POST of an unknown session", peers.MinimalOptions{}, http.MethodPost, "nope", "", http.StatusNotFound},
		{"PUT", peers.MinimalOptions{}, http.MethodPut, "", "", http.StatusMethodNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(tt.method, "/mcp", nil)
			if tt.method == http.MethodPost {
				req = httptest.NewRequest(tt.method, "/mcp", stringsReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			}
			if tt.sid != "" {
				req.Header.Set("Mcp-Session-Id", tt.sid)
			}
			w := httptest.NewRecorder()
			peers.Minimal(tt.opts).ServeHTTP(w, req)
			if w.Code != tt.want {
				t.Errorf("status %d, want %d", w.Code, tt.want)
			}
		})
	}
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }
