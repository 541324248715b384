package backend

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// ErrAnswerBroken reports a backend answer that broke off after it had
// begun: the caller must cut its client's connection too (panic with
// http.ErrAbortHandler), never end the answer as if it were complete.
var ErrAnswerBroken = errors.New("backend: the answer broke off")

// ServeStateless passes a stateless (2026-07-28) request through to the
// backend's stateless endpoint and streams the answer back. The request's
// headers go with it, but for hop-by-hop ones (those the Connection header
// names too), those Upstream.Header replaces, and Mcp-Session-Id and
// Last-Event-ID: a stateless request has no session, and the backend's
// sessions and streams are the relay's sessions', under names no client
// may address (where the stateless endpoint is the session endpoint, a
// guessed name would reach another client's session). The relay removes
// the client's Authorization first unless it was asked to forward it. The
// client
// closing its connection cancels the backend request, as that revision
// requires. No session, no event IDs, nothing logged: a backend that
// cannot be reached gets the client a 502 with a generic JSON-RPC error,
// and the cause (which names the backend's URL) is returned for the
// caller to log. The backend's Mcp-Session-Id, if it sends one, is not
// passed on.
func (u *Upstream) ServeStateless(w http.ResponseWriter, r *http.Request, body []byte) error {
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, u.Stateless(), bytes.NewReader(body))
	if err != nil {
		writeUnreachable(w)
		return err
	}
	named := connectionTokens(r.Header)
	for k, vs := range r.Header {
		ck := http.CanonicalHeaderKey(k)
		if hopByHop[ck] || named[ck] || ck == headerSessionID || ck == canonicalLastEventID {
			continue
		}
		req.Header[k] = vs
	}
	u.setHeader(req.Header)
	resp, err := u.HTTPClient().Do(req)
	if err != nil {
		if r.Context().Err() != nil {
			return nil // the client left
		}
		writeUnreachable(w)
		return err
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		if hopByHop[http.CanonicalHeaderKey(k)] || k == "Content-Length" || http.CanonicalHeaderKey(k) == headerSessionID {
			continue
		}
		w.Header()[k] = vs
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(resp.StatusCode)
	if err := CopyFlushing(w, resp.Body, 32<<10); err != nil && r.Context().Err() == nil {
		return fmt.Errorf("%w: %w", ErrAnswerBroken, err)
	}
	return nil
}

// writeUnreachable answers a stateless request the backend did not get.
func writeUnreachable(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	io.WriteString(w, `{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"backend unavailable"}}`)
}

// connectionTokens returns the header names h's Connection header lists:
// hop-by-hop headers of that request (RFC 9110, 7.6.1).
func connectionTokens(h http.Header) map[string]bool {
	var named map[string]bool
	for _, v := range h["Connection"] {
		for t := range strings.SplitSeq(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				if named == nil {
					named = make(map[string]bool)
				}
				named[http.CanonicalHeaderKey(t)] = true
			}
		}
	}
	return named
}

// canonicalLastEventID is Last-Event-ID as http.Header spells it.
var canonicalLastEventID = http.CanonicalHeaderKey(headerLastEventID)

var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Host": true,
	"Content-Length": true, "Accept-Encoding": true,
}

// CopyFlushing streams body to w, flushing after each read of at most size
// bytes. It returns the error that ended the body (nil at its end) or the
// write error, so that a caller can cut its own client off (panic with
// http.ErrAbortHandler) instead of ending a broken stream as if complete.
func CopyFlushing(w http.ResponseWriter, body io.Reader, size int) error {
	rc := http.NewResponseController(w)
	buf := make([]byte, size)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			rc.Flush()
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
