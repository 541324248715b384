package relay

import (
	"context"
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
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
		writeUnavailable(w, err)
		return
	}
	if s == nil {
		httpError(w, http.StatusNotFound, "Not Found: unknown or expired session; initialize a new one")
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
		h.forwardOneWay(w, r, s, body, msgs)
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
		h.passThrough(w, r, body)
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
	authz := r.Header.Get("Authorization")
	resp, err := h.upstreamRequest(r.Context(), http.MethodPost, "", "", authz, body, "")
	if err != nil {
		writeJSONError(w, http.StatusBadGateway, m.ID, -32603, "backend unavailable: "+err.Error())
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		copyResponse(w, resp)
		return
	}
	res, err := firstResponse(resp, m.ID)
	if err != nil {
		writeJSONError(w, http.StatusBadGateway, m.ID, -32603, "backend initialize: "+err.Error())
		return
	}
	var out struct {
		Result *struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
	}
	if err := json.Unmarshal(res, &out); err != nil || out.Result == nil {
		// An error response: no session.
		writeJSON(w, http.StatusOK, res)
		return
	}
	version := out.Result.ProtocolVersion
	if !slices.Contains(legacyVersions, version) {
		writeJSONError(w, http.StatusBadGateway, m.ID, -32603, "backend negotiated unsupported protocol version "+version)
		return
	}
	upstream := resp.Header.Get(headerSessionID)
	s, err := h.createSession(r, version, m.Params, upstream, authz)
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, m.ID, -32603, "creating session: "+err.Error())
		return
	}
	w.Header().Set(headerSessionID, s.id)
	writeJSON(w, http.StatusOK, res)
}

func (h *Handler) createSession(r *http.Request, version string, params json.RawMessage, upstream, authz string) (*session, error) {
	s := &session{
		id:          newSessionID(),
		principal:   principal(r),
		version:     version,
		authz:       authz,
		incarnation: 1,
		upstream:    upstream,
	}
	s.touch()
	rec := &eventlog.Session{
		ID:               s.id,
		Principal:        s.principal,
		ProtocolVersion:  version,
		InitializeParams: params, // the store keeps its own copy
		Incarnation:      1,
		Upstream:         upstream,
		Created:          time.Now(),
	}
	if err := h.store.CreateSession(r.Context(), rec); err != nil {
		return nil, err
	}
	st, err := h.newStream(r.Context(), s, 1, true, nil)
	if err != nil {
		h.store.DeleteSession(context.WithoutCancel(r.Context()), s.id)
		return nil, err
	}
	s.standalone = st
	h.mu.Lock()
	h.sessions[s.id] = s
	h.mu.Unlock()
	return s, nil
}

// forwardOneWay forwards notifications and responses; the client gets 202.
func (h *Handler) forwardOneWay(w http.ResponseWriter, r *http.Request, s *session, body []byte, msgs []message) {
	gen, upstream := s.current()
	err := h.notifyUpstream(r.Context(), upstream, s.version, s.authz, body)
	if errors.Is(err, errUpstreamSessionLost) {
		// What was addressed to the lost backend session cannot be
		// delivered to its successor (a response to a request that no
		// longer exists); re-create the backend so the session goes on.
		h.log.Warn("dropping one-way messages for a lost backend session", logSession, s.id)
		if err := h.reincarnate(s, gen); err != nil {
			httpError(w, http.StatusBadGateway, "backend unavailable")
			return
		}
		err = nil
	}
	if err != nil {
		httpError(w, http.StatusBadGateway, "backend: "+err.Error())
		return
	}
	for _, m := range msgs {
		if m.Method == "notifications/initialized" {
			s.mu.Lock()
			if s.genCancel == nil && s.incarnation == gen {
				h.startPumpLocked(s, gen, upstream)
			}
			s.mu.Unlock()
		}
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
	id := string(idKey(p.RequestID))
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

// forwardRequest sends requests upstream and answers with an SSE stream
// fed from the log. The upstream answer is pumped into the log by a
// goroutine that outlives the client's connection.
func (h *Handler) forwardRequest(w http.ResponseWriter, r *http.Request, s *session, body []byte, ids []json.RawMessage) {
	var (
		resp     *http.Response
		gen      uint64
		upstream string
		err      error
	)
	// The backend request lives as long as its stream's pump, not as long
	// as the client's connection (legacy era: disconnection is not
	// cancellation); endSession and retire cancel it.
	pctx, cancel := context.WithCancel(h.ctx)
	for try := 0; try < 2; try++ {
		gen, upstream = s.current()
		resp, err = h.upstreamRequest(pctx, http.MethodPost, upstream, s.version, s.authz, body, "")
		if err != nil {
			break
		}
		if resp.StatusCode != http.StatusNotFound {
			break
		}
		// The backend lost the session before it saw this request: re-create
		// it, then send the request to the new incarnation.
		resp.Body.Close()
		if err = h.reincarnate(s, gen); err != nil {
			break
		}
	}
	if err != nil {
		cancel()
		writeJSONErrors(w, http.StatusBadGateway, ids, resume.CodeRequestLost, "mcprelay: backend unavailable: "+err.Error())
		return
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer resp.Body.Close()
		copyResponse(w, resp)
		return
	}
	st, err := h.newStream(r.Context(), s, gen, false, ids)
	if err != nil {
		resp.Body.Close()
		cancel()
		writeJSONErrors(w, http.StatusInternalServerError, ids, -32603, "mcprelay: event log: "+err.Error())
		return
	}
	st.cancel = cancel
	s.mu.Lock()
	switch {
	case s.closed:
		// Deleted or expired while we sent: nobody will read the answer.
		s.mu.Unlock()
		resp.Body.Close()
		cancel()
		httpError(w, http.StatusNotFound, "Not Found: the session ended")
		return
	case s.incarnation != gen:
		// Re-created while we sent: this request went to a dead backend.
		s.mu.Unlock()
		h.loseStream(st, resume.ReasonBackendLost, "mcprelay: request lost: the backend session was re-created")
	default:
		if s.inflight == nil {
			s.inflight = make(map[*stream]struct{})
		}
		s.inflight[st] = struct{}{}
		s.mu.Unlock()
		go h.pumpRequest(pctx, st, resp, upstream)
	}
	h.serveStream(w, r, s, resume.Tail(st.key, st.gen, 0), primes(s))
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

func writeJSONErrors(w http.ResponseWriter, status int, ids []json.RawMessage, code int, msg string) {
	if len(ids) == 1 {
		writeJSONError(w, status, ids[0], code, msg)
		return
	}
	b := []byte{'['}
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, errorResponse(id, code, msg, "")...)
	}
	writeJSON(w, status, append(b, ']'))
}

// copyResponse passes a backend's non-200 answer through.
func copyResponse(w http.ResponseWriter, resp *http.Response) {
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	copyBody(w, resp.Body, 1<<20)
}
