package eventlog

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// numShards is the number of lock shards of each Memory index.
const numShards = 64

// Memory is the in-memory Store (the default). It never holds more than its
// Retention per session. The zero value is not usable; call [NewMemory].
//
// Lock order: a session-index shard, then a session, then a stream-index
// shard. No goroutine takes an earlier lock while holding a later one.
type Memory struct {
	ret        Retention
	seed       maphash.Seed
	epoch      time.Time     // origin of nextSweep, read with its monotonic clock
	sweepEvery time.Duration // between two sweep steps (one shard each)

	nextSweep  atomic.Int64 // nanoseconds since epoch of the next sweep step
	sweepShard atomic.Uint32
	closed     atomic.Bool
	size       atomic.Int64 // what Size reports

	sessions [numShards]sessionShard
	streams  [numShards]streamShard
}

var _ Store = (*Memory)(nil)

type sessionShard struct {
	mu sync.RWMutex
	m  map[string]*memSession
	_  [32]byte // keep shards on separate cache lines
}

type streamShard struct {
	mu sync.RWMutex
	m  map[string]*memStream
	_  [32]byte
}

// memSession is one session: its record, its live streams and the order in
// which its retained events were appended. All fields are guarded by mu.
type memSession struct {
	mu       sync.Mutex
	rec      Session
	gone     bool             // deleted or store closed
	stale    int32            // runs in order that refer to dropped streams (beside gone: one word, and 320 bytes in all, not 352)
	streams  []*memStream     // live streams; memStream.idx is the index here
	order    ring[run]        // retained events in append order, run-length encoded by stream
	terminal ring[*memStream] // terminal streams in order of their terminal append
	events   int              // retained events across streams
	bytes    int64            // sum of len(Data) of retained events
	recBytes int64            // recordBytes(&rec)
}

// run is n consecutive events (in session append order) of one stream.
type run struct {
	s *memStream
	n int
}

// memStream is one stream; its fields are guarded by sess.mu.
type memStream struct {
	sess       *memSession
	rec        Stream // FirstSeq is derived, see record
	events     ring[Event]
	bytes      int64
	runs       int // entries of sess.order that refer to this stream
	idx        int // index in sess.streams
	terminalAt time.Time
	dropped    bool
}

// NewMemory returns an empty in-memory store that keeps at most r per session.
func NewMemory(r Retention) *Memory {
	m := &Memory{ret: r.withDefaults(), seed: maphash.MakeSeed(), epoch: time.Now()}
	// A full sweep of all shards takes about TerminalGrace, clamped to [1s, 1m].
	full := min(max(m.ret.TerminalGrace, time.Second), time.Minute)
	m.sweepEvery = full / numShards
	for i := range m.sessions {
		m.sessions[i].m = make(map[string]*memSession)
		m.streams[i].m = make(map[string]*memStream)
	}
	return m
}

func (m *Memory) shard(s string) int { return int(maphash.String(m.seed, s) % numShards) }

func (m *Memory) check(ctx context.Context) error {
	if m.closed.Load() {
		return errClosed
	}
	return ctx.Err()
}

