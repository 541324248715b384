package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/internal/wire"
	"github.com/mcprelay/mcprelay/resume"
)

// session is the relay's in-memory state of a live session. The durable
// part is the eventlog.Session record.
type session struct {
	id        string
	principal string
	version   string // negotiated protocol version
	authz     string // Authorization forwarded to the backend (Options.ForwardAuthorization)
	limitKey  string // what Options.Limits counts it under

	reinitMu sync.Mutex // serializes re-creation of the backend side and rewrites of the record (rewriteRecord)

	mu           sync.Mutex
	incarnation  uint64
	backend      backend.Session      // this incarnation's backend session
	standalone   *stream              // current standalone (GET) stream
	inflight     map[*stream]struct{} // request streams awaiting their response
	closed       bool
	listening    bool              // the backend's unrelated messages are received (see listen)
	listenStored bool              // the record says so (eventlog.Session.Listening)
	open         atomic.Int32      // client streams being served (here, not below: no padding)
	replay       []json.RawMessage // state-setting requests, replayed to each new incarnation
	recreated    []time.Time       // when the backend side was re-created, within recreationWindow

	lastSeen atomic.Int64 // unix nanos of the last request
	recorded atomic.Int64 // unix nanos of the LastUsed last written to the store

	// With a Cluster: the lease this replica holds (set before the session
	// is published, nil without a Cluster). owner is set instead on a
	// read-only view of a session another replica owns (remoteView).
	held  *leaseHeld
	owner string
}

func (s *session) touch() { s.lastSeen.Store(time.Now().UnixNano()) }

// current returns the incarnation and its backend session.
func (s *session) current() (gen uint64, bs backend.Session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.incarnation, s.backend
}

// stream is the in-memory state of a non-terminal stream: whom to wake
// when an event is appended, and which connection is attached.
type stream struct {
	key        resume.StreamKey
	skey       string
	sess       *session
	gen        uint64
	standalone bool

	appendMu sync.Mutex // held by one appender at a time, across the store call

	mu        sync.Mutex
	pending   map[string]json.RawMessage // request ids awaiting a response (request streams)
	done      bool                       // terminal event appended
	gap       bool                       // events were given up: the next append starts with a gap reset
	cancelled bool                       // the client sent notifications/cancelled
	conn      *attachment                // the client connection reading it
	delivered uint64                     // highest seq written to any connection
	// unsynced: the stream's record was created without waiting for the
	// store's disk, and no append has made it durable yet; nothing may
	// name the stream (a cursor) before [Handler.makeDurable].
	unsynced bool

	cancel context.CancelFunc
}

// attachment is one client connection serving a stream. Closing kick
// makes it end (takeover).
type attachment struct {
	kick chan struct{}
	wake chan struct{} // cap 1: an event was appended or the state changed (stream.signal)
	// moved is set before kick is closed when the session moves to
	// another replica: the client must come back (retry), not take the
	// end for the end of the stream. Guarded by stream.mu.
	moved bool
	poll  time.Duration // >0: the backend closed its stream asking to poll; guarded by stream.mu
}

// signal wakes the connection attached, if any: an event was appended or
// the state changed. A connection attaches before it first reads the log,
// so none misses a wake-up.
func (st *stream) signal() {
	st.mu.Lock()
	a := st.conn
	st.mu.Unlock()
	a.signal()
}

