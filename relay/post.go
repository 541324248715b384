package relay

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/internal/wire"
	"github.com/mcprelay/mcprelay/resume"
)

func (h *Handler) servePOST(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(headerLastEventID) != "" {
		httpError(w, http.StatusBadRequest, "Bad Request: Last-Event-ID is not allowed on POST; resume with GET")
		return
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		httpError(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json")
		return
	}
	body, ok := h.readBody(w, r)
	if !ok {
		return
	}
	msgs, batch, err := parseMessages(body)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, nil, -32700, "Parse error: "+err.Error())
		return
	}
	noteMessages(w, msgs)
	sid := r.Header.Get(headerSessionID)
	if sid == "" {
		h.postWithoutSession(w, r, body, msgs, batch)
		return
	}
	jsonOK, sseOK := accepts(r)
	if !jsonOK || !sseOK {
		httpError(w, http.StatusNotAcceptable, "Accept must list application/json and text/event-stream")
		return
	}
	s, err := h.lookup(r, sid)
	if err != nil {
		writeUnavailable(w)
		return
	}
	if s == nil {
		httpError(w, http.StatusNotFound, "Not Found: unknown or expired session; initialize a new one")
		return
	}
	if s.owner != "" {
		h.forward(w, r, s.owner, body)
		return
	}
	if !h.checkVersion(w, r, s) {
		return
	}
	if batch && s.version != version20250326 {
		httpError(w, http.StatusBadRequest, "Bad Request: JSON-RPC batches are not allowed after protocol 2025-03-26")
		return
	}
	var ids []json.RawMessage
	for i := range msgs {
		m := &msgs[i]
		switch {
		case m.Method == "initialize":
			writeJSONError(w, http.StatusBadRequest, m.ID, -32600, "Invalid Request: the session is already initialized")
			return
		case m.isRequest():
			ids = append(ids, m.ID)
		case m.Method == "notifications/cancelled":
			h.noteCancelled(s, m.Params)
		}
	}
	if len(ids) == 0 {
		h.forwardOneWay(w, r, s, body)
		return
	}
	if !batch && isStateSetting(msgs[0].Method) {
		h.recordState(r.Context(), s, msgs[0], body)
	}
	h.forwardRequest(w, r, s, body, ids)
}

// checkVersion applies the MCP-Protocol-Version rules to a session request:
// missing means 2025-03-26 (accepted); a version the relay does not support
// is a 400. A supported version that differs from the negotiated one is
// accepted on purpose: conformance suite 0.1.16 negotiates 2025-11-25 and
// then sends 2025-03-26 on its SSE scenarios. Behaviour (priming, polling)
// always follows the negotiated version, never the header.
func (h *Handler) checkVersion(w http.ResponseWriter, r *http.Request, s *session) bool {
	v := r.Header.Get(headerProtocolVersion)
	if v == "" || slices.Contains(legacyVersions, v) {
		return true
	}
	httpError(w, http.StatusBadRequest, "Bad Request: unsupported MCP-Protocol-Version "+v+" (supported: "+strings.Join(legacyVersions, ", ")+")")
	return false
}

// postWithoutSession serves initialize (a new legacy session), and passes
// stateless 2026-07-28 requests through.
func (h *Handler) postWithoutSession(w http.ResponseWriter, r *http.Request, body []byte, msgs []message, batch bool) {
	if !batch && msgs[0].Method == "initialize" && msgs[0].isRequest() {
		h.initialize(w, r, body, msgs[0])
		return
	}
	if isModern(r, msgs) {
		sl, ok := h.conn.(backend.Stateless)
		if !ok {
			writeJSONError(w, http.StatusBadRequest, msgs[0].ID, -32600,
				"Invalid Request: this relay's backend serves only session-based MCP (2025-03-26 to 2025-11-25): initialize first")
			return
		}
		if !h.opts.ForwardAuthorization && r.Header.Get("Authorization") != "" {
			r = r.Clone(r.Context())
			r.Header.Del("Authorization")
		}
		if err := sl.ServeStateless(w, r, body); err != nil {
			h.upstreamFailed("stateless request to the backend failed", "", err)
			if errors.Is(err, backend.ErrAnswerBroken) {
				panic(http.ErrAbortHandler) // the backend broke off: so does the client's answer
			}
		}
		return
	}
	httpError(w, http.StatusBadRequest, "Bad Request: Mcp-Session-Id header is required (initialize first)")
}

