package relay

import (
	"context"
	"net/http"
	"strings"
	"time"
)

// exchange wraps the ResponseWriter of one request to the MCP endpoint and
// notes what the access log and the request metrics report: the status,
// the body bytes written, and the JSON-RPC messages of a POST.
type exchange struct {
	http.ResponseWriter
	status int
	bytes  int64
	msgs   []message // of a POST, once parsed
}

func (x *exchange) WriteHeader(code int) {
	if x.status == 0 && code >= 200 {
		x.status = code
	}
	x.ResponseWriter.WriteHeader(code)
}

func (x *exchange) Write(b []byte) (int, error) {
	if x.status == 0 {
		x.status = http.StatusOK
	}
	n, err := x.ResponseWriter.Write(b)
	x.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the connection (flushes,
// deadlines).
func (x *exchange) Unwrap() http.ResponseWriter { return x.ResponseWriter }

// noteMessages records the JSON-RPC messages of the POST answered through
// w, for the access log and the method label.
func noteMessages(w http.ResponseWriter, msgs []message) {
	if x, ok := w.(*exchange); ok {
		x.msgs = msgs
	}
}

// requestKind is the kind label of a request to the MCP endpoint, "" for
// requests whose duration is not measured (a standalone GET lasts as long
// as the client listens).
func requestKind(r *http.Request) string {
	switch r.Method {
	case http.MethodPost:
		return kindPOST
	case http.MethodDelete:
		return kindDELETE
	case http.MethodGet:
		if r.Header.Get(headerLastEventID) != "" {
			return kindResume
		}
	}
	return ""
}

// finish records a request that began at start: its duration in the
// request metrics and, if enabled, its access log line.
func (h *Handler) finish(x *exchange, r *http.Request, start time.Time) {
	d := time.Since(start)
	if kind := requestKind(r); kind != "" {
		h.metrics.requestDuration.WithLabelValues(kind, methodLabel(x.msgs)).Observe(d.Seconds())
	}
	if h.opts.AccessLog == nil {
		return
	}
	level := h.opts.AccessLog.Level()
	ctx := context.WithoutCancel(r.Context())
	if !h.log.Enabled(ctx, level) {
		return
	}
	sid := r.Header.Get(headerSessionID)
	if sid == "" {
		sid = x.Header().Get(headerSessionID) // minted by this initialize
	}
	status := x.status
	if status == 0 {
		status = http.StatusOK // nothing written: net/http sends 200
	}
	h.log.Log(ctx, level, "request",
		"method", r.Method,
		"rpc", rpcNames(x.msgs),
		logSession, sessionTag(sid),
		logStatus, status,
		"duration", d,
		"bytes", x.bytes)
}

// sessionTag is the short tag of a session ID that the access log shows:
// its first 6 characters, enough to tell sessions apart and find them in
// other log lines, never the whole ID (which with the principal grants
// access to the session).
func sessionTag(id string) string {
	const n = 6
	if len(id) <= n {
		return id
	}
	return id[:n]
}

// rpcNames lists the JSON-RPC methods of msgs for the access log
// ("response" for a client's response), bounded in length.
func rpcNames(msgs []message) string {
	var b strings.Builder
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		if m.Method == "" {
			b.WriteString("response")
		} else {
			b.WriteString(m.Method)
		}
		if b.Len() > 64 {
			break
		}
	}
	return clip(b.String())
}
