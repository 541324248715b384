// Package hostile provides a misbehaving MCP backend for tests: a real
// Streamable HTTP handler wrapped so that it breaks the transport in the
// ways real servers do (a GET answered 404 by a server that defines only
// POST, a POST answered 404 while the session lives on, a request that
// never gets an answer, an oversized or HTML answer), and counts what it
// was asked.
//
//	up := &hostile.Upstream{Next: backend.SDKHandler(server, nil), GET404: true}
//	h, _ := relay.New(relay.Options{Backend: backend.Handler(up)})
package hostile

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// Upstream wraps Next with the misbehaviours its fields switch on. Fields
// must be set before the first request; the counters are safe to read at
// any time.
type Upstream struct {
	Next http.Handler

	// GET404 answers every GET with 404, as a server that defines only
	// POST on its endpoint does; POSTs still reach Next.
	GET404 bool

	// NotFoundMethod answers every POST of this JSON-RPC method that
	// carries a session with 404, while the session lives on for others.
	NotFoundMethod string

	// HangMethod never answers POSTs of this JSON-RPC method: the request
	// blocks until its client goes away.
	HangMethod string

	// HTMLErrorMethod answers POSTs of this method with a 500 text/html
	// page.
	HTMLErrorMethod string

	// OversizeMethod answers POSTs of this method with a JSON body of
	// OversizeBytes (a valid JSON-RPC response padded with spaces).
	OversizeMethod string
	OversizeBytes  int

	Initializes atomic.Int64 // initialize requests seen
	Deletes     atomic.Int64 // DELETE requests seen
	GETs        atomic.Int64 // GET requests seen

	mu      sync.Mutex
	methods map[string]int
}

// Count returns how many POSTs of a JSON-RPC method were seen.
func (u *Upstream) Count(method string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.methods[method]
}

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		u.GETs.Add(1)
		if u.GET404 {
			http.Error(w, "404 page not found", http.StatusNotFound)
			return
		}
	case http.MethodDelete:
		u.Deletes.Add(1)
	case http.MethodPost:
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.Unmarshal(body, &m)
		u.mu.Lock()
		if u.methods == nil {
			u.methods = make(map[string]int)
		}
		u.methods[m.Method]++
		u.mu.Unlock()
		switch {
		case m.Method == "initialize":
			u.Initializes.Add(1)
		case m.Method == "":
		case m.Method == u.NotFoundMethod && r.Header.Get("Mcp-Session-Id") != "":
			http.Error(w, "session not found", http.StatusNotFound)
			return
		case m.Method == u.HangMethod:
			<-r.Context().Done()
			return
		case m.Method == u.HTMLErrorMethod:
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, "<html><script>alert(document.cookie)</script></html>")
			return
		case m.Method == u.OversizeMethod:
			w.Header().Set("Content-Type", "application/json")
			resp := `{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{}}`
			io.WriteString(w, resp+strings.Repeat(" ", max(0, u.OversizeBytes-len(resp))))
			return
		}
	}
	u.Next.ServeHTTP(w, r)
}
