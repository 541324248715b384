package relay

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/internal/wire"
	"github.com/mcprelay/mcprelay/resume"
)

// pumpBatch bounds how many backend messages one Append carries.
const pumpBatch = 128

// routed is one backend message with the ids of the responses it holds.
type routed struct {
	data []byte
	ids  []json.RawMessage
}

// startPump moves one call's reply into its stream's log until the
// responses to all its requests. What the reply already holds
// (backend.Buffered: an in-process handler that had finished, a stdio
// child that had answered) is logged here, on the client's handler
// goroutine, before the stream is served: a quick call then costs no
// goroutine and no wake-up. What is still to come is pumped by a
// goroutine, which outlives the client's connection (legacy era: only
// notifications/cancelled cancels).
func (h *Handler) startPump(ctx context.Context, st *stream, rep backend.Reply) {
	rr := newReplyReader(st, rep)
	b, ok := rep.(backend.Buffered)
	var evs []eventlog.Event
	var ids [][]json.RawMessage
	for ok && !rr.answered() && !st.isDone() {
		// What is held goes in batches, as the pump's: one Append (and
		// fsync) for a whole answer, not one per message.
		evs, ids = evs[:0], ids[:0]
		for len(evs) < pumpBatch && !rr.answered() {
			data, held := b.TryNext()
			if !held {
				ok = false
				break
			}
			evs = append(evs, eventlog.Event{Data: data})
			ids = append(ids, rr.route(data))
		}
		if len(evs) > 0 {
			h.deliverBatch(st, evs, ids)
		}
	}
	if !ok {
		go h.pump(ctx, st, rr)
		return
	}
	rep.Close()
	h.pumpEnded(ctx, st, nil)
}

// pump moves the rest of a reply into the log. Most calls are answered by
// one message: it is read and appended here. Only when more are to come
// does a reader goroutine take messages from the backend while this one
// appends: messages that arrive while an Append (and its fsync) is under
// way go together into the next one, so a stream is not held to one fsync
// per event.
func (h *Handler) pump(ctx context.Context, st *stream, rr *replyReader) {
	defer rr.rep.Close()
	m, rerr := rr.next()
	if rerr == nil {
		h.deliverBatch(st, []eventlog.Event{{Data: m.data}}, [][]json.RawMessage{m.ids})
		if !rr.answered() && !st.isDone() {
			rerr = h.pumpRest(ctx, st, rr)
		}
	}
	h.pumpEnded(ctx, st, rerr)
}

// pumpEnded ends a call's pumping: rerr is what reading the reply
// returned. A stream that did not get every response is sealed, its
// missing requests reported lost.
func (h *Handler) pumpEnded(ctx context.Context, st *stream, rerr error) {
	if st.isDone() || ctx.Err() != nil {
		return
	}
	if st.isCancelled() {
		h.loseStream(st, resume.ReasonCancelled, "request cancelled")
		return
	}
	if errors.Is(rerr, backend.ErrSessionLost) {
		h.upstreamFailed("backend session lost during a call", "", rerr, logSession, st.sess.id, logStream, st.skey)
		h.reincarnate(st.sess, st.gen) // seals st
		h.loseStream(st, resume.ReasonBackendLost, "mcprelay: request lost: the backend session was lost")
		return
	}
	if rerr != nil {
		cause := upstreamCause(rerr)
		if cause == causeUnreachable || cause == causeOther {
			cause = causeStreamBroken // the answer had begun
		}
		h.upstreamFailed("backend reply ended before its response", cause, rerr, logSession, st.sess.id, logStream, st.skey)
	} else {
		h.log.Warn("a call's response could not be logged", logSession, st.sess.id, logStream, st.skey)
	}
	h.loseStream(st, resume.ReasonBackendLost, "mcprelay: request lost: the backend's stream ended before its response")
}

// pumpRest moves the rest of a reply, from a reader goroutine, in batches.
// It returns the reader's error.
func (h *Handler) pumpRest(ctx context.Context, st *stream, rr *replyReader) error {
	ch := make(chan routed, pumpBatch)
	var rerr error
	go func() {
		defer close(ch)
		for !rr.answered() {
			m, err := rr.next()
			if err != nil {
				rerr = err
				return
			}
			select {
			case ch <- m:
			case <-ctx.Done():
				rerr = ctx.Err()
				return
			}
		}
	}()
	batch := make([]eventlog.Event, 0, pumpBatch)
	var ids [][]json.RawMessage
	for m := range ch {
		batch = append(batch[:0], eventlog.Event{Data: m.data})
		ids = append(ids[:0], m.ids)
	drain:
		for len(batch) < pumpBatch {
			select {
			case m, ok := <-ch:
				if !ok {
					break drain
				}
				batch = append(batch, eventlog.Event{Data: m.data})
				ids = append(ids, m.ids)
			default:
				break drain
			}
		}
		if st.isDone() {
			break
		}
		h.deliverBatch(st, batch, ids)
	}
	rr.rep.Close() // unblocks a reader waiting for more
	for range ch {
	}
	return rerr // the reader has finished: rerr is set
}

