package relay

import (
	"errors"
	"math"
	"net/http"
	"strconv"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/resume"
)

func (h *Handler) serveGET(w http.ResponseWriter, r *http.Request) {
	if isForwarded(r) && r.Header.Get(headerListen) != "" {
		h.serveListen(w, r)
		return
	}
	if _, sseOK := accepts(r); !sseOK {
		httpError(w, http.StatusNotAcceptable, "Accept must list text/event-stream")
		return
	}
	sid := r.Header.Get(headerSessionID)
	lei := r.Header.Get(headerLastEventID)
	if sid == "" && r.Header.Get(headerProtocolVersion) >= version20260728 {
		w.Header().Set("Allow", "POST")
		httpError(w, http.StatusMethodNotAllowed, "Method Not Allowed: protocol "+version20260728+" has no GET stream")
		return
	}
	if lei == "" {
		h.serveStandalone(w, r, sid)
		return
	}
	var s *session
	if sid != "" {
		var err error
		if s, err = h.lookup(r, sid); err != nil {
			writeUnavailable(w)
			return
		}
	}
	if s != nil && !h.checkVersion(w, r, s) {
		return
	}
	if s != nil && h.listen(r, s) != nil {
		writeUnavailable(w)
		return
	}
	in := resume.Input{HasSessionHeader: sid != ""}
	if s != nil {
		gen, _ := s.current()
		in.Session = &resume.Session{ID: s.id, Incarnation: gen}
		in.Cursor, in.CursorErr = h.codec.Parse(lei)
		if in.CursorErr == nil {
			ctx, cancel := h.storeContext(r.Context(), s)
			rec, _, err := h.store.Read(ctx, in.Cursor.Stream.String(), math.MaxUint64, 0, nil)
			cancel()
			switch {
			case err == nil:
				in.Stream = &resume.Stream{
					Session:    rec.Session,
					Generation: rec.Generation,
					Standalone: rec.RequestID == nil,
					FirstSeq:   rec.FirstSeq,
					LastSeq:    rec.LastSeq,
					Terminal:   rec.Terminal,
				}
			case !errors.Is(err, eventlog.ErrNotFound):
				// The store's error may name internal addresses: logged,
				// not sent.
				h.log.Error("resume: reading the cursor's stream", logSession, s.id, "err", err)
				writeUnavailable(w)
				return
			}
		}
	}
	d := resume.Decide(in)
	h.metrics.resumeDecisions.WithLabelValues(strconv.Itoa(d.Status), string(d.Outcome)).Inc()
	attrs := []any{logSession, clip(sid), logCursor, clip(lei), logRow, d.Row, logStatus, d.Status, logReason, d.Outcome}
	switch {
	case d.Status == http.StatusConflict:
		h.log.Warn("tenant isolation: cursor of another session's stream", attrs...)
	case d.Status >= 400:
		h.log.Info("resume rejected", attrs...)
	default:
		h.log.Debug("resume", attrs...)
	}
	switch d.Status {
	case http.StatusBadRequest:
		httpError(w, d.Status, "Bad Request: "+rejectText[d.Outcome])
		return
	case http.StatusNotFound:
		httpError(w, d.Status, "Not Found: unknown or expired session; initialize a new one")
		return
	case http.StatusConflict:
		httpError(w, d.Status, "Conflict: Last-Event-ID belongs to another session")
		return
	case http.StatusNoContent:
		w.WriteHeader(http.StatusNoContent)
		return
	}
	h.serveStream(w, r, s, d.Plan, resumesStream)
}

// serveStandalone serves a GET without Last-Event-ID: a new standalone
// stream, what no connection has been given yet, then live. It is not a
// resume (every mcp-remote start sends one, some without a session):
// counted on its own, and its refusals logged at debug only.
func (h *Handler) serveStandalone(w http.ResponseWriter, r *http.Request, sid string) {
	status := func(code int) {
		h.metrics.plainGETs.WithLabelValues(strconv.Itoa(code)).Inc()
		if code != http.StatusOK {
			h.log.Debug("GET without Last-Event-ID refused", logSession, clip(sid), logStatus, code)
		}
	}
	if sid == "" {
		status(http.StatusBadRequest)
		httpError(w, http.StatusBadRequest, "Bad Request: Mcp-Session-Id header is required")
		return
	}
	s, err := h.lookup(r, sid)
	switch {
	case err != nil:
		status(http.StatusServiceUnavailable)
		writeUnavailable(w)
		return
	case s == nil:
		status(http.StatusNotFound)
		httpError(w, http.StatusNotFound, "Not Found: unknown or expired session; initialize a new one")
		return
	case !h.checkVersion(w, r, s):
		status(http.StatusBadRequest)
		return
	}
	if h.listen(r, s) != nil {
		status(http.StatusServiceUnavailable)
		writeUnavailable(w)
		return
	}
	status(http.StatusOK)
	s.mu.Lock()
	st := s.standalone
	s.mu.Unlock()
	st.mu.Lock()
	from := st.delivered
	st.mu.Unlock()
	h.serveStream(w, r, s, resume.Tail(st.key, st.gen, from), opensStream)
}

var rejectText = map[resume.Outcome]string{
	resume.OutcomeMissingSession:  "Mcp-Session-Id header is required",
	resume.OutcomeMalformedCursor: "Last-Event-ID is malformed",
	resume.OutcomeForgedCursor:    "Last-Event-ID was not issued by this relay",
	resume.OutcomeFutureCursor:    "Last-Event-ID names a generation its stream never had",
}

func (h *Handler) serveDELETE(w http.ResponseWriter, r *http.Request) {
	sid := r.Header.Get(headerSessionID)
	if sid == "" {
		httpError(w, http.StatusBadRequest, "Bad Request: Mcp-Session-Id header is required")
		return
	}
	s, err := h.lookup(r, sid)
	if err != nil {
		writeUnavailable(w)
		return
	}
	if s == nil {
		httpError(w, http.StatusNotFound, "Not Found: unknown or expired session")
		return
	}
	if s.owner != "" {
		h.forward(w, r, s.owner, nil)
		return
	}
	// The store first: a session the store cannot delete lives on (it
	// would come back after a restart), and the client must hear so.
	ctx, cancel := h.storeContext(r.Context(), s)
	err = h.store.DeleteSession(ctx, s.id)
	cancel()
	if err != nil && !errors.Is(err, eventlog.ErrNotFound) {
		h.log.Error("deleting a session from the store", logSession, s.id, "err", err)
		writeUnavailable(w)
		return
	}
	h.endSession(s, "deleted by the client")
	w.WriteHeader(http.StatusNoContent)
}