// signal wakes a (nil: nobody to wake).
func (a *attachment) signal() {
	if a != nil {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
}

// attach makes a the stream's connection, ending any previous one.
func (st *stream) attach(a *attachment) {
	st.mu.Lock()
	if st.conn != nil {
		close(st.conn.kick)
	}
	st.conn = a
	st.mu.Unlock()
	st.signal()
}

// pollConn asks the attached connection, if any, to end with retry d: the
// backend closed its own stream (server-initiated close), and the client
// should poll the same way. Connections attached later are not affected.
func (st *stream) pollConn(d time.Duration) {
	st.mu.Lock()
	if st.conn != nil {
		st.conn.poll = d
	}
	st.mu.Unlock()
	st.signal()
}

func (st *stream) detach(a *attachment) {
	st.mu.Lock()
	if st.conn == a {
		st.conn = nil
	}
	st.mu.Unlock()
}

// lookup resolves a session ID for the caller: nil when it is unknown,
// expired, deleted, or bound to another principal (all the same 404).
//
// The error is errUnavailable when the store holds the session but it
// cannot be restored right now (the store failed, or the backend could not
// be re-created): the client should retry (503), not re-initialize (404).
//
// With a Cluster, a session another replica owns comes back as a read-only
// view with owner set: the caller forwards to the owner or serves from the
// log. A session whose lease lapsed here is renewed first, and dropped if
// it cannot be: a paused replica that wakes up never answers for a session
// it may have lost.
func (h *Handler) lookup(r *http.Request, id string) (*session, error) {
	h.mu.RLock()
	s := h.sessions[id]
	h.mu.RUnlock()
	if s != nil && h.cluster != nil && !s.leaseValid() {
		switch err := h.renew(r.Context(), s); {
		case errors.Is(err, ErrLeaseLost):
			s = nil // dropped: restored below as another replica's
		case err != nil:
			return nil, fmt.Errorf("%w: renewing the session's lease: %w", errUnavailable, err)
		}
	}
	if s == nil {
		var err error
		if s, err = h.restore(r, id); err != nil {
			return nil, err
		}
	}
	if s == nil || s.principal != h.principal(r) {
		return nil, nil
	}
	if s.owner != "" {
		h.recordUse(s) // a resume here keeps the session from expiring there
		return s, nil
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, nil
	}
	s.touch()
	h.recordUse(s)
	return s, nil
}

// toucher is a store that records a session's use without rewriting its
// record (see eventlog.Store); any replica may, not only the owner.
type toucher interface {
	TouchSession(ctx context.Context, id string, at time.Time) error
}

// recordUse writes the session's LastUsed to the store when the one there
// is older than an eighth of the idle timeout: a session that outlives this
// process (a restart, a replica's death) is still expired on time, and one
// whose client reads its streams from another replica is not expired by
// its owner, at the cost of one write per session every few minutes, off
// the request's path. A request records a use, and so does a connection
// that stays open (the janitor, and a reader on a replica that does not
// own the session, call it while it is).
func (h *Handler) recordUse(s *session) {
	timeout := h.opts.SessionIdleTimeout
	tc, touches := h.store.(toucher)
	if timeout <= 0 || !touches && s.owner != "" {
		return // without TouchSession only the owner writes the record
	}
	now := time.Now()
	last := s.recorded.Load()
	if now.Sub(time.Unix(0, last)) < timeout/8 || !s.recorded.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
		defer cancel()
		var err error
		if touches {
			err = tc.TouchSession(ctx, s.id, now)
		} else {
			// Read, modify, write: a store without TouchSession, with
			// the owner as the record's one writer.
			err = h.rewriteRecord(ctx, s, func(rec *eventlog.Session) { rec.LastUsed = now })
		}
		if err != nil && !errors.Is(err, eventlog.ErrNotFound) && !errors.Is(err, context.Canceled) {
			h.log.Warn("recording a session's last use", logSession, s.id, "err", err)
		}
	}()
}

// errUnavailable: the session exists but cannot be served right now.
var errUnavailable = errors.New("relay: session temporarily unavailable")

// writeUnavailable answers a request for a session that cannot be
// restored right now: 503 with Retry-After, so that the client keeps its
// session and cursor and tries again.
//
// The body says nothing of the cause (it may name internal addresses):
// whoever met the cause logs it.
func writeUnavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	httpError(w, http.StatusServiceUnavailable, "Service Unavailable: the session cannot be served right now; retry")
}

