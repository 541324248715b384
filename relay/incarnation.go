package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/internal/wire"
	"github.com/mcprelay/mcprelay/resume"
)

// restore brings back a session that the store holds but this process does
// not: after a restart (disk store), or on another replica (shared store).
// The backend side is re-created as a new incarnation with the client's
// recorded initialize and state-setting requests; streams the previous
// process left unfinished are sealed (a request stream gets the reset
// signal and an error per lost request, the standalone stream a
// generation_changed reset), so that no resume of them can hang. It
// returns nil, nil when the store has no such session or the caller is not
// its principal, and an error wrapping errUnavailable when the session
// exists but cannot be restored now (the store or the backend failed).
func (h *Handler) restore(r *http.Request, id string) (*session, error) {
	ctx := r.Context()
	rec, err := h.store.Session(ctx, id)
	if err != nil {
		if errors.Is(err, eventlog.ErrNotFound) {
			return nil, nil
		}
		h.log.Error("reading a session from the store", logSession, clip(id), "err", err)
		return nil, fmt.Errorf("%w: event log: %v", errUnavailable, err)
	}
	if rec.Principal != h.principal(r) {
		return nil, nil
	}
	if h.expired(rec) {
		// Idle past the timeout while no process held it (a restart, a
		// replica's death): expired, as it would have been here.
		if err := h.store.DeleteSession(ctx, id); err != nil && !errors.Is(err, eventlog.ErrNotFound) {
			h.log.Error("deleting an expired session", logSession, id, "err", err)
		}
		h.log.Info("session ended", logSession, id, logReason, "idle timeout (found in the store)")
		return nil, nil
	}
	// One restore per session at a time; the loser uses the winner's.
	h.mu.Lock()
	if s := h.sessions[id]; s != nil {
		h.mu.Unlock()
		return s, nil
	}
	wait, busy := h.restoring[id]
	if !busy {
		wait = make(chan struct{})
		h.restoring[id] = wait
	}
	h.mu.Unlock()
	if busy {
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %v", errUnavailable, ctx.Err())
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if s := h.sessions[id]; s != nil {
			return s, nil
		}
		return nil, fmt.Errorf("%w: restoring it failed", errUnavailable)
	}
	defer func() {
		h.mu.Lock()
		delete(h.restoring, id)
		h.mu.Unlock()
		close(wait)
	}()

	s := &session{
		id:        rec.ID,
		principal: rec.Principal,
		version:   rec.ProtocolVersion,
		authz:     h.forwardedAuthz(r),
		replay:    rec.Replay,
	}
	s.touch()
	s.recorded.Store(max(rec.LastUsed.UnixNano(), rec.Created.UnixNano()))
	ictx, icancel := context.WithTimeout(h.ctx, 30*time.Second)
	defer icancel()
	if h.cluster != nil {
		err := h.takeLease(ictx, s)
		var held *LeaseHeldError
		if errors.As(err, &held) {
			return h.remoteView(ctx, rec, held.Holder.Owner)
		}
		if err != nil {
			h.log.Error("restoring a session: taking its lease", logSession, id, "err", err)
			return nil, fmt.Errorf("%w: lease: %w", errUnavailable, err)
		}
		// The record may have moved on while another replica owned it.
		if rec, err = h.store.Session(ictx, id); err != nil {
			h.cluster.Release(context.WithoutCancel(ictx), id, s.held.lease)
			if errors.Is(err, eventlog.ErrNotFound) {
				return nil, nil
			}
			return nil, fmt.Errorf("%w: event log: %w", errUnavailable, err)
		}
		s.replay = rec.Replay
	}
	previous := rec.Upstream
	gen, bs, st, err := h.nextIncarnation(ictx, s, rec)
	if err != nil {
		if h.cluster != nil {
			h.cluster.Release(context.WithoutCancel(ictx), id, s.held.lease)
		}
		h.log.Error("restoring a session: re-creating its backend", logSession, id, "err", err)
		return nil, fmt.Errorf("%w: re-creating its backend: %w", errUnavailable, err)
	}
	if previous != "" {
		// The previous incarnation's backend session, if it still exists.
		go h.conn.Discard(context.WithoutCancel(ictx), previous)
	}
	if err := h.sealStored(ictx, s, gen); err != nil {
		bs.Close()
		if h.cluster != nil {
			h.cluster.Release(context.WithoutCancel(ictx), id, s.held.lease)
		}
		h.log.Error("restoring a session: sealing what the previous incarnation left", logSession, id, "err", err)
		return nil, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	s.mu.Lock()
	s.incarnation = gen
	s.backend = bs
	s.standalone = st
	s.mu.Unlock()
	s.limitKey = h.limits.key(r, s.principal)
	h.limits.take(s.limitKey) // counted, never refused: the session exists
	h.mu.Lock()
	h.sessions[id] = s
	h.mu.Unlock()
	h.metrics.restored.Inc()
	h.log.Info("session restored from the store", logSession, id, "incarnation", gen)
	return s, nil
}

// sealStored ends the unfinished streams of older incarnations that the
// store holds for s (their writer is gone). It fails if a stream could not
// be sealed: the session must not be served with a stream that could
// leave a resume waiting forever.
func (h *Handler) sealStored(ctx context.Context, s *session, gen uint64) error {
	sts, err := h.store.Streams(ctx, s.id)
	if err != nil {
		return fmt.Errorf("listing the session's streams: %w", err)
	}
	for _, rec := range sts {
		if rec.Terminal || rec.Generation >= gen {
			continue
		}
		key, err := parseStreamKey(rec.Key)
		if err != nil {
			continue
		}
		st := &stream{key: key, skey: rec.Key, sess: s, gen: rec.Generation, standalone: rec.RequestID == nil}
		if st.standalone {
			h.appendEvents(st, true, eventlog.Event{Type: resume.EventReset,
				Data: resume.Reset{Reason: resume.ReasonGenerationChanged, Stream: rec.Key, Generation: rec.Generation}.Marshal()})
		} else {
			st.pending = make(map[string]json.RawMessage)
			for _, id := range requestIDs(rec.RequestID) {
				st.pending[wire.MatchKey(id)] = id
			}
			h.loseStream(st, resume.ReasonBackendLost, "mcprelay: request lost: the replica or relay serving it stopped before its response")
		}
		if !st.isDone() {
			return fmt.Errorf("sealing stream %s of generation %d failed", rec.Key, rec.Generation)
		}
	}
	return nil
}

// requestIDs decodes a stream record's RequestID: one id, or a batch's
// array of ids.
func requestIDs(raw json.RawMessage) []json.RawMessage {
	raw = wire.IDKey(raw)
	if len(raw) > 0 && raw[0] == '[' {
		var ids []json.RawMessage
		if json.Unmarshal(raw, &ids) == nil {
			for i := range ids {
				ids[i] = wire.IDKey(ids[i])
			}
			return ids
		}
	}
	if len(raw) == 0 {
		return nil
	}
	return []json.RawMessage{raw}
}

// State-setting requests are recorded and replayed to every new backend
// incarnation, so that the client keeps the log level and subscriptions it
// set (docs/design.md, backend re-creation).
const (
	methodSetLevel    = "logging/setLevel"
	methodSubscribe   = "resources/subscribe"
	methodUnsubscribe = "resources/unsubscribe"
)

func isStateSetting(method string) bool {
	return method == methodSetLevel || method == methodSubscribe || method == methodUnsubscribe
}

// recordState notes a state-setting request in s.replay and the store.
func (h *Handler) recordState(ctx context.Context, s *session, m message, raw []byte) {
	var uri struct {
		URI string `json:"uri"`
	}
	json.Unmarshal(m.Params, &uri)
	s.mu.Lock()
	kept := s.replay[:0:0]
	for _, old := range s.replay {
		var o struct {
			Method string `json:"method"`
			Params struct {
				URI string `json:"uri"`
			} `json:"params"`
		}
		json.Unmarshal(old, &o)
		switch {
		case m.Method == methodSetLevel && o.Method == methodSetLevel:
			continue // replaced
		case m.Method != methodSetLevel && o.Method == methodSubscribe && o.Params.URI == uri.URI:
			continue // re-subscribed or unsubscribed
		}
		kept = append(kept, old)
	}
	if m.Method != methodUnsubscribe {
		kept = append(kept, append(json.RawMessage(nil), raw...))
	}
	s.replay = kept
	s.mu.Unlock()
	if err := h.rewriteRecord(ctx, s, func(rec *eventlog.Session) { rec.Replay = kept }); err != nil && !errors.Is(err, eventlog.ErrNotFound) {
		h.log.Error("recording a state-setting request", logSession, s.id, "err", err)
	}
}

// replayState sends the recorded state-setting requests to a new backend
// session, each under a relay-owned id, and waits for their answers.
func (h *Handler) replayState(ctx context.Context, s *session, bs backend.Session) error {
	s.mu.Lock()
	reqs := s.replay
	s.mu.Unlock()
	for i, raw := range reqs {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			continue
		}
		id := json.RawMessage(`"mcprelay-replay-` + strconv.Itoa(i) + `"`)
		m["id"] = id
		body, _ := json.Marshal(m)
		rep, err := bs.Call(ctx, body, []json.RawMessage{id})
		if err != nil {
			return err
		}
		if err := awaitResponse(rep, id); err != nil {
			h.log.Warn("replaying a state-setting request", logSession, s.id, "err", err)
		}
	}
	return nil
}