// isModern reports whether a session-less request belongs to the stateless
// 2026-07-28 revision: its MCP-Protocol-Version header names it (or a later
// one), or it is server/discover.
func isModern(r *http.Request, msgs []message) bool {
	if v := r.Header.Get(headerProtocolVersion); v >= version20260728 {
		return true
	}
	return len(msgs) == 1 && msgs[0].Method == "server/discover"
}

// initialize creates a session: the backend is initialized with the
// client's params, and the relay mints its own session ID.
func (h *Handler) initialize(w http.ResponseWriter, r *http.Request, body []byte, m message) {
	jsonOK, sseOK := accepts(r)
	if !jsonOK || !sseOK {
		httpError(w, http.StatusNotAcceptable, "Accept must list application/json and text/event-stream")
		return
	}
	var p struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	if err := json.Unmarshal(m.Params, &p); err != nil || len(m.Params) == 0 {
		writeJSONError(w, http.StatusBadRequest, m.ID, -32602, "Invalid params: initialize needs params")
		return
	}
	s := &session{
		id:          newSessionID(),
		principal:   h.principal(r),
		authz:       h.forwardedAuthz(r),
		incarnation: 1,
	}
	s.limitKey = h.limits.key(r, s.principal)
	actx, acancel := h.creationContext(r.Context())
	f := h.limits.admit(actx, s.limitKey)
	acancel()
	if f != nil {
		h.metrics.rejected.WithLabelValues(f.reason).Inc()
		if f.err != nil {
			h.log.Error("new session refused: the store cannot tell its size", "err", f.err)
		}
		// Debug: a flood must not flood the log too (the refusals are counted).
		h.log.Debug("new session refused", logReason, f.reason, logStatus, f.status, "remote", r.RemoteAddr)
		writeRefusal(w, f)
		return
	}
	created := false
	defer func() {
		if !created {
			h.limits.release(s.limitKey)
		}
	}()
	bs, res, err := h.openBackend(r.Context(), s, 1, body)
	if err != nil {
		h.writeBackendError(w, []json.RawMessage{m.ID}, err)
		return
	}
	if bs == nil {
		writeJSON(w, http.StatusOK, res) // the backend's error response: no session
		return
	}
	var out struct {
		Result *struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
	}
	json.Unmarshal(res, &out)
	version := ""
	if out.Result != nil {
		version = out.Result.ProtocolVersion
	}
	if !slices.Contains(legacyVersions, version) {
		bs.Close()
		writeJSONError(w, http.StatusBadGateway, m.ID, -32603, "backend negotiated unsupported protocol version "+version)
		return
	}
	s.version = version
	s.backend = bs
	if err := h.createSession(r, s, m.Params); err != nil {
		bs.Close()
		if storeDown(err) {
			h.log.Error("creating a session: the event log takes no writes", "err", err)
			writeUnavailable(w)
			return
		}
		writeJSONError(w, http.StatusInternalServerError, m.ID, -32603, "mcprelay: creating the session failed")
		h.log.Error("creating a session", "err", err)
		return
	}
	created = true
	w.Header().Set(headerSessionID, s.id)
	writeJSON(w, http.StatusOK, res)
}

// createSession records s, whose backend session is open, in the store
// with the client's initialize params, and registers it.
func (h *Handler) createSession(r *http.Request, s *session, params json.RawMessage) error {
	s.touch()
	s.recorded.Store(time.Now().UnixNano()) // Created stands for the first use
	rec := &eventlog.Session{
		ID:               s.id,
		Principal:        s.principal,
		ProtocolVersion:  s.version,
		InitializeParams: params, // the store keeps its own copy
		Incarnation:      1,
		Upstream:         s.backend.Handle(),
		Created:          time.Now(),
	}
	ctx, cancel := h.creationContext(r.Context())
	defer cancel()
	// On failure the record may be in the store even if CreateSession
	// failed (its answer lost): unmake removes it, off the client's path.
	if err := h.store.CreateSession(ctx, rec); err != nil {
		h.unmake(s.id)
		return err
	}
	if h.cluster != nil {
		if err := h.takeLease(ctx, s); err != nil {
			h.unmake(s.id)
			return err
		}
	}
	st, err := h.newStream(ctx, s, 1, true, nil)
	if err != nil {
		h.unmake(s.id)
		return err
	}
	s.standalone = st
	h.mu.Lock()
	h.sessions[s.id] = s
	h.mu.Unlock()
	return nil
}

