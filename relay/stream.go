package relay

import (
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

// replayBatch is how many events one log read returns.
const replayBatch = 256

// eventBufs holds batch buffers for log reads.
var eventBufs = sync.Pool{New: func() any {
	b := make([]eventlog.Event, 0, replayBatch)
	return &b
}}

// primeDelay is how long a call's stream holds its headers and priming
// event back waiting for its first event, so that a quick call is answered
// in one write, and, with a durable store, one fsync: the stream's record
// is made durable by the event's append rather than by a sync of its own
// before the priming event names it. A slower call gets them after
// primeDelay (the record synced first).
var primeDelay = 10 * time.Millisecond

// connKind is how a client connection came to serve its stream; it decides
// priming, polling (docs/design.md, Polling) and the priming hold.
type connKind int

const (
	// opensStream: a GET without Last-Event-ID. It is primed (2025-11-25
	// clients) and closed after PollInterval.
	opensStream connKind = iota
	// opensCall: a POST's response. As opensStream, and its headers and
	// priming event are held back for up to primeDelay.
	opensCall
	// resumesStream: a GET with Last-Event-ID. It is never closed for
	// polling: it runs until its stream ends (a request stream: the
	// response) or the client leaves. A stream is therefore closed by the
	// relay's poll timer at most once per opening, and a client that
	// resumes once gets everything.
	resumesStream
)

// serveStream writes a stream to the client as SSE, executing plan p
// (resume.Plan): priming event (a connection that opens its stream),
// resets, replay from the log, then live events as they are logged, until
// the stream ends, the connection is taken over, the client leaves, the
// poll interval passes (a connection that opens its stream), or the relay
// shuts down.
func (h *Handler) serveStream(w http.ResponseWriter, r *http.Request, s *session, p resume.Plan, kind connKind) {
	hdr := w.Header()
	hdr["Content-Type"] = valEventStream
	hdr["Cache-Control"] = valNoCache
	hdr["X-Accel-Buffering"] = valNo
	w.WriteHeader(http.StatusOK)
	s.open.Add(1)
	defer s.open.Add(-1)
	defer s.touch()

	c := &sseConn{w: w, rc: http.NewResponseController(w), codec: h.codec}
	defer c.stopHold()
	if kind == opensCall {
		st := h.liveStream(p.Stream.String())
		c.hold = true
		c.durable = func() error {
			err := h.makeDurable(r.Context(), st)
			if err == nil || r.Context().Err() != nil {
				return err
			}
			h.log.Error("syncing a call's stream before its priming event; the call is answered lost", logSession, s.id, logStream, p.Stream.String(), "err", err)
			// No cursor goes out that a crash could make name nothing:
			// the client gets the request-lost error, without an event
			// ID, instead of a stream that ends with no answer.
			c.buf = c.buf[:0]
			for _, id := range st.pendingIDs() {
				c.buf = sse.AppendEvent(c.buf, sse.Event{Data: errorResponse(id, resume.CodeRequestLost,
					"mcprelay: request lost: the event log could not record its stream", resume.ReasonBackendLost)})
			}
			return err
		}
		c.holdEnd = time.Now().Add(primeDelay)
	}
	if kind != resumesStream && primes(s) {
		c.id(p.Stream, p.Generation, p.From, 0, true)
	}
	if p.ResetBefore != "" {
		c.reset(resume.Reset{Reason: p.ResetBefore, Stream: p.Stream.String(), Generation: p.Generation})
	}
	if !p.Replay {
		c.flush()
		return
	}
	var pollC <-chan time.Time
	if h.opts.PollInterval > 0 && primes(s) && kind != resumesStream {
		t := time.NewTimer(h.opts.PollInterval)
		defer t.Stop()
		pollC = t.C
	}
	for {
		key := p.Stream.String()
		st := h.liveStream(key)
		var a *attachment
		if st != nil {
			a = &attachment{kick: make(chan struct{}), wake: make(chan struct{}, 1)}
			st.attach(a)
		}
		next, ok := h.follow(r, c, s, st, a, key, p, pollC)
		if st != nil {
			st.detach(a)
		}
		if !ok || next == nil {
			c.finish()
			return
		}
		p = *next
	}
}

// follow executes plan p on one stream of a connection, applying the
// mid-stream rules of package resume to each read of the log. It returns
// the plan of the stream to switch to (the session's current standalone
// stream after a generation change), or nil when the connection is done.
func (h *Handler) follow(r *http.Request, c *sseConn, s *session, st *stream, a *attachment, key string, p resume.Plan, pollC <-chan time.Time) (*resume.Plan, bool) {
	ctx := r.Context()
	cursor := p.From
	gapAnnounced := p.ResetBefore == resume.ReasonGap
	lastType := ""
	var wake <-chan struct{}
	if st == nil && h.cluster != nil {
		// Another replica writes this stream (or nobody, any more): its
		// appends are announced through the cluster. Watching before the
		// first read leaves no window for a missed append.
		var stop func()
		wake, stop = h.cluster.Watch(key)
		defer stop()
	}
	var quiet watchQuiet
	for {
		if wake != nil {
			quiet = h.watchQuiet()
		}
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
			switch {
			case ctx.Err() != nil:
				return nil, false
			case errors.Is(err, eventlog.ErrNotFound):
				if !s.isClosed() {
					c.reset(resume.Reset{Reason: resume.ReasonUnknownStream, Stream: key, Generation: p.Generation})
				}
				return nil, false
			}
			// The log cannot be read now (Redis restarting, a failing
			// disk): ask the client to come back, never end the stream as
			// if it were complete.
			h.log.Warn("reading the event log; the client is asked to retry", logSession, s.id, logStream, key, "err", err)
			c.retry(p.Stream, p.Generation, cursor, time.Second)
			return nil, true
		}
		if resume.Hole(cursor, rec.FirstSeq) {
			if !gapAnnounced {
				c.reset(resume.Reset{Reason: resume.ReasonGap, Stream: key, Generation: p.Generation})
			}
			cursor = rec.FirstSeq - 1
		}
		gapAnnounced = false
		n := 0
		for n < len(evs) && p.Delivers(evs[n].Seq) {
			n++
		}
		for _, ev := range evs[:n] {
			c.event(p.Stream, p.Generation, ev)
			cursor = ev.Seq
			lastType = ev.Type
		}
		full := len(evs) == replayBatch && n == len(evs)
		release()
		if st != nil && n > 0 {
			st.mu.Lock()
			st.delivered = max(st.delivered, cursor)
			st.mu.Unlock()
		}
		if full {
			if c.err != nil {
				return nil, false
			}
			continue
		}
		replayDone := p.ReplayDone(cursor, resume.Stream{LastSeq: rec.LastSeq, Terminal: rec.Terminal})
		if replayDone || rec.Terminal && cursor >= rec.LastSeq {
			// This stream ends here. What is buffered is written by the
			// next stream's first flush or, when the connection ends,
			// when the handler returns, together with the response's
			// end: one write for a quick call, not two.
			if c.finish(); c.err != nil {
				return nil, false
			}
		} else if (!c.hold || n > 0) && c.flush() != nil {
			return nil, false
		}
		if replayDone {
			if reason := p.ResetAfterDue(lastType); reason != "" {
				c.reset(resume.Reset{Reason: reason, Stream: key, Generation: p.Generation})
			}
			if p.Then == resume.CurrentStandalone {
				return h.switchStandalone(r, s)
			}
			return nil, true
		}
		if rec.Terminal && cursor >= rec.LastSeq {
			if resume.AtTerminal(rec.RequestID == nil) == resume.CurrentStandalone {
				return h.switchStandalone(r, s)
			}
			return nil, true
		}
		if st == nil {
			if wake == nil {
				return nil, true // not live here: nothing more will come
			}
			for {
				goOn, ok, idle := h.waitRemote(ctx, c, p, cursor, wake, pollC)
				if !goOn {
					return nil, ok
				}
				if !idle {
					break // woken: read what was appended
				}
				h.recordUse(s) // the owner must not expire a session read here
				if h.ownerMayBeGone(ctx, s.id) {
					// Nothing for a while and nobody holds the lease:
					// the owner died, and this replica takes the
					// session over (which seals what the dead owner
					// left unfinished).
					h.lookup(r, s.id)
					break
				}
				if !quiet.still() {
					break // the watch may have missed an append: re-read
				}
			}
			continue
		}
		st.mu.Lock()
		poll := a.poll
		st.mu.Unlock()
		if poll > 0 && primes(s) {
			c.retry(p.Stream, p.Generation, cursor, poll)
			return nil, true
		}
		select {
		case <-a.wake:
		case <-a.kick:
			st.mu.Lock()
			moved := a.moved
			st.mu.Unlock()
			if moved {
				c.retry(p.Stream, p.Generation, cursor, 100*time.Millisecond)
			}
			return nil, true
		case <-ctx.Done():
			return nil, false
		case <-h.shutdown:
			c.retry(p.Stream, p.Generation, cursor, max(h.opts.PollInterval, time.Second))
			return nil, true
		case <-pollC:
			c.retry(p.Stream, p.Generation, cursor, h.opts.PollInterval)
			return nil, true
		case <-c.holdC():
			if c.flush() != nil {
				return nil, false
			}
		}
	}
}