// awaitResponse reads rep until the response with id, and closes it.
func awaitResponse(rep backend.Reply, id json.RawMessage) error {
	defer rep.Close()
	for {
		data, err := rep.Next()
		var poll *backend.Poll
		switch {
		case errors.As(err, &poll):
			continue
		case err != nil:
			return err
		}
		for _, rid := range wire.ResponseIDs(data, nil) {
			if string(rid) == string(id) {
				return nil
			}
		}
	}
}

func parseStreamKey(s string) (resume.StreamKey, error) { return resume.ParseStreamKey(s) }

// forwardedAuthz is the Authorization a session opened or restored by r
// forwards to its backend: r's with Options.ForwardAuthorization, else none.
func (h *Handler) forwardedAuthz(r *http.Request) string {
	if !h.opts.ForwardAuthorization {
		return ""
	}
	return r.Header.Get("Authorization")
}

// initializedNote is the notification that puts a backend session in
// operation.
var initializedNote = []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)

// initRequestID is the relay's own id for the initialize it sends when it
// re-creates a backend session.
const initRequestID = `"mcprelay-init"`

// openBackend opens a backend session for incarnation gen of s with
// initReq, the client's initialize request (or the relay's replay of it).
// What the backend sends outside any call is logged to s's standalone
// stream while gen is current; the loss of the session re-creates it.
func (h *Handler) openBackend(ctx context.Context, s *session, gen uint64, initReq []byte) (backend.Session, []byte, error) {
	var hdr http.Header
	if s.authz != "" {
		hdr = http.Header{"Authorization": {s.authz}}
	}
	return h.conn.Open(ctx, backend.Init{
		Request:   initReq,
		Header:    hdr,
		Unrelated: func(msg []byte) { h.routeUnrelated(s, gen, msg) },
		Lost: func(err error) {
			h.upstreamFailed("backend session lost", "", err, logSession, s.id, "incarnation", gen)
			go h.reincarnate(s, gen)
		},
		Logger: h.log.With(logSession, s.id),
	})
}