// replyReader reads a reply until the responses to all of the stream's
// pending requests have been read, relating each message to the ids it
// answers (once per event, here, not again by the appender). A Poll from
// the backend is carried to the client's connection.
type replyReader struct {
	st   *stream
	rep  backend.Reply
	want []string // match keys of pending ids not yet answered (one, but for a batch)
}

func newReplyReader(st *stream, rep backend.Reply) *replyReader {
	st.mu.Lock()
	want := make([]string, 0, len(st.pending))
	for id := range st.pending {
		want = append(want, id)
	}
	st.mu.Unlock()
	return &replyReader{st: st, rep: rep, want: want}
}

// answered reports whether every pending request's response was read.
func (r *replyReader) answered() bool { return len(r.want) == 0 }

// next returns the next message; io.ErrUnexpectedEOF if the reply ends
// before every response.
func (r *replyReader) next() (routed, error) {
	for {
		data, err := r.rep.Next()
		if err == nil {
			return routed{data: data, ids: r.route(data)}, nil
		}
		// Only here: errors.As makes its target escape, an allocation
		// per message if it were declared on the happy path.
		var poll *backend.Poll
		switch {
		case errors.As(err, &poll):
			r.st.pollConn(poll.Retry)
		case errors.Is(err, io.EOF):
			return routed{}, io.ErrUnexpectedEOF // the backend has nothing more, and a response is missing
		default:
			return routed{}, err
		}
	}
}

// route returns the ids of the responses in data, noting them answered.
func (r *replyReader) route(data []byte) []json.RawMessage {
	ids := wire.ResponseIDs(data, nil)
	for _, id := range ids {
		k := wire.MatchKey(id)
		r.want = slices.DeleteFunc(r.want, func(w string) bool { return w == k })
	}
	return ids
}

// deliverBatch appends backend messages to a request stream in one Append
// (one fsync with a durable store); ids[i] are the response ids in
// evs[i]. The response completing the stream's pending ids carries the
// terminal marker; anything after it is dropped. A request counts as
// answered only once its response is in the log: if the append fails, the
// request stays pending, and the stream's seal reports it lost. It
// reports whether the stream is now terminal.
func (h *Handler) deliverBatch(st *stream, evs []eventlog.Event, ids [][]json.RawMessage) bool {
	terminal := false
	var answered []string
	st.mu.Lock()
	left := len(st.pending)
	for i := range evs {
		for _, id := range ids[i] {
			k := wire.MatchKey(id)
			if _, ok := st.pending[k]; ok && !slices.Contains(answered, k) {
				answered = append(answered, k)
				left--
			}
		}
		if len(ids[i]) > 0 && !st.standalone && left == 0 {
			terminal = true
			evs = evs[:i+1]
			break
		}
	}
	st.mu.Unlock()
	if !h.appendEvents(st, terminal, evs...) {
		if terminal && !st.isDone() {
			// The response could not be logged: the call is lost, and
			// its stream must still end (never a hang).
			go h.sealWhenPossible(st)
		}
		return false
	}
	st.mu.Lock()
	for _, k := range answered {
		delete(st.pending, k)
	}
	st.mu.Unlock()
	return terminal
}

// sealWhenPossible ends a request stream whose response could not be
// logged, with the lost-request reset and errors, as soon as the store
// takes writes again.
func (h *Handler) sealWhenPossible(st *stream) {
	for wait := time.Second; !st.isDone() && !st.sess.isClosed() && h.ctx.Err() == nil; wait = min(2*wait, time.Minute) {
		h.loseStream(st, resume.ReasonBackendLost, "mcprelay: request lost: its response could not be logged")
		select {
		case <-h.ctx.Done():
		case <-time.After(wait):
		}
	}
}

// routeUnrelated logs a message that incarnation gen's backend sent outside
// any call: a response to an in-flight request (a backend may answer on
// its GET stream) goes to that request's stream, the rest to the session's
// standalone stream. A message of an incarnation that is no longer current
// is dropped: its streams are sealed.
func (h *Handler) routeUnrelated(s *session, gen uint64, data []byte) {
	s.mu.Lock()
	current := s.incarnation == gen && !s.closed
	s.mu.Unlock()
	if !current {
		return
	}
	if ids := wire.ResponseIDs(data, nil); len(ids) == 1 {
		s.mu.Lock()
		var target *stream
		for st := range s.inflight {
			st.mu.Lock()
			_, ok := st.pending[wire.MatchKey(ids[0])]
			st.mu.Unlock()
			if ok {
				target = st
				break
			}
		}
		s.mu.Unlock()
		if target != nil {
			h.deliverBatch(target, []eventlog.Event{{Data: data}}, [][]json.RawMessage{ids})
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

func (st *stream) isDone() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.done
}

func (st *stream) isCancelled() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.cancelled
}
