package relay

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
)

// primes reports whether streams of s start with a priming event and may
// be closed early with retry: clients at 2025-11-25 or later, as
// negotiated (never as the header says; see checkVersion).
func primes(s *session) bool { return s.version >= version20251125 }

// plan says what one client connection of a stream gets.
type plan struct {
	key         resume.StreamKey
	gen         uint64
	from        uint64 // deliver events with Seq > from
	none        bool   // nothing to deliver after the resets
	upTo        uint64 // with then != Live: the replay ends after this seq
	resetBefore string
	resetAfter  string
	then        resume.Next
	priming     bool
}

// replayBatch is how many events one log read returns.
const replayBatch = 256

// eventBufs holds batch buffers for log reads.
var eventBufs = sync.Pool{New: func() any {
	b := make([]eventlog.Event, 0, replayBatch)
	return &b
}}

// serveStream writes a stream to the client as SSE: priming event, resets,
// replay from the log, then live events as they are logged, until the
// stream ends, the connection is taken over, the client leaves, the poll
// interval passes, or the relay shuts down.
func (h *Handler) serveStream(w http.ResponseWriter, r *http.Request, s *session, p plan) {
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache, no-transform")
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s.open.Add(1)
	defer s.open.Add(-1)
	defer s.touch()

	c := &sseConn{w: w, rc: http.NewResponseController(w), codec: h.codec}
	ctx := r.Context()
	if p.priming {
		c.id(p.key, p.gen, p.from, 0, true)
	}
	if p.resetBefore != "" {
		c.reset(resetData{Reason: p.resetBefore, Stream: p.key.String(), Generation: p.gen})
	}
	if p.none {
		c.flush()
		return
	}
	var pollC <-chan time.Time
	if h.opts.PollInterval > 0 && primes(s) {
		t := time.NewTimer(h.opts.PollInterval)
		defer t.Stop()
		pollC = t.C
	}
	for {
		key := p.key.String()
		st := h.liveStream(key)
		var a *attachment
		if st != nil {
			a = &attachment{kick: make(chan struct{})}
			st.attach(a)
		}
		next, ok := h.follow(ctx, c, s, st, a, key, &p, pollC)
		if st != nil {
			st.detach(a)
		}
		if !ok || next == nil {
			c.flush()
			return
		}
		p = *next
	}
}

// follow serves one stream of a connection. It returns the plan of the
// stream to switch to (the session's new standalone stream after a
// generation change), or nil when the connection is done.
func (h *Handler) follow(ctx context.Context, c *sseConn, s *session, st *stream, a *attachment, key string, p *plan, pollC <-chan time.Time) (*plan, bool) {
	cursor := p.from
	gapSent := p.resetBefore == ReasonGap
	lastType := ""
	for {
		// The batch buffer is held only while events are written, not
		// while the connection waits: an idle stream costs no batch.
		bp := eventBufs.Get().(*[]eventlog.Event)
		rec, evs, err := h.store.Read(ctx, key, cursor, replayBatch, (*bp)[:0])
		read := evs
		release := func() {
			clear(read) // drop references to event data; the rest is still zero
			*bp = read[:0]
			eventBufs.Put(bp)
		}
		if err != nil {
			release()
			if errors.Is(err, eventlog.ErrNotFound) && !s.isClosed() {
				c.reset(resetData{Reason: ReasonUnknownStream, Stream: key, Generation: p.gen})
			}
			return nil, false
		}
		if rec.FirstSeq > cursor+1 {
			// Events this connection never saw were evicted: never skip
			// them silently.
			if !gapSent {
				c.reset(resetData{Reason: ReasonGap, Stream: key, Generation: p.gen})
			}
			cursor = rec.FirstSeq - 1
		}
		gapSent = false
		if p.then != resume.Live && len(evs) > 0 && evs[len(evs)-1].Seq > p.upTo {
			// Replay-only: stop at the seal.
			n := 0
			for n < len(evs) && evs[n].Seq <= p.upTo {
				n++
			}
			evs = evs[:n]
		}
		for _, ev := range evs {
			c.event(p.key, p.gen, ev)
			cursor = ev.Seq
			lastType = ev.Type
		}
		n := len(evs)
		release()
		if st != nil && n > 0 {
			st.mu.Lock()
			st.delivered = max(st.delivered, cursor)
			st.mu.Unlock()
		}
		if n == replayBatch {
			if c.err != nil {
				return nil, false
			}
			continue
		}
		if c.flush() != nil {
			return nil, false
		}
		if p.then != resume.Live && cursor >= p.upTo {
			if p.resetAfter != "" && lastType != "reset" {
				c.reset(resetData{Reason: p.resetAfter, Stream: key, Generation: p.gen})
			}
			if p.then == resume.CurrentStandalone {
				return h.switchStandalone(s)
			}
			return nil, true
		}
		if rec.Terminal && cursor >= rec.LastSeq {
			if rec.RequestID == nil {
				// A sealed standalone stream: carry on with the
				// session's current one.
				return h.switchStandalone(s)
			}
			return nil, true
		}
		if st == nil {
			return nil, true // not live here: nothing more will come
		}
		st.mu.Lock()
		poll := a.poll
		st.mu.Unlock()
		if poll > 0 && primes(s) {
			c.retry(p.key, p.gen, cursor, poll)
			return nil, true
		}
		select {
		case <-st.wake:
		case <-a.kick:
			return nil, true
		case <-ctx.Done():
			return nil, false
		case <-h.shutdown:
			c.retry(p.key, p.gen, cursor, max(h.opts.PollInterval, time.Second))
			return nil, true
		case <-pollC:
			c.retry(p.key, p.gen, cursor, h.opts.PollInterval)
			return nil, true
		}
	}
}

