package relay

import (
	"bytes"
	"io"
	"net/http"
)

// passThrough serves a stateless (2026-07-28) request: forwarded as is to
// the backend's stateless endpoint, the answer streamed back. The client
// closing its connection cancels the upstream request, as that revision
// requires. No session, no event IDs, nothing logged.
func (h *Handler) passThrough(w http.ResponseWriter, r *http.Request, body []byte) {
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, h.up.Stateless(), bytes.NewReader(body))
	if err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	for k, vs := range r.Header {
		if hopByHop[http.CanonicalHeaderKey(k)] {
			continue
		}
		req.Header[k] = vs
	}
	resp, err := h.up.HTTPClient().Do(req)
	if err != nil {
		writeJSONError(w, http.StatusBadGateway, nil, -32603, "backend unavailable: "+err.Error())
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		if hopByHop[http.CanonicalHeaderKey(k)] || k == "Content-Length" {
			continue
		}
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	copyBody(w, resp.Body, 32<<10)
}

var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Host": true,
	"Content-Length": true, "Accept-Encoding": true,
}

// copyBody streams body to w, flushing after each read.
func copyBody(w http.ResponseWriter, body io.Reader, size int) {
	rc := http.NewResponseController(w)
	buf := make([]byte, size)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			rc.Flush()
		}
		if err != nil {
			return
		}
	}
}