// maxRecreations bounds how often one session's backend side is re-created
// in recreationWindow: a backend that loses every session at once must not
// make the relay re-create it in a loop.
const (
	maxRecreations   = 5
	recreationWindow = time.Minute
)

// errRecreationLoop: the session's backend was lost too often of late.
var errRecreationLoop = errors.New("relay: the backend keeps losing this session; not re-creating it now")

// reincarnate re-creates the backend side of s after its backend session was
// lost, as incarnation gen+1: the client keeps its session. Streams of the
// old incarnation are sealed: request streams get the reset signal and an
// error per lost request; the standalone stream gets a generation_changed
// reset and the session gets a new one. It does nothing if another caller
// already moved s past gen.
func (h *Handler) reincarnate(s *session, gen uint64) error {
	s.reinitMu.Lock()
	defer s.reinitMu.Unlock()
	s.mu.Lock()
	if s.incarnation != gen || s.closed {
		s.mu.Unlock()
		return nil
	}
	now := time.Now()
	recent := s.recreated[:0]
	for _, t := range s.recreated {
		if now.Sub(t) < recreationWindow {
			recent = append(recent, t)
		}
	}
	s.recreated = recent
	s.mu.Unlock()
	if len(recent) >= maxRecreations {
		h.log.Error("not re-creating the backend session", logSession, s.id, "recent", len(recent), "err", errRecreationLoop)
		return errRecreationLoop
	}
	ctx, cancel := context.WithTimeout(h.ctx, 30*time.Second)
	defer cancel()
	// The recorded initialize params live in the store only, not in every
	// idle session's memory.
	rec, err := h.store.Session(ctx, s.id)
	if err != nil {
		return err
	}
	newGen, bs, standalone, err := h.nextIncarnation(ctx, s, rec)
	if err != nil {
		h.log.Error("re-creating the backend session", logSession, s.id, "err", err)
		return err
	}
	s.mu.Lock()
	old := s.inflight
	oldStandalone := s.standalone
	oldBackend := s.backend
	s.inflight = nil
	s.incarnation = newGen
	s.backend = bs
	s.standalone = standalone
	s.recreated = append(s.recreated, now)
	s.mu.Unlock()
	if oldBackend != nil {
		go oldBackend.Close() // abandoned: end it on the backend too
	}
	h.metrics.recreations.Inc()
	h.log.Warn("backend session re-created", logSession, s.id, "incarnation", newGen, "lost_streams", len(old))

	for st := range old {
		h.loseStream(st, resume.ReasonBackendLost, "mcprelay: request lost: the backend session was lost and re-created")
	}
	if oldStandalone != nil {
		h.appendEvents(oldStandalone, true, eventlog.Event{Type: resume.EventReset,
			Data: resume.Reset{Reason: resume.ReasonGenerationChanged, Stream: oldStandalone.skey, Generation: oldStandalone.gen}.Marshal()})
	}
	return nil
}