// storeDown reports whether err says the store (or the Cluster) gave no
// answer now: out of reach, or slower than the caller's bound. The request
// can be sent again later (503), unlike a failure about one session.
func storeDown(err error) bool {
	return errors.Is(err, eventlog.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// outOfReach is storeDown, or the caller gave up (Close): background work
// stops, rather than skip the session as if its record were at fault.
func outOfReach(err error) bool {
	return storeDown(err) || errors.Is(err, context.Canceled)
}

// newStream creates a stream of the session's current incarnation in the
// log and registers it for wake-ups.
func (h *Handler) newStream(ctx context.Context, s *session, gen uint64, standalone bool, ids []json.RawMessage) (*stream, error) {
	st := &stream{
		key:        resume.NewStreamKey(),
		sess:       s,
		gen:        gen,
		standalone: standalone,
	}
	st.skey = st.key.String()
	rec := &eventlog.Stream{Key: st.skey, Session: s.id, Generation: gen}
	if !standalone {
		st.pending = make(map[string]json.RawMessage, len(ids))
		for _, id := range ids {
			st.pending[wire.MatchKey(id)] = id
		}
		if len(ids) == 1 {
			rec.RequestID = ids[0]
		} else {
			rec.RequestID, _ = json.Marshal(ids)
		}
	}
	var err error
	if us, ok := h.store.(unsyncedCreator); ok && !standalone {
		// A call's stream becomes durable with its first append (the
		// response, for most calls), or when a cursor naming it is first
		// sent: one fsync per call, not two.
		err = us.CreateStreamUnsynced(ctx, rec)
		st.unsynced = err == nil
	} else {
		err = h.store.CreateStream(ctx, rec)
	}
	if err != nil {
		return nil, err
	}
	h.streams.put(st)
	return st, nil
}

// unsyncedCreator is a store that can create a stream without waiting for
// its disk (eventlog/pebblestore): the record is durable once a later
// synced write returned, or after Sync.
type unsyncedCreator interface {
	CreateStreamUnsynced(ctx context.Context, s *eventlog.Stream) error
	Sync(ctx context.Context) error
}

// makeDurable makes st's record durable before a cursor naming it is sent
// without an event of the log (a priming event, a retry), which would
// prove it durable.
func (h *Handler) makeDurable(ctx context.Context, st *stream) error {
	if st == nil {
		return nil
	}
	st.mu.Lock()
	unsynced := st.unsynced
	st.mu.Unlock()
	if !unsynced {
		return nil
	}
	if err := h.store.(unsyncedCreator).Sync(ctx); err != nil {
		return err
	}
	st.mu.Lock()
	st.unsynced = false
	st.mu.Unlock()
	return nil
}

// pendingIDs returns the ids of the requests st still awaits (none for a
// nil stream).
func (st *stream) pendingIDs() []json.RawMessage {
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	ids := slices.Collect(maps.Values(st.pending))
	return ids
}

// liveStream returns the in-memory stream for key, or nil.
func (h *Handler) liveStream(key string) *stream {
	return h.streams.get(key)
}

// Appending while the store fails (a Redis restart, a full disk): the
// appender retries with backoff for up to appendPatience, holding its
// events (a pump stops reading its backend meanwhile, so nothing is
// dropped); past it, the events are given up and the stream's next append
// starts with a gap reset, so the loss is never silent.
const (
	appendPatience   = 30 * time.Second
	appendMaxBackoff = 2 * time.Second
)

// appendEvents appends to a stream unless it is already terminal, and
// wakes its reader. It reports whether the events were appended.
func (h *Handler) appendEvents(st *stream, terminal bool, evs ...eventlog.Event) bool {
	// appendMu orders appenders (the pump, a seal) without holding st.mu
	// across the store call: with a durable store that is an fsync, and
	// readers, takeovers and session-wide walks take st.mu meanwhile.
	st.appendMu.Lock()
	defer st.appendMu.Unlock()
	st.mu.Lock()
	done, gap := st.done, st.gap
	st.mu.Unlock()
	if done {
		return false
	}
	if gap {
		evs = append([]eventlog.Event{{Type: resume.EventReset,
			Data: resume.Reset{Reason: resume.ReasonGap, Stream: st.skey, Generation: st.gen}.Marshal()}}, evs...)
	}
	deadline := time.Now().Add(appendPatience)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, appendMaxBackoff) {
		t0 := time.Now()
		_, err := h.store.Append(h.ctx, st.skey, terminal, evs...)
		h.metrics.observeAppend(t0)
		if err == nil {
			break
		}
		switch {
		case errors.Is(err, eventlog.ErrFenced):
			// Another replica took the session over: this one must not
			// write, deliver or answer for it any more.
			go h.dropLocal(st.sess, "fenced: another replica owns the session")
			return false
		case errors.Is(err, context.Canceled), errors.Is(err, eventlog.ErrNotFound), errors.Is(err, eventlog.ErrTerminal):
			return false // the session or the stream ended meanwhile
		}
		if wait == 50*time.Millisecond {
			h.log.Error("appending to the event log; retrying", logSession, st.sess.id, logStream, st.skey, "err", err)
		}
		st.mu.Lock()
		done := st.done
		st.mu.Unlock()
		if done || time.Now().After(deadline) {
			h.log.Error("appending to the event log failed; the stream's next event will be a gap reset",
				logSession, st.sess.id, logStream, st.skey, "events", len(evs), "err", err)
			st.mu.Lock()
			st.gap = true
			st.mu.Unlock()
			return false
		}
		select {
		case <-h.ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
	st.mu.Lock()
	st.gap = false
	st.unsynced = false // the append was synced, and the record before it
	if terminal {
		st.done = true
	}
	a := st.conn
	st.mu.Unlock()
	a.signal() // the stream's lock taken once per append, not twice
	if terminal {
		h.retire(st)
	}
	return true
}

// retire forgets a terminal stream: readers still attached finish from the
// log, later resumes read the log alone.
func (h *Handler) retire(st *stream) {
	h.streams.remove(st)
	s := st.sess
	s.mu.Lock()
	delete(s.inflight, st)
	s.mu.Unlock()
	if st.cancel != nil {
		st.cancel()
	}
}

// loseStream ends a request stream whose response can no longer come: a
// reset event naming the lost requests, then a JSON-RPC error response per
// pending request id (so standard clients fail the call), as one terminal
// append.
func (h *Handler) loseStream(st *stream, reason resume.Reason, msg string) {
	st.mu.Lock()
	if st.done {
		st.mu.Unlock()
		return
	}
	ids := slices.Collect(maps.Values(st.pending))
	st.mu.Unlock()
	if h.appendEvents(st, true, lostEvents(st, ids, reason, msg)...) {
		h.metrics.requestsLost.Add(float64(len(ids)))
		h.log.Warn("request stream lost", logSession, st.sess.id, logStream, st.skey, logReason, reason, "requests", len(ids))
	}
}

// lostEvents are the events that seal st with its requests ids
// unanswered: the reset naming them and an error response under each id
// (for a cancellation, only the errors).
func lostEvents(st *stream, ids []json.RawMessage, reason resume.Reason, msg string) []eventlog.Event {
	evs := []eventlog.Event{{Type: resume.EventReset, Data: resume.Reset{Reason: reason, Stream: st.skey, Generation: st.gen, Lost: ids}.Marshal()}}
	code := resume.CodeRequestLost
	if reason == resume.ReasonCancelled {
		code = resume.CodeRequestCancelled
		evs = evs[:0]
	}
	for _, id := range ids {
		evs = append(evs, eventlog.Event{Data: errorResponse(id, code, msg, reason)})
	}
	return evs
}

// endSession removes a session: its pumps stop, its streams and events are
// dropped, open connections end, and the backend session is deleted.
func (h *Handler) endSession(s *session, why string) {
	sts, bs, ok := h.detachSession(s)
	if !ok {
		return
	}
	kickAll(sts, false)
	if err := h.store.DeleteSession(context.WithoutCancel(h.ctx), s.id); err != nil && !errors.Is(err, eventlog.ErrNotFound) {
		h.log.Error("deleting session from the store", logSession, s.id, "err", err)
	}
	if bs != nil {
		go bs.Close()
	}
	if h.cluster != nil {
		go h.cluster.Release(context.WithoutCancel(h.ctx), s.id, s.held.lease)
	}
	h.log.Info("session ended", logSession, s.id, logReason, why)
}

// detachSession stops s in this process: it is marked closed and
// forgotten, the backend calls of its streams are cancelled. It returns
// the streams (for their connections) and the backend session, and false
// if s was already closed.
func (h *Handler) detachSession(s *session) ([]*stream, backend.Session, bool) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, false
	}
	s.closed = true
	bs := s.backend
	var sts []*stream
	if s.standalone != nil {
		sts = append(sts, s.standalone)
	}
	for st := range s.inflight {
		sts = append(sts, st)
	}
	s.mu.Unlock()
	for _, st := range sts {
		if st.cancel != nil {
			st.cancel() // ends the stream's backend call and its pump
		}
	}
	h.mu.Lock()
	counted := h.sessions[s.id] == s
	if counted {
		delete(h.sessions, s.id)
	}

	h.mu.Unlock()
	for _, st := range sts {
		h.streams.remove(st)
	}
	if counted {
		h.limits.release(s.limitKey)
	}
	for _, st := range sts {
		st.mu.Lock()
		st.done = true
		st.mu.Unlock()
	}
	return sts, bs, true
}

// kickAll closes the client connections attached to sts; with moved, each
// is told to come back (the session goes on elsewhere).
func kickAll(sts []*stream, moved bool) {
	for _, st := range sts {
		st.mu.Lock()
		if st.conn != nil {
			st.conn.moved = moved
			close(st.conn.kick)
			st.conn = nil
		}
		st.mu.Unlock()
	}
}

// janitor expires idle sessions.
func (h *Handler) janitor() {
	defer close(h.janitorDone)
	timeout := h.opts.SessionIdleTimeout
	if timeout < 0 {
		<-h.ctx.Done()
		return
	}
	every := min(timeout/4, time.Minute)
	every = max(every, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	var lastSweep time.Time
	sweeping := make(chan struct{}, 1)
	defer func() { sweeping <- struct{}{} }() // waits for a sweep under way
	for {
		select {
		case <-h.ctx.Done():
			return
		case now := <-t.C:
			if now.Sub(lastSweep) >= sweepEvery(timeout) {
				select {
				case sweeping <- struct{}{}: // at most one at a time, off this loop
					lastSweep = now
					go func() {
						defer func() { <-sweeping }()
						h.sweep()
					}()
				default:
				}
			}
			h.mu.RLock()
			var idle []*session
			for _, s := range h.sessions {
				switch {
				case s.open.Load() > 0:
					h.recordUse(s) // in use, without requests
				case now.Sub(time.Unix(0, s.lastSeen.Load())) > timeout:
					idle = append(idle, s)
				}
			}
			h.mu.RUnlock()
			for _, s := range idle {
				if h.cluster != nil && h.usedElsewhere(s) {
					continue
				}
				h.endSession(s, "idle timeout")
			}
		}
	}
}

// usedElsewhere reports whether the store says s has not expired although
// it was not used here for the timeout: its client reads its streams from
// another replica, which records the uses. s's last use moves up to the
// recorded one. A store out of reach keeps s until the next look.
func (h *Handler) usedElsewhere(s *session) bool {
	ctx, cancel := context.WithTimeout(h.ctx, h.leaseTTL)
	defer cancel()
	rec, err := h.store.Session(ctx, s.id)
	switch {
	case errors.Is(err, eventlog.ErrNotFound):
		return false
	case err != nil:
		return outOfReach(err) && h.ctx.Err() == nil
	}
	if h.expired(rec) { // as a restore elsewhere would find it
		return false
	}
	s.lastSeen.Store(max(s.lastSeen.Load(), rec.LastUse().UnixNano()))
	return true
}

// streamIndex is the relay's live streams by key, in shards: a call adds
// and removes its stream, and concurrent calls should not wait on one lock
// for it.
type streamIndex struct {
	shards [16]struct {
		mu sync.RWMutex
		m  map[string]*stream
		_  [32]byte // shards on separate cache lines
	}
}

// shardSeed spreads stream keys over the shards. (A key's last base64
// character would not: it carries 2 bits of the key and 4 of padding.)
var shardSeed = maphash.MakeSeed()

func (x *streamIndex) shard(key string) int {
	return int(maphash.String(shardSeed, key) % uint64(len(x.shards)))
}

func (x *streamIndex) put(st *stream) {
	sh := &x.shards[x.shard(st.skey)]
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = make(map[string]*stream)
	}
	sh.m[st.skey] = st
	sh.mu.Unlock()
}

func (x *streamIndex) get(key string) *stream {
	sh := &x.shards[x.shard(key)]
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	return sh.m[key]
}

// remove forgets st (not another stream under its key).
func (x *streamIndex) remove(st *stream) {
	sh := &x.shards[x.shard(st.skey)]
	sh.mu.Lock()
	if sh.m[st.skey] == st {
		delete(sh.m, st.skey)
	}
	sh.mu.Unlock()
}

// all returns every live stream.
func (x *streamIndex) all() []*stream {
	var sts []*stream
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		for _, st := range sh.m {
			sts = append(sts, st)
		}
		sh.mu.RUnlock()
	}
	return sts
}
