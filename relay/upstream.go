package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
)

// errUpstreamSessionLost reports that the backend answered 404 for its
// session: the backend side must be re-created.
var errUpstreamSessionLost = errors.New("relay: backend session lost")

// maxUpstreamMessage bounds one message read from the backend.
const maxUpstreamMessage = 16 << 20

// upstreamRequest sends one request to the backend for session s's
// current incarnation (upstream handle given).
func (h *Handler) upstreamRequest(ctx context.Context, method, upstream, version, authz string, body []byte, lastEventID string) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.up.URL, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
	} else {
		req.Header.Set("Accept", "text/event-stream")
	}
	if upstream != "" {
		req.Header.Set(headerSessionID, upstream)
	}
	if version != "" {
		req.Header.Set(headerProtocolVersion, version)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	if lastEventID != "" {
		req.Header.Set(headerLastEventID, lastEventID)
	}
	return h.up.HTTPClient().Do(req)
}

// readMessages calls fn with each JSON-RPC payload of an upstream response,
// a JSON body or an SSE stream, until fn returns false or the body ends.
// It returns the last SSE event ID and retry seen; err is nil at a clean
// end of the body.
func readMessages(resp *http.Response, fn func(data []byte) bool) (lastID string, retry time.Duration, err error) {
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if ct != "text/event-stream" {
		data, err := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamMessage))
		if err != nil {
			return "", 0, err
		}
		if len(bytes.TrimSpace(data)) > 0 {
			fn(data)
		}
		return "", 0, nil
	}
	sc := sse.NewScanner(resp.Body)
	sc.MaxEventBytes = maxUpstreamMessage
	for {
		ev, err := sc.Next()
		if ev.Retry > 0 {
			retry = ev.Retry
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return sc.LastEventID(), retry, err
		}
		if len(ev.Data) == 0 || (ev.Type != "" && ev.Type != "message") {
			continue
		}
		if !fn(ev.Data) {
			return sc.LastEventID(), retry, nil
		}
	}
}

// firstResponse reads an upstream answer until the response with id.
func firstResponse(resp *http.Response, id json.RawMessage) ([]byte, error) {
	var out []byte
	_, _, err := readMessages(resp, func(data []byte) bool {
		for _, rid := range responseIDs(data, nil) {
			if bytes.Equal(rid, id) {
				out = data
				return false
			}
		}
		return true
	})
	if out == nil && err == nil {
		err = errors.New("relay: backend ended its answer without a response")
	}
	return out, err
}