// nextIncarnation creates a backend session for s from its recorded
// initialize and state-setting requests, records it in the store as
// incarnation rec.Incarnation+1, and creates that incarnation's
// standalone stream. The caller installs them in s.
func (h *Handler) nextIncarnation(ctx context.Context, s *session, rec *eventlog.Session) (gen uint64, bs backend.Session, standalone *stream, err error) {
	gen = rec.Incarnation + 1
	req := []byte(`{"jsonrpc":"2.0","id":` + initRequestID + `,"method":"initialize","params":` + string(rec.InitializeParams) + `}`)
	bs, res, err := h.openBackend(ctx, s, gen, req)
	if err != nil {
		return 0, nil, nil, err
	}
	if bs == nil {
		return 0, nil, nil, fmt.Errorf("relay: the backend refused initialize: %.200s", res)
	}
	fail := func(e error) (uint64, backend.Session, *stream, error) {
		bs.Close()
		return 0, nil, nil, e
	}
	if err := bs.Notify(ctx, initializedNote); err != nil {
		return fail(err)
	}
	// A session listens from its client's first GET on, in every
	// incarnation, here or on the replica that restores it.
	s.mu.Lock()
	s.listening = s.listening || rec.Listening
	listening := s.listening
	s.mu.Unlock()
	if listening {
		bs.Listen()
	}
	if err := h.replayState(ctx, s, bs); err != nil {
		return fail(err)
	}
	rec.Incarnation, rec.Upstream = gen, bs.Handle()
	rec.Listening = listening
	if err := h.store.UpdateSession(ctx, rec); err != nil {
		return fail(fmt.Errorf("recording incarnation %d: %w", gen, err))
	}
	if listening {
		s.mu.Lock()
		s.listenStored = true
		s.mu.Unlock()
	}
	standalone, err = h.newStream(ctx, s, gen, true, nil)
	if err != nil {
		return fail(err)
	}
	return gen, bs, standalone, nil
}

// expired reports whether a stored session has been idle longer than the
// idle timeout, by its recorded last use (or its creation).
func (h *Handler) expired(rec *eventlog.Session) bool {
	timeout := h.opts.SessionIdleTimeout
	if timeout <= 0 {
		return false
	}
	// The record lags the real last use by up to timeout/8.
	return rec.IdleSince(time.Now().Add(-timeout - timeout/8))
}