// switchStandalone returns the plan of the session's current standalone
// stream, from its start. On a view of a session another replica owns, the
// session is looked up afresh: the view's incarnation is the old one.
func (h *Handler) switchStandalone(r *http.Request, s *session) (*resume.Plan, bool) {
	if s.owner != "" {
		cur, err := h.lookup(r, s.id)
		if err != nil || cur == nil {
			return nil, true
		}
		s = cur
	}
	s.mu.Lock()
	st := s.standalone
	closed := s.closed
	s.mu.Unlock()
	if closed || st == nil {
		return nil, true
	}
	p := resume.Tail(st.key, st.gen, 0)
	return &p, true
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
	sids  resume.StreamIDs // the current stream's ID minter (ids)
	buf   []byte
	idBuf []byte
	err   error
	// hold: nothing is sent before an event of the log is written (which
	// proves the stream's record durable) or durable has returned; see
	// primeDelay.
	hold    bool
	durable func() error
	holdEnd time.Time   // when the hold ends at the latest
	holdT   *time.Timer // made when the connection first waits while holding
}

// Header values of every SSE answer, shared (never changed in place).
var (
	valEventStream = []string{"text/event-stream"}
	valNoCache     = []string{"no-cache, no-transform"}
	valNo          = []string{"no"}
)