// initUpstream creates a backend session: initialize with the client's
// recorded params, then notifications/initialized. It returns the backend's
// session handle and the initialize response.
func (h *Handler) initUpstream(ctx context.Context, params json.RawMessage, version, authz string) (string, []byte, error) {
	id := json.RawMessage(`"mcprelay-init"`)
	body := []byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"method":"initialize","params":` + string(params) + `}`)
	resp, err := h.upstreamRequest(ctx, http.MethodPost, "", "", authz, body, "")
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return "", nil, fmt.Errorf("relay: backend initialize: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	res, err := firstResponse(resp, id)
	if err != nil {
		return "", nil, fmt.Errorf("relay: backend initialize: %w", err)
	}
	upstream := resp.Header.Get(headerSessionID)
	if err := h.notifyUpstream(ctx, upstream, version, authz, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil {
		return "", nil, err
	}
	return upstream, res, nil
}

// notifyUpstream POSTs a notification or response and expects 202 (or 200).
func (h *Handler) notifyUpstream(ctx context.Context, upstream, version, authz string, body []byte) error {
	resp, err := h.upstreamRequest(ctx, http.MethodPost, upstream, version, authz, body, "")
	if err != nil {
		return err
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound && upstream != "":
		return errUpstreamSessionLost
	case resp.StatusCode >= 300:
		return fmt.Errorf("relay: backend answered %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

func (h *Handler) deleteUpstream(upstream, version, authz string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(h.ctx), 10*time.Second)
	defer cancel()
	resp, err := h.upstreamRequest(ctx, http.MethodDelete, upstream, version, authz, nil, "")
	if err == nil {
		resp.Body.Close()
	}
}

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
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(h.ctx, 30*time.Second)
	defer cancel()
	// The recorded initialize params live in the store only, not in every
	// idle session's memory.
	rec, err := h.store.Session(ctx, s.id)
	if err != nil {
		return err
	}
	newGen, upstream, standalone, err := h.nextIncarnation(ctx, s, rec)
	if err != nil {
		h.log.Error("re-creating the backend session", logSession, s.id, "err", err)
		return err
	}
	s.mu.Lock()
	old := s.inflight
	oldStandalone := s.standalone
	s.inflight = nil
	s.incarnation = newGen
	s.upstream = upstream
	s.standalone = standalone
	h.startPumpLocked(s, newGen, upstream)
	s.mu.Unlock()
	h.counts.add("reincarnation")
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
// standalone stream. The caller installs them in s and starts the pump.
func (h *Handler) nextIncarnation(ctx context.Context, s *session, rec *eventlog.Session) (gen uint64, upstream string, standalone *stream, err error) {
	upstream, _, err = h.initUpstream(ctx, rec.InitializeParams, s.version, s.authz)
	if err == nil {
		err = h.replayState(ctx, s, upstream)
	}
	if err != nil {
		return 0, "", nil, err
	}
	gen = rec.Incarnation + 1
	rec.Incarnation, rec.Upstream = gen, upstream
	if err := h.store.UpdateSession(ctx, rec); err != nil {
		return 0, "", nil, fmt.Errorf("recording incarnation %d: %w", gen, err)
	}
	standalone, err = h.newStream(ctx, s, gen, true, nil)
	if err != nil {
		return 0, "", nil, err
	}
	return gen, upstream, standalone, nil
}

// startPumpLocked starts the backend GET pump of incarnation gen, ending
// the previous incarnation's. s.mu must be held.
func (h *Handler) startPumpLocked(s *session, gen uint64, upstream string) {
	if s.genCancel != nil {
		s.genCancel()
	}
	ctx, cancel := h.genContext()
	s.genCancel = cancel
	go h.pumpStandalone(ctx, s, gen, upstream)
}

// pumpRequest moves one request's upstream answer into its stream's log
// until the final response. Disconnection of the client does not stop it
// (legacy era: only notifications/cancelled cancels).
func (h *Handler) pumpRequest(ctx context.Context, st *stream, resp *http.Response, upstream string) {
	s := st.sess
	cursor := "" // the backend's last event ID on this stream, kept across failed resumes
	for attempt := 0; ; {
		lastID, retry, err := h.pumpEvents(st, resp)
		resp.Body.Close()
		if lastID != "" {
			cursor = lastID
		}
		st.mu.Lock()
		done, cancelled := st.done, st.cancelled
		st.mu.Unlock()
		if done || ctx.Err() != nil {
			return
		}
		if cancelled {
			h.loseStream(st, resume.ReasonCancelled, "request cancelled")
			return
		}
		if cursor == "" || attempt >= 5 {
			// The backend gave no way to resume its stream: the response
			// can no longer come.
			if err == nil {
				err = errors.New("stream ended without the response")
			}
			h.log.Warn("backend request stream broke", logSession, s.id, logStream, st.skey, "err", err)
			h.loseStream(st, resume.ReasonBackendLost, "mcprelay: request lost: the backend's stream ended before its response")
			if attempt == 0 {
				go h.checkUpstream(s, st.gen)
			}
			return
		}
		if err == nil && retry > 0 {
			// A server-initiated close (polling): carry it to the client.
			st.pollConn(retry)
		}
		attempt++
		wait := retry
		if wait <= 0 {
			wait = time.Duration(attempt) * 100 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(wait, 10*time.Second)):
		}
		r, gerr := h.upstreamRequest(ctx, http.MethodGet, upstream, s.version, s.authz, nil, cursor)
		if gerr == nil {
			h.log.Debug("resuming the backend's request stream", logSession, s.id, logStream, st.skey, logCursor, cursor, logStatus, r.StatusCode)
		}
		if gerr != nil {
			resp = &http.Response{Body: http.NoBody, Header: http.Header{}}
			continue
		}
		if r.StatusCode == http.StatusNotFound {
			r.Body.Close()
			h.reincarnate(s, st.gen) // seals st
			h.loseStream(st, resume.ReasonBackendLost, "mcprelay: request lost: the backend session was lost")
			return
		}
		if r.StatusCode != http.StatusOK {
			r.Body.Close()
			resp = &http.Response{Body: http.NoBody, Header: http.Header{}}
			continue
		}
		resp = r
		if retry > 0 {
			attempt = 0 // polling is not failure
		}
	}
}

// checkUpstream probes whether the backend session of incarnation gen is
// still there (ping); a 404 re-creates it.
func (h *Handler) checkUpstream(s *session, gen uint64) {
	g, upstream := s.current()
	if g != gen {
		return
	}
	ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
	defer cancel()
	resp, err := h.upstreamRequest(ctx, http.MethodPost, upstream, s.version, s.authz,
		[]byte(`{"jsonrpc":"2.0","id":"mcprelay-ping","method":"ping"}`), "")
	if err != nil {
		return
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		h.reincarnate(s, gen)
	}
}

// deliver appends one upstream payload to a request stream; the response
// completing the stream's pending ids carries the terminal marker.
func (h *Handler) deliver(st *stream, data []byte) {
	h.deliverBatch(st, []eventlog.Event{{Data: data}})
}

// deliverBatch appends upstream payloads to a request stream in one
// Append (one fsync with a durable store). The response completing the
// stream's pending ids carries the terminal marker; anything after it is
// dropped. It reports whether the stream is now terminal.
func (h *Handler) deliverBatch(st *stream, evs []eventlog.Event) bool {
	terminal := false
	var idsBuf [1]json.RawMessage
	for i := range evs {
		ids := responseIDs(evs[i].Data, idsBuf[:0])
		if len(ids) == 0 {
			continue
		}
		st.mu.Lock()
		for _, id := range ids {
			delete(st.pending, string(id))
		}
		terminal = !st.standalone && len(st.pending) == 0
		st.mu.Unlock()
		if terminal {
			evs = evs[:i+1]
			break
		}
	}
	h.appendEvents(st, terminal, evs...)
	return terminal
}

// pumpBatch bounds how many upstream messages one Append carries.
const pumpBatch = 128

// pumpEvents moves one upstream answer into a request stream's log until
// its final response or the end of the body. A reader goroutine parses the
// body while this one appends: messages that arrive while an Append (and
// its fsync) is under way go together into the next one, so a stream is
// not held to one fsync per event.
func (h *Handler) pumpEvents(st *stream, resp *http.Response) (lastID string, retry time.Duration, err error) {
	ch := make(chan []byte, pumpBatch)
	stop := make(chan struct{})
	go func() {
		defer close(ch)
		lastID, retry, err = readMessages(resp, func(data []byte) bool {
			select {
			case ch <- data:
				return true
			case <-stop:
				return false
			}
		})
	}()
	batch := make([]eventlog.Event, 0, pumpBatch)
	for data := range ch {
		batch = append(batch[:0], eventlog.Event{Data: data})
	drain:
		for len(batch) < pumpBatch {
			select {
			case d, ok := <-ch:
				if !ok {
					break drain
				}
				batch = append(batch, eventlog.Event{Data: d})
			default:
				break drain
			}
		}
		st.mu.Lock()
		done := st.done
		st.mu.Unlock()
		if done || h.deliverBatch(st, batch) {
			close(stop)
			resp.Body.Close() // unblocks a reader waiting for more
			for range ch {
			}
			break
		}
	}
	return lastID, retry, err // the reader has finished: ch is closed
}

// pumpStandalone keeps the backend's GET stream of incarnation gen open and
// logs what arrives on it to the session's standalone stream (responses to
// in-flight requests go to their request streams).
func (h *Handler) pumpStandalone(ctx context.Context, s *session, gen uint64, upstream string) {
	lastID := ""
	for failures := 0; ctx.Err() == nil; {
		resp, err := h.upstreamRequest(ctx, http.MethodGet, upstream, s.version, s.authz, nil, lastID)
		wait := time.Duration(1<<min(failures, 6)) * 100 * time.Millisecond
		if err == nil {
			switch resp.StatusCode {
			case http.StatusMethodNotAllowed:
				resp.Body.Close()
				return // the server offers no GET stream
			case http.StatusNotFound:
				resp.Body.Close()
				h.reincarnate(s, gen)
				return
			case http.StatusOK:
				failures = 0
				id, retry, _ := readMessages(resp, func(data []byte) bool {
					h.routeStandalone(s, data)
					return true
				})
				resp.Body.Close()
				if id != "" {
					lastID = id
				}
				if retry > 0 {
					wait = retry
				}
			default:
				resp.Body.Close()
			}
		}
		failures++
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(wait, 10*time.Second)):
		}
	}
}

// routeStandalone logs a message from the backend's GET stream: a response
// to an in-flight request goes to that request's stream, the rest to the
// session's current standalone stream.
func (h *Handler) routeStandalone(s *session, data []byte) {
	if ids := responseIDs(data, nil); len(ids) == 1 {
		s.mu.Lock()
		var target *stream
		for st := range s.inflight {
			st.mu.Lock()
			_, ok := st.pending[string(ids[0])]
			st.mu.Unlock()
			if ok {
				target = st
				break
			}
		}
		s.mu.Unlock()
		if target != nil {
			h.deliver(target, data)
			return
		}
	}
	s.mu.Lock()
	st := s.standalone
	s.mu.Unlock()
	if st != nil {
		h.appendEvents(st, false, eventlog.Event{Data: data})
	}
}
