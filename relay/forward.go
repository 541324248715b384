package relay

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mcprelay/mcprelay/backend"
)

// headerForwarded marks a request one replica forwarded to the owner of
// its session: "<unix millis>.<MAC>", the MAC (HMAC-SHA256 under a key
// derived from the relay secret) covering the time, the method, the
// session, the caller's principal and a digest of the body. A client
// cannot pose as a replica: a request that carries the header without a
// valid MAC is refused.
const headerForwarded = "Mcprelay-Forwarded"

// forwardSkew bounds the age of a forwarded request's timestamp.
const forwardSkew = 30 * time.Second

// forwardKey derives the key of forwarded-request MACs from the relay
// secret, so that it is never the key of event IDs.
func forwardKey(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("mcprelay-forward-v1"))
	return m.Sum(nil)
}

func (h *Handler) forwardMAC(ts, method, session, principal string, body []byte) string {
	sum := sha256.Sum256(body)
	m := hmac.New(sha256.New, h.fwdKey)
	for _, s := range []string{ts, method, session, principal} {
		m.Write([]byte(s))
		m.Write([]byte{0})
	}
	m.Write(sum[:])
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// errBadForward: a request claims to come from a replica and does not.
var errBadForward = errors.New("relay: forwarded request with an invalid MAC")

// checkForwarded verifies the forwarding header of r, whose body is body:
// forwarded reports whether r comes from another replica.
func (h *Handler) checkForwarded(r *http.Request, body []byte) (forwarded bool, err error) {
	v := r.Header.Get(headerForwarded)
	if v == "" {
		return false, nil
	}
	ts, mac, ok := strings.Cut(v, ".")
	ms, perr := strconv.ParseInt(ts, 10, 64)
	if !ok || perr != nil || h.fwdKey == nil {
		return false, errBadForward
	}
	if d := time.Since(time.UnixMilli(ms)); d > forwardSkew || d < -forwardSkew {
		return false, errBadForward
	}
	method := r.Method
	if r.Header.Get(headerListen) != "" {
		method = methodListen
	}
	want := h.forwardMAC(ts, method, r.Header.Get(headerSessionID), h.principal(r), body)
	if !hmac.Equal([]byte(mac), []byte(want)) {
		return false, errBadForward
	}
	return true, nil
}

// forward sends r (its body already read) to the replica that owns its
// session and streams the answer back, never buffering it whole. A
// request that was itself forwarded is not forwarded again: the client
// retries, and the next replica looks the owner up afresh.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, owner string, body []byte) {
	if isForwarded(r) {
		retryAfter(w, time.Second, "the session is moving between replicas")
		return
	}
	req, owner, err := h.forwardedRequest(r.Context(), r, owner, r.Method, body, forwardedHeaders)
	if err != nil {
		retryAfter(w, time.Second, "the session's owner cannot be reached")
		return
	}
	resp, err := h.peers.Do(req)
	if err != nil {
		if r.Context().Err() == nil {
			h.log.Warn("forwarding to the session's owner", logSession, clip(r.Header.Get(headerSessionID)), "owner", owner, "err", err)
		}
		// The owner is gone or paused: its lease lapses soon, and then
		// any replica takes the session over.
		retryAfter(w, h.leaseTTL, "the session's owner cannot be reached")
		return
	}
	defer resp.Body.Close()
	for _, k := range []string{"Content-Type", "Cache-Control", "X-Accel-Buffering", headerSessionID, "Retry-After", "Allow", "X-Content-Type-Options"} {
		if v := resp.Header.Values(k); len(v) > 0 {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	h.metrics.forwarded.Inc()
	if err := backend.CopyFlushing(w, resp.Body, 32<<10); err != nil && r.Context().Err() == nil {
		// The owner died mid-answer: cut the client off as the owner's
		// connection was cut, so that it resumes; a clean end would say
		// the stream is complete.
		panic(http.ErrAbortHandler)
	}
}

// forwardedHeaders are the client's headers a forwarded request carries.
var forwardedHeaders = []string{"Content-Type", "Accept", headerSessionID, headerProtocolVersion, "Authorization", "Origin"}

// forwardedRequest is r, with body and the headers of r named in keys,
// addressed to the replica owner (a lease owner: its per-process nonce is
// cut off, and returned so) and marked as forwarded, the MAC made over
// macMethod (r.Method, or methodListen for a listen signal).
func (h *Handler) forwardedRequest(ctx context.Context, r *http.Request, owner, macMethod string, body []byte, keys []string) (*http.Request, string, error) {
	owner, _, _ = strings.Cut(owner, "#")
	req, err := http.NewRequestWithContext(ctx, r.Method, owner, bytes.NewReader(body))
	if err != nil {
		return nil, owner, err
	}
	for _, k := range keys {
		if v := r.Header.Values(k); len(v) > 0 {
			req.Header[k] = v
		}
	}
	ts := strconv.FormatInt(time.Now().UnixMilli(), 10)
	req.Header.Set(headerForwarded, ts+"."+h.forwardMAC(ts, macMethod, r.Header.Get(headerSessionID), h.principal(r), body))
	return req, owner, nil
}

type forwardedKey struct{}

// isForwarded reports whether r came from another replica (verified).
func isForwarded(r *http.Request) bool {
	v, _ := r.Context().Value(forwardedKey{}).(bool)
	return v
}

func withForwarded(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), forwardedKey{}, true))
}
