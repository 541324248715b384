package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
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
		h.log.Error("reading a session from the store", logSession, id, "err", err)
		return nil, fmt.Errorf("%w: event log: %v", errUnavailable, err)
	}
	if rec.Principal != principal(r) {
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
		authz:     r.Header.Get("Authorization"),
		replay:    rec.Replay,
	}
	s.touch()
	ictx, icancel := context.WithTimeout(h.ctx, 30*time.Second)
	defer icancel()
	previous := rec.Upstream
	gen, upstream, st, err := h.nextIncarnation(ictx, s, rec)
	if err != nil {
		h.log.Error("restoring a session: re-creating its backend", logSession, id, "err", err)
		return nil, fmt.Errorf("%w: re-creating its backend: %v", errUnavailable, err)
	}
	if previous != "" {
		go h.deleteUpstream(previous, s.version, s.authz) // the previous incarnation's, if it still exists
	}
	h.sealStored(ictx, s, gen)
	s.mu.Lock()
	s.incarnation = gen
	s.upstream = upstream
	s.standalone = st
	h.startPumpLocked(s, gen, upstream)
	s.mu.Unlock()
	h.mu.Lock()
	h.sessions[id] = s
	h.mu.Unlock()
	h.counts.add("restore")
	h.log.Info("session restored from the store", logSession, id, "incarnation", gen)
	return s, nil
}

// sealStored ends the unfinished streams of older incarnations that the
// store holds for s (their writer is gone).
func (h *Handler) sealStored(ctx context.Context, s *session, gen uint64) {
	sts, err := h.store.Streams(ctx, s.id)
	if err != nil {
		h.log.Error("listing a restored session's streams", logSession, s.id, "err", err)
		return
	}
	for _, rec := range sts {
		if rec.Terminal || rec.Generation >= gen {
			continue
		}
		key, err := parseStreamKey(rec.Key)
		if err != nil {
			continue
		}
		st := &stream{key: key, skey: rec.Key, sess: s, gen: rec.Generation, standalone: rec.RequestID == nil, wake: make(chan struct{}, 1)}
		if st.standalone {
			h.appendEvents(st, true, eventlog.Event{Type: resume.EventReset,
				Data: resume.Reset{Reason: resume.ReasonGenerationChanged, Stream: rec.Key, Generation: rec.Generation}.Marshal()})
			continue
		}
		st.pending = make(map[string]json.RawMessage)
		for _, id := range requestIDs(rec.RequestID) {
			st.pending[string(id)] = id
		}
		h.loseStream(st, resume.ReasonBackendLost, "mcprelay: request lost: the relay restarted before its response")
	}
}

// requestIDs decodes a stream record's RequestID: one id, or a batch's
// array of ids.
func requestIDs(raw json.RawMessage) []json.RawMessage {
	raw = idKey(raw)
	if len(raw) > 0 && raw[0] == '[' {
		var ids []json.RawMessage
		if json.Unmarshal(raw, &ids) == nil {
			for i := range ids {
				ids[i] = idKey(ids[i])
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
// set (DESIGN.md §6).
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
	rec, err := h.store.Session(ctx, s.id)
	if err != nil {
		return
	}
	rec.Replay = kept
	if err := h.store.UpdateSession(ctx, rec); err != nil {
		h.log.Error("recording a state-setting request", logSession, s.id, "err", err)
	}
}

// replayState sends the recorded state-setting requests to a new backend
// session, each under a relay-owned id, and waits for their answers.
func (h *Handler) replayState(ctx context.Context, s *session, upstream string) error {
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
		resp, err := h.upstreamRequest(ctx, http.MethodPost, upstream, s.version, s.authz, body, "")
		if err != nil {
			return err
		}
		_, err = firstResponse(resp, id)
		resp.Body.Close()
		if err != nil {
			h.log.Warn("replaying a state-setting request", logSession, s.id, "err", err)
		}
	}
	return nil
}

func parseStreamKey(s string) (resume.StreamKey, error) { return resume.ParseStreamKey(s) }