// holdC returns a channel that fires when the hold ends; nil when nothing
// is held. Most calls are answered before they wait: no timer is made.
func (c *sseConn) holdC() <-chan time.Time {
	if !c.hold {
		return nil
	}
	if c.holdT == nil {
		c.holdT = time.NewTimer(time.Until(c.holdEnd))
	}
	return c.holdT.C
}

func (c *sseConn) stopHold() {
	if c.holdT != nil {
		c.holdT.Stop()
	}
}

// ids returns the minter of the IDs of key's events at gen, made once
// for each stream the connection serves.
func (c *sseConn) ids(key resume.StreamKey, gen uint64) *resume.StreamIDs {
	if !c.sids.Is(key, gen) {
		c.sids = c.codec.Stream(key, gen)
	}
	return &c.sids
}

func (c *sseConn) id(key resume.StreamKey, gen, seq uint64, retry time.Duration, emptyData bool) {
	c.idBuf = c.ids(key, gen).AppendID(c.idBuf[:0], seq)
	e := sse.Event{ID: string(c.idBuf), Retry: retry}
	if emptyData {
		e.Data = []byte{}
	}
	c.buf = sse.AppendEvent(c.buf, e)
}

func (c *sseConn) event(key resume.StreamKey, gen uint64, ev eventlog.Event) {
	c.hold = false
	// The id line is written here, straight from the codec, so that no
	// string is made per event; AppendEvent writes the rest.
	c.buf = append(c.buf, "id: "...)
	c.buf = c.ids(key, gen).AppendID(c.buf, ev.Seq)
	c.buf = append(c.buf, '\n')
	c.buf = sse.AppendEvent(c.buf, sse.Event{Type: ev.Type, Data: ev.Data})
	if len(c.buf) >= 32<<10 {
		c.write()
	}
}

func (c *sseConn) reset(r resume.Reset) {
	c.buf = sse.AppendEvent(c.buf, sse.Event{Type: resume.EventReset, Data: r.Marshal()})
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

// finish writes what is buffered when the connection ends; net/http
// flushes it when the handler returns.
func (c *sseConn) finish() {
	if c.hold {
		c.flush() // the stream's record must be durable before its cursor goes out
		return
	}
	c.write()
}

func (c *sseConn) flush() error {
	if c.hold {
		// A cursor naming the stream is about to go out without an
		// event: the stream's record must be durable first. If it
		// cannot be made so, durable replaced the buffer with what may
		// go out instead, and the connection ends.
		c.hold = false
		if c.err == nil {
			if err := c.durable(); err != nil {
				c.write()
				if c.err == nil {
					c.rc.Flush()
				}
				c.err = err
			}
		}
	}
	c.write()
	if c.err == nil {
		c.err = c.rc.Flush()
	}
	return c.err
}