// switchStandalone returns the plan of the session's current standalone
// stream, from its start.
func (h *Handler) switchStandalone(s *session) (*plan, bool) {
	s.mu.Lock()
	st := s.standalone
	closed := s.closed
	s.mu.Unlock()
	if closed || st == nil {
		return nil, true
	}
	return &plan{key: st.key, gen: st.gen, from: 0, then: resume.Live}, true
}

func (s *session) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// sseConn buffers SSE output to one client connection.
type sseConn struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	codec *resume.Codec
	buf   []byte
	idBuf []byte
	err   error
}

func (c *sseConn) id(key resume.StreamKey, gen, seq uint64, retry time.Duration, emptyData bool) {
	c.idBuf = c.codec.AppendID(c.idBuf[:0], resume.Cursor{Stream: key, Generation: gen, Seq: seq})
	e := sse.Event{ID: string(c.idBuf), Retry: retry}
	if emptyData {
		e.Data = []byte{}
	}
	c.buf = sse.AppendEvent(c.buf, e)
}

func (c *sseConn) event(key resume.StreamKey, gen uint64, ev eventlog.Event) {
	// The id line is written here, straight from the codec, so that no
	// string is made per event; AppendEvent writes the rest.
	c.buf = append(c.buf, "id: "...)
	c.buf = c.codec.AppendID(c.buf, resume.Cursor{Stream: key, Generation: gen, Seq: ev.Seq})
	c.buf = append(c.buf, '\n')
	c.buf = sse.AppendEvent(c.buf, sse.Event{Type: ev.Type, Data: ev.Data})
	if len(c.buf) >= 32<<10 {
		c.write()
	}
}

func (c *sseConn) reset(d resetData) {
	c.buf = sse.AppendEvent(c.buf, sse.Event{Type: "reset", Data: d.marshal()})
}

// retry tells the client to come back (polling, shutdown) and ends.
func (c *sseConn) retry(key resume.StreamKey, gen, seq uint64, d time.Duration) {
	c.id(key, gen, seq, d, false)
	c.flush()
}

func (c *sseConn) write() {
	if c.err == nil && len(c.buf) > 0 {
		_, c.err = c.w.Write(c.buf)
	}
	c.buf = c.buf[:0]
}

func (c *sseConn) flush() error {
	c.write()
	if c.err == nil {
		c.err = c.rc.Flush()
	}
	return c.err
}
