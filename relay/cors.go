package relay

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// CORS headers: what a browser client of the MCP endpoint may send, and
// what its script may read of a response.
var (
	corsMethods = strings.Join([]string{http.MethodGet, http.MethodPost, http.MethodDelete}, ", ")
	corsHeaders = strings.Join([]string{"Content-Type", "Accept", "Authorization", "Mcp-Session-Id", "MCP-Protocol-Version", "Last-Event-ID"}, ", ")
	corsExpose  = strings.Join([]string{"Mcp-Session-Id", "MCP-Protocol-Version", "WWW-Authenticate"}, ", ")
)

// corsMaxAge is how long (seconds) a browser may cache a preflight answer.
const corsMaxAge = "600"

// CORS wraps next (the Handler itself, or the Handler behind an
// authentication middleware, which then never sees a preflight) so that
// browser clients on the origins listed in Options.AllowedOrigins can use
// it:
//
//	http.Handle("/mcp", h.CORS(h))
//
// A preflight (OPTIONS with Origin and Access-Control-Request-Method)
// from a listed origin is answered 204 with the methods (GET, POST,
// DELETE) and the request headers MCP clients send (Content-Type, Accept,
// Authorization, Mcp-Session-Id, MCP-Protocol-Version, Last-Event-ID);
// every other response to a listed origin carries
// Access-Control-Allow-Origin and exposes Mcp-Session-Id,
// MCP-Protocol-Version and WWW-Authenticate to the script. A preflight
// from any other origin is 403, as its request would be; without
// AllowedOrigins, that is every origin (the loopback and same-host
// origins the Handler then accepts are not given CORS). An OPTIONS that
// is not a preflight gets 204 with Allow.
func (h *Handler) CORS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		listed := origin != "" && slices.Contains(h.opts.AllowedOrigins, origin)
		if r.Method == http.MethodOptions {
			if origin == "" || r.Header.Get("Access-Control-Request-Method") == "" {
				w.Header().Set("Allow", "GET, POST, DELETE, OPTIONS")
				w.WriteHeader(http.StatusNoContent)
				return
			}
			if status, msg := h.checkOrigin(r); status != 0 {
				http.Error(w, msg, status)
				return
			}
			if !listed {
				http.Error(w, fmt.Sprintf("Forbidden: Origin %q is not allowed cross-origin", origin), http.StatusForbidden)
				return
			}
			hdr := w.Header()
			hdr.Set("Access-Control-Allow-Origin", origin)
			hdr.Set("Access-Control-Allow-Methods", corsMethods)
			hdr.Set("Access-Control-Allow-Headers", corsHeaders)
			hdr.Set("Access-Control-Max-Age", corsMaxAge)
			hdr.Set("Vary", "Origin, Access-Control-Request-Method, Access-Control-Request-Headers")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if listed {
			hdr := w.Header()
			hdr.Set("Access-Control-Allow-Origin", origin)
			hdr.Set("Access-Control-Expose-Headers", corsExpose)
			hdr.Add("Vary", "Origin")
		}
		next.ServeHTTP(w, r)
	})
}