// creationContext bounds the store calls that create a session (the size
// check, the record, the lease, the standalone stream). With replicas it
// is one lease TTL, as for a request's store calls on a replica that does
// not own the session (storeContext): a replica cut off from the store
// answers 503 then, not after the store client's own timeouts.
func (h *Handler) creationContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if h.cluster == nil {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, h.leaseTTL)
}

// forwardOneWay forwards notifications and responses; the client gets 202.
func (h *Handler) forwardOneWay(w http.ResponseWriter, r *http.Request, s *session, body []byte) {
	gen, bs := s.current()
	err := bs.Notify(r.Context(), body)
	if errors.Is(err, backend.ErrSessionLost) {
		// What was addressed to the lost backend session cannot be
		// delivered to its successor (a response to a request that no
		// longer exists); re-create the backend so the session goes on.
		h.log.Warn("dropping one-way messages for a lost backend session", logSession, s.id)
		if err := h.reincarnate(s, gen); err != nil {
			writeUnavailable(w)
			return
		}
		err = nil
	}
	if err != nil {
		h.writeBackendError(w, nil, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// noteCancelled marks the stream of a request the client cancelled.
func (h *Handler) noteCancelled(s *session, params json.RawMessage) {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil {
		return
	}
	id := wire.MatchKey(wire.IDKey(p.RequestID))
	s.mu.Lock()
	defer s.mu.Unlock()
	for st := range s.inflight {
		st.mu.Lock()
		if _, ok := st.pending[id]; ok {
			st.cancelled = true
		}
		st.mu.Unlock()
	}
}

// forwardRequest sends requests to the backend and answers with an SSE
// stream fed from the log. The backend's reply is pumped into the log by a
// goroutine that outlives the client's connection.
func (h *Handler) forwardRequest(w http.ResponseWriter, r *http.Request, s *session, body []byte, ids []json.RawMessage) {
	var rep backend.Reply
	// The backend call lives as long as its stream's pump, not as long as
	// the client's connection (legacy era: disconnection is not
	// cancellation); endSession and retire cancel it.
	pctx, cancel := h.callContext()
	// The call's stream is in the log before the backend sees the request:
	// a log that takes no writes is a 503 while nothing was sent, so that
	// the client may send the request again without its running twice.
	gen, bs := s.current()
	st, err := h.openCallStream(r, s, gen, ids)
	if err != nil {
		cancel()
		h.writeStreamError(w, s, ids, err)
		return
	}
	for try := 0; try < 2; try++ {
		rep, err = bs.Call(pctx, body, ids)
		if !errors.Is(err, backend.ErrSessionLost) || try == 1 {
			break
		}
		// The backend lost the session before it saw this request:
		// re-create it, then send the request to the new incarnation, on
		// a stream of its generation.
		if rerr := h.reincarnate(s, gen); rerr != nil {
			err = rerr
			break
		}
		go h.discardStream(st)
		gen, bs = s.current()
		if st, err = h.openCallStream(r, s, gen, ids); err != nil {
			cancel()
			h.writeStreamError(w, s, ids, err)
			return
		}
	}
	if err != nil {
		cancel()
		h.writeBackendError(w, ids, err)
		go h.discardStream(st)
		return
	}
	st.cancel = cancel
	s.mu.Lock()
	switch {
	case s.closed:
		// Deleted or expired while we sent: nobody will read the answer.
		s.mu.Unlock()
		rep.Close()
		cancel()
		httpError(w, http.StatusNotFound, "Not Found: the session ended")
		return
	case s.incarnation != gen:
		// Re-created while we sent: this request went to a dead backend.
		s.mu.Unlock()
		rep.Close()
		h.loseStream(st, resume.ReasonBackendLost, "mcprelay: request lost: the backend session was re-created")
	default:
		if s.inflight == nil {
			s.inflight = make(map[*stream]struct{})
		}
		s.inflight[st] = struct{}{}
		s.mu.Unlock()
		h.startPump(pctx, st, rep)
	}
	h.serveStream(w, r, s, resume.Tail(st.key, st.gen, 0), opensCall)
}

// openCallStream creates the stream of a call of ids in generation gen,
// bounded by the session's lease (storeContext).
func (h *Handler) openCallStream(r *http.Request, s *session, gen uint64, ids []json.RawMessage) (*stream, error) {
	ctx, cancel := h.storeContext(r.Context(), s)
	defer cancel()
	return h.newStream(ctx, s, gen, false, ids)
}

// writeStreamError answers requests whose stream could not be created:
// nothing was sent to the backend. A log that takes no writes (a full
// disk, Redis out of reach within the lease) is a 503: the client sends
// the requests again later.
func (h *Handler) writeStreamError(w http.ResponseWriter, s *session, ids []json.RawMessage, err error) {
	if storeDown(err) {
		h.log.Error("a call's stream: the event log takes no writes", logSession, s.id, "err", err)
		writeUnavailable(w)
		return
	}
	h.log.Error("creating a call's stream", logSession, s.id, "err", err)
	writeJSONErrors(w, http.StatusInternalServerError, ids, -32603, "", "mcprelay: the event log failed")
}

// discardStream ends a call's stream that no client has heard of, because
// its requests did not reach the backend there: it is sealed, with the
// requests' lost errors as any sealed call stream has, so that no owner
// finds it open later. It is not counted or logged as a loss: the client
// was answered on its POST. It may wait for the log (appendEvents'
// patience): callers run it in a goroutine, after answering.
func (h *Handler) discardStream(st *stream) {
	st.mu.Lock()
	ids := slices.Collect(maps.Values(st.pending))
	st.mu.Unlock()
	if !h.appendEvents(st, true, lostEvents(st, ids, resume.ReasonBackendLost, "mcprelay: request not sent")...) {
		st.mu.Lock()
		st.done = true
		st.mu.Unlock()
	}
	h.streams.remove(st)
}

// writeBackendError answers a message the backend did not take: its own
// refusal is passed through; a backend that cannot be reached now is a 503
// (Retry-After) or a 502 with a JSON-RPC error per request id (ids may be
// empty). Internal addresses never reach the client.
func (h *Handler) writeBackendError(w http.ResponseWriter, ids []json.RawMessage, err error) {
	var se *backend.StatusError
	var ue *backend.UnavailableError
	switch {
	case errors.As(err, &se):
		// The server's own answer to the client's message.
		if se.Code >= 500 {
			h.upstreamFailed("backend answered with an error status", "", err, logStatus, se.Code)
		} else {
			h.log.Debug("backend refused a message", logStatus, se.Code, "err", err)
		}
		if se.ContentType != "" {
			w.Header().Set("Content-Type", se.ContentType)
		}
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(se.Code)
		w.Write(se.Body)
		return
	case errors.As(err, &ue), errors.Is(err, errRecreationLoop):
		retry := 1
		if ue != nil {
			retry = max(1, int(ue.RetryAfter.Round(time.Second)/time.Second))
		}
		w.Header().Set("Retry-After", strconv.Itoa(retry))
		httpError(w, http.StatusServiceUnavailable, "Service Unavailable: the backend cannot take requests now; retry")
		h.upstreamFailed("backend unavailable", "", err)
		return
	}
	status := http.StatusBadGateway
	if errors.Is(err, backend.ErrTimeout) {
		status = http.StatusGatewayTimeout
	}
	h.upstreamFailed("backend request failed", "", err)
	if len(ids) == 0 {
		httpError(w, status, http.StatusText(status)+": the backend failed")
		return
	}
	msg := "mcprelay: request lost: the backend failed"
	if status == http.StatusGatewayTimeout {
		msg = "mcprelay: request lost: the backend did not answer in time"
	}
	writeJSONErrors(w, status, ids, resume.CodeRequestLost, "", msg)
}

// writeJSON writes a JSON body.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}

// writeJSONError writes one JSON-RPC error response (id may be nil).
func writeJSONError(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string) {
	if id == nil {
		id = json.RawMessage("null")
	}
	writeJSON(w, status, errorResponse(id, code, msg, ""))
}

func writeJSONErrors(w http.ResponseWriter, status int, ids []json.RawMessage, code int, reason resume.Reason, msg string) {
	var b []byte
	if len(ids) != 1 {
		b = append(b, '[')
	}
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, errorResponse(id, code, msg, reason)...)
	}
	if len(ids) != 1 {
		b = append(b, ']')
	}
	writeJSON(w, status, b)
}