// CreateSession implements [Sessions].
func (m *Memory) CreateSession(ctx context.Context, s *Session) error {
	if err := m.check(ctx); err != nil {
		return err
	}
	if s.ID == "" {
		return errEmptyID
	}
	ss := &memSession{rec: cloneSession(s), recBytes: recordBytes(s)}
	sh := &m.sessions[m.shard(s.ID)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[s.ID]; ok {
		return ErrExists
	}
	sh.m[s.ID] = ss
	m.size.Add(ss.recBytes)
	return nil
}

func (m *Memory) lookupSession(id string) *memSession {
	sh := &m.sessions[m.shard(id)]
	sh.mu.RLock()
	ss := sh.m[id]
	sh.mu.RUnlock()
	return ss
}

// Session implements [Sessions].
func (m *Memory) Session(ctx context.Context, id string) (*Session, error) {
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	ss := m.lookupSession(id)
	if ss == nil {
		return nil, ErrNotFound
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.gone {
		return nil, ErrNotFound
	}
	c := cloneSession(&ss.rec)
	return &c, nil
}

// UpdateSession implements [Sessions].
func (m *Memory) UpdateSession(ctx context.Context, s *Session) error {
	if err := m.check(ctx); err != nil {
		return err
	}
	ss := m.lookupSession(s.ID)
	if ss == nil {
		return ErrNotFound
	}
	c := cloneSession(s)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.gone {
		return ErrNotFound
	}
	ss.rec = c
	n := recordBytes(s)
	m.size.Add(n - ss.recBytes)
	ss.recBytes = n
	return nil
}

// DeleteSession implements [Sessions].
func (m *Memory) DeleteSession(ctx context.Context, id string) error {
	if err := m.check(ctx); err != nil {
		return err
	}
	sh := &m.sessions[m.shard(id)]
	sh.mu.Lock()
	ss := sh.m[id]
	delete(sh.m, id)
	sh.mu.Unlock()
	if ss == nil {
		return ErrNotFound
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	m.dropSessionLocked(ss)
	return nil
}

// Retained returns the events and bytes of event data the store holds,
// across all sessions.
func (m *Memory) Retained() (events, bytes int64) {
	for i := range m.sessions {
		sh := &m.sessions[i]
		sh.mu.RLock()
		for _, ss := range sh.m {
			ss.mu.Lock()
			events += int64(ss.events)
			bytes += ss.bytes
			ss.mu.Unlock()
		}
		sh.mu.RUnlock()
	}
	return events, bytes
}

// dropSessionLocked marks ss gone and drops all its streams and events.
func (m *Memory) dropSessionLocked(ss *memSession) {
	ss.gone = true
	m.size.Add(-ss.bytes - ss.recBytes)
	ss.recBytes = 0
	for _, st := range ss.streams {
		st.dropped = true
		st.events = ring[Event]{}
		m.unindex(st)
	}
	ss.streams = nil
	ss.order = ring[run]{}
	ss.terminal = ring[*memStream]{}
	ss.events, ss.bytes, ss.stale = 0, 0, 0
}

// unindex removes st from the stream index if it is still the stream under its key.
func (m *Memory) unindex(st *memStream) {
	sh := &m.streams[m.shard(st.rec.Key)]
	sh.mu.Lock()
	if sh.m[st.rec.Key] == st {
		delete(sh.m, st.rec.Key)
	}
	sh.mu.Unlock()
}

// CreateStream implements [Log].
func (m *Memory) CreateStream(ctx context.Context, s *Stream) error {
	if err := m.check(ctx); err != nil {
		return err
	}
	if s.Key == "" {
		return errEmptyKey
	}
	ss := m.lookupSession(s.Session)
	if ss == nil {
		return ErrNotFound
	}
	st := &memStream{
		sess: ss,
		rec: Stream{
			Key:        s.Key,
			Session:    s.Session,
			Generation: s.Generation,
			RequestID:  cloneBytes(s.RequestID),
		},
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.gone {
		return ErrNotFound
	}
	sh := &m.streams[m.shard(s.Key)]
	sh.mu.Lock()
	_, taken := sh.m[s.Key]
	if !taken {
		sh.m[s.Key] = st
	}
	sh.mu.Unlock()
	if taken {
		return ErrExists
	}
	st.idx = len(ss.streams)
	ss.streams = append(ss.streams, st)
	return nil
}

func (m *Memory) lookupStream(key string) *memStream {
	sh := &m.streams[m.shard(key)]
	sh.mu.RLock()
	st := sh.m[key]
	sh.mu.RUnlock()
	return st
}

// Append implements [Log].
func (m *Memory) Append(ctx context.Context, key string, terminal bool, events ...Event) (uint64, error) {
	if err := m.check(ctx); err != nil {
		return 0, err
	}
	if terminal && len(events) == 0 {
		return 0, errEmptyTerminal
	}
	st := m.lookupStream(key)
	if st == nil {
		return 0, ErrNotFound
	}
	now := time.Now()
	ss := st.sess
	ss.mu.Lock()
	m.expireLocked(ss, now)
	if st.dropped {
		ss.mu.Unlock()
		return 0, ErrNotFound
	}
	if st.rec.Terminal {
		ss.mu.Unlock()
		return 0, ErrTerminal
	}
	if len(events) > 0 {
		var n int64
		for i := range events {
			st.rec.LastSeq++
			events[i].Seq = st.rec.LastSeq
			st.events.push(events[i])
			n += int64(len(events[i].Data))
		}
		st.bytes += n
		ss.bytes += n
		m.size.Add(n)
		ss.events += len(events)
		if ss.order.len() > 0 && ss.order.back().s == st {
			ss.order.back().n += len(events)
		} else {
			ss.order.push(run{s: st, n: len(events)})
			st.runs++
		}
		if terminal {
			st.rec.Terminal = true
			st.terminalAt = now
			ss.terminal.push(st)
		}
		m.evictLocked(ss)
	}
	last := st.rec.LastSeq
	ss.mu.Unlock()
	m.maybeSweep(now)
	return last, nil
}

// evictLocked drops the session's oldest events until it is within its
// budget, always keeping the newest event.
func (m *Memory) evictLocked(ss *memSession) {
	for (ss.events > m.ret.MaxEvents || ss.bytes > m.ret.MaxBytes) && ss.events > 1 {
		r := ss.order.at(0)
		if r.s.dropped {
			ss.order.popFront()
			ss.stale--
			continue
		}
		st := r.s
		ev := st.events.popFront()
		st.bytes -= int64(len(ev.Data))
		ss.bytes -= int64(len(ev.Data))
		m.size.Add(-int64(len(ev.Data)))
		ss.events--
		if r.n--; r.n == 0 {
			st.runs--
			ss.order.popFront()
		}
	}
}

// expireLocked drops the session's terminal streams whose grace has passed.
func (m *Memory) expireLocked(ss *memSession, now time.Time) {
	for ss.terminal.len() > 0 {
		st := *ss.terminal.at(0)
		if !st.dropped && now.Sub(st.terminalAt) < m.ret.TerminalGrace {
			return
		}
		ss.terminal.popFront()
		if !st.dropped {
			m.dropStreamLocked(ss, st)
		}
	}
}

// dropStreamLocked removes one stream and its events from a live session.
func (m *Memory) dropStreamLocked(ss *memSession, st *memStream) {
	st.dropped = true
	ss.events -= st.events.len()
	ss.bytes -= st.bytes
	m.size.Add(-st.bytes)
	st.events, st.bytes = ring[Event]{}, 0
	ss.stale += int32(st.runs)
	st.runs = 0
	last := len(ss.streams) - 1
	ss.streams[st.idx] = ss.streams[last]
	ss.streams[st.idx].idx = st.idx
	ss.streams[last] = nil
	ss.streams = ss.streams[:last]
	m.unindex(st)
	if ss.stale > 16 && 4*int(ss.stale) > ss.order.len() {
		compactLocked(ss)
	}
}

// compactLocked rebuilds ss.order without the runs of dropped streams,
// merging runs of one stream that become adjacent. dropStreamLocked calls it
// once stale runs exceed a quarter of the list, so its cost is amortized
// over the drops that made them stale.
func compactLocked(ss *memSession) {
	var order ring[run]
	for i := range ss.order.len() {
		r := *ss.order.at(i)
		if r.s.dropped {
			continue
		}
		if order.len() > 0 && order.back().s == r.s {
			order.back().n += r.n
			r.s.runs--
			continue
		}
		order.push(r)
	}
	ss.order, ss.stale = order, 0
}

// maybeSweep expires terminal streams of one shard of sessions if a sweep
// step is due. Sessions that are never touched again still lose their
// expired streams this way.
func (m *Memory) maybeSweep(now time.Time) {
	t := int64(now.Sub(m.epoch))
	next := m.nextSweep.Load()
	if t < next || !m.nextSweep.CompareAndSwap(next, t+int64(m.sweepEvery)) {
		return
	}
	sh := &m.sessions[m.sweepShard.Add(1)%numShards]
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	for _, ss := range sh.m {
		ss.mu.Lock()
		if ss.terminal.len() > 0 {
			m.expireLocked(ss, now)
		}
		ss.mu.Unlock()
	}
}

// record returns the stream's record with FirstSeq derived from what is retained.
func (st *memStream) record() Stream {
	r := st.rec
	r.FirstSeq = r.LastSeq + 1 - uint64(st.events.len())
	return r
}

// Read implements [Log].
func (m *Memory) Read(ctx context.Context, key string, after uint64, max int, buf []Event) (Stream, []Event, error) {
	buf = buf[:0]
	if err := m.check(ctx); err != nil {
		return Stream{}, buf, err
	}
	st := m.lookupStream(key)
	if st == nil {
		return Stream{}, buf, ErrNotFound
	}
	ss := st.sess
	ss.mu.Lock()
	defer ss.mu.Unlock()
	m.expireLocked(ss, time.Now())
	if st.dropped {
		return Stream{}, buf, ErrNotFound
	}
	rec := st.record()
	if max > 0 && after < rec.LastSeq {
		from := after + 1
		if from < rec.FirstSeq {
			from = rec.FirstSeq
		}
		k := rec.LastSeq - from + 1
		if k > uint64(max) {
			k = uint64(max)
		}
		buf = st.events.appendTo(buf, int(from-rec.FirstSeq), int(k))
	}
	return rec, buf, nil
}

// Streams implements [Log].
func (m *Memory) Streams(ctx context.Context, session string) ([]Stream, error) {
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	ss := m.lookupSession(session)
	if ss == nil {
		return nil, nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	m.expireLocked(ss, time.Now())
	if ss.gone || len(ss.streams) == 0 {
		return nil, nil
	}
	out := make([]Stream, len(ss.streams))
	for i, st := range ss.streams {
		out[i] = st.record()
	}
	return out, nil
}

// ListSessions returns a summary of every session, in any order. Each is
// consistent in itself; sessions created or deleted meanwhile may or may
// not be listed.
func (m *Memory) ListSessions(ctx context.Context) ([]SessionSummary, error) {
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	var all []*memSession
	for i := range m.sessions {
		sh := &m.sessions[i]
		sh.mu.RLock()
		for _, ss := range sh.m {
			all = append(all, ss)
		}
		sh.mu.RUnlock()
	}
	out := make([]SessionSummary, 0, len(all))
	now := time.Now()
	for _, ss := range all {
		ss.mu.Lock()
		m.expireLocked(ss, now)
		if !ss.gone {
			out = append(out, SessionSummary{Session: cloneSession(&ss.rec), Streams: len(ss.streams), Events: ss.events, Bytes: ss.bytes})
		}
		ss.mu.Unlock()
	}
	return out, nil
}

// TouchSession records a use of the session at at: its LastUsed becomes at
// if that is later (see [Store]).
func (m *Memory) TouchSession(ctx context.Context, id string, at time.Time) error {
	if err := m.check(ctx); err != nil {
		return err
	}
	ss := m.lookupSession(id)
	if ss == nil {
		return ErrNotFound
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.gone {
		return ErrNotFound
	}
	if at.After(ss.rec.LastUsed) {
		ss.rec.LastUsed = at
	}
	return nil
}

// IdleSessions returns up to limit IDs of sessions last used before
// before, in any order (see [Store]).
func (m *Memory) IdleSessions(ctx context.Context, before time.Time, limit int) ([]string, error) {
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	var out []string
	for i := range m.sessions {
		sh := &m.sessions[i]
		sh.mu.RLock()
		for id, ss := range sh.m {
			if len(out) >= limit {
				break
			}
			ss.mu.Lock()
			if !ss.gone && ss.rec.IdleSince(before) {
				out = append(out, id)
			}
			ss.mu.Unlock()
		}
		sh.mu.RUnlock()
	}
	return out, nil
}

// Size reports the bytes the store holds for its sessions: the data of
// every retained event, and each session record's initialize params and
// recorded requests. It is what relay.Limits.MaxStoreBytes bounds; the
// maps and structures around them (a few hundred bytes per session and
// stream) are not counted.
func (m *Memory) Size(ctx context.Context) (int64, error) {
	if err := m.check(ctx); err != nil {
		return 0, err
	}
	return m.size.Load(), nil
}

// recordBytes is what a session record counts toward Size.
func recordBytes(s *Session) int64 {
	n := int64(len(s.InitializeParams))
	for _, r := range s.Replay {
		n += int64(len(r))
	}
	return n
}

// Close drops everything the store holds. Later calls fail. Close is
// idempotent.
func (m *Memory) Close() error {
	if m.closed.Swap(true) {
		return nil
	}
	for i := range m.sessions {
		sh := &m.sessions[i]
		sh.mu.Lock()
		old := sh.m
		sh.m = make(map[string]*memSession)
		sh.mu.Unlock()
		for _, ss := range old {
			ss.mu.Lock()
			m.dropSessionLocked(ss)
			ss.mu.Unlock()
		}
	}
	return nil
}
