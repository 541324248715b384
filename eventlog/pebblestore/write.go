package pebblestore

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/mcprelay/mcprelay/eventlog"
)

// rangeDeleteMin is the number of consecutive events from which deleting
// them takes one range tombstone instead of point tombstones.
const rangeDeleteMin = 16

// txn is one write: a Pebble batch plus the streams whose records it
// changes. A session's writes hold session.mu from begin to commit.
type txn struct {
	s       *Store
	b       *pebble.Batch
	now     time.Time
	dirty   []*stream // records to write and publish
	dropped []*stream // streams to unpublish
	sync    bool      // commit with an fsync whatever the policy
	key     []byte    // scratch; the batch copies keys and values
	val     []byte
}

var txnPool = sync.Pool{New: func() any { return new(txn) }}

func (s *Store) begin() *txn {
	t := txnPool.Get().(*txn)
	t.s, t.b, t.now = s, s.db.NewBatch(), s.now()
	return t
}

// release returns t to the pool; commit must have run or t be abandoned.
func (t *txn) release() {
	if t.b != nil {
		t.b.Close()
	}
	clear(t.dirty)
	clear(t.dropped)
	*t = txn{dirty: t.dirty[:0], dropped: t.dropped[:0], key: t.key[:0], val: t.val[:0]}
	txnPool.Put(t)
}

func (t *txn) markDirty(st *stream) {
	if !st.dirty {
		st.dirty = true
		t.dirty = append(t.dirty, st)
	}
}

func (t *txn) set(k, v []byte) { _ = t.b.Set(k, v, nil) } // errors only on a closed batch
func (t *txn) del(k []byte)    { _ = t.b.Delete(k, nil) }

// delEvents deletes the stream's events with seqs in [from, to).
func (t *txn) delEvents(st *stream, from, to uint64) {
	if to-from >= rangeDeleteMin {
		var k [2 * eventKeyLen]byte
		lo := eventKey(k[:0], st.sessNum, st.num, from)
		_ = t.b.DeleteRange(lo, eventKey(lo[len(lo):len(lo)], st.sessNum, st.num, to), nil)
		return
	}
	for seq := from; seq < to; seq++ {
		t.key = eventKey(t.key[:0], st.sessNum, st.num, seq)
		t.del(t.key)
	}
}

func (t *txn) putRun(ss *session, r *run) {
	t.key = pairKey(t.key[:0], kindOrder, ss.num, r.ord)
	t.val = binary.AppendUvarint(binary.BigEndian.AppendUint64(t.val[:0], r.st.num), uint64(r.n))
	t.set(t.key, t.val)
}

// commit writes the dirty stream records, commits the batch with the
// store's write options (or wo, if not nil), then publishes the changed
// streams to readers. A failed commit poisons the store.
func (s *Store) commit(t *txn, wo *pebble.WriteOptions) error {
	for _, st := range t.dirty {
		st.dirty = false
		if !st.dropped {
			t.key = pairKey(t.key[:0], kindStream, st.sessNum, st.num)
			t.val = appendStream(t.val[:0], &st.streamRecord)
			t.set(t.key, t.val)
		}
	}
	synced := false
	if !t.b.Empty() {
		if wo == nil {
			wo = s.wo
		}
		if t.sync {
			wo = pebble.Sync
		}
		if err := t.b.Commit(wo); err != nil {
			return s.fail(err)
		}
		if err := s.failed.Load(); err != nil {
			// Pebble reported a fatal error (see pebbleLogger.Fatalf),
			// maybe during this very commit: it may not be durable.
			return *err
		}
		synced = wo.Sync
		if s.sync == SyncInterval && !synced {
			s.unsynced.Store(true)
		}
	}
	for _, st := range t.dirty {
		if st.dropped {
			continue
		}
		if synced {
			st.synced = st.rec.LastSeq
		}
		tail := st.tail
		st.tail = nil
		for len(tail) > 0 && tail[0].Seq < st.rec.FirstSeq {
			tail = tail[1:] // evicted by the same write
		}
		if len(tail) == 0 {
			tail = nil
		}
		st.pubMu.Lock()
		created := st.pubState == pubPending
		st.pubState, st.pub, st.pubTermAt, st.pubHoles, st.pubTail = pubLive, st.rec, st.terminalAt, st.holes, tail
		st.pubMu.Unlock()
		if tail != nil {
			s.tails.add(st, tail)
		}
		if created {
			st.sess.viewMu.Lock()
			st.sess.shown.add(st)
			st.sess.viewMu.Unlock()
		}
	}
	if len(t.dropped) > 0 {
		s.unpublish(t.dropped)
	}
	return nil
}

// unpublish hides dropped streams from readers.
func (s *Store) unpublish(dropped []*stream) {
	for _, st := range dropped {
		st.pubMu.Lock()
		st.pubState, st.pubTail = pubGone, nil
		st.pubMu.Unlock()
		st.sess.viewMu.Lock()
		st.sess.shown.remove(st)
		st.sess.viewMu.Unlock()
	}
	s.mu.Lock()
	for _, st := range dropped {
		if s.streams[st.rec.Key] == st {
			delete(s.streams, st.rec.Key)
		}
	}
	s.mu.Unlock()
}

// fail poisons the store: its in-memory state no longer matches what is
// committed, so every later write fails until the directory is reopened.
func (s *Store) fail(err error) error {
	err = fmt.Errorf("%w: %w: %w", eventlog.ErrUnavailable, ErrFailed, err)
	if s.failed.CompareAndSwap(nil, &err) {
		s.log.Error("pebblestore: write failed; store refuses writes until reopened", logErr, err)
		return err
	}
	return *s.failed.Load()
}

// CreateSession implements [eventlog.Sessions].
func (s *Store) CreateSession(ctx context.Context, sess *eventlog.Session) error {
	if sess.ID == "" {
		return errEmptyID
	}
	if err := s.enter(ctx, true); err != nil {
		return err
	}
	defer s.leave()
	s.mu.Lock()
	if s.sessions[sess.ID] != nil {
		s.mu.Unlock()
		return eventlog.ErrExists
	}
	s.nextSess++
	ss := newSession(sess.ID, s.nextSess)
	ss.mu.Lock() // new: never blocks
	defer ss.mu.Unlock()
	s.sessions[ss.id] = ss
	s.mu.Unlock()

	t := s.begin()
	defer t.release()
	t.key = sessionKey(t.key[:0], ss.id)
	t.set(t.key, encodeSession(ss.num, sess))
	if err := s.commit(t, nil); err != nil {
		s.mu.Lock()
		delete(s.sessions, ss.id)
		s.mu.Unlock()
		return err
	}
	ss.recMu.Lock()
	ss.live = true
	ss.recMu.Unlock()
	return nil
}

// lockSession returns the live session id with its mu held, or nil.
func (s *Store) lockSession(id string) *session {
	ss := s.session(id)
	if ss == nil {
		return nil
	}
	ss.mu.Lock()
	if !ss.live {
		ss.mu.Unlock()
		return nil
	}
	return ss
}

// UpdateSession implements [eventlog.Sessions].
func (s *Store) UpdateSession(ctx context.Context, sess *eventlog.Session) error {
	if err := s.enter(ctx, true); err != nil {
		return err
	}
	defer s.leave()
	ss := s.lockSession(sess.ID)
	if ss == nil {
		return eventlog.ErrNotFound
	}
	defer ss.mu.Unlock()
	return s.putRecord(ss, sess)
}

// putRecord commits sess as ss's record; ss.mu is held.
func (s *Store) putRecord(ss *session, sess *eventlog.Session) error {
	t := s.begin()
	defer t.release()
	t.key = sessionKey(t.key[:0], ss.id)
	t.set(t.key, encodeSession(ss.num, sess))
	ss.recMu.Lock()
	defer ss.recMu.Unlock()
	return s.commit(t, nil)
}

// TouchSession records a use of the session at at: its LastUsed becomes at
// if that is later (see [eventlog.Store]).
func (s *Store) TouchSession(ctx context.Context, id string, at time.Time) error {
	if err := s.enter(ctx, true); err != nil {
		return err
	}
	defer s.leave()
	ss := s.lockSession(id)
	if ss == nil {
		return eventlog.ErrNotFound
	}
	defer ss.mu.Unlock()
	// ss.mu serialises the session's writes: the record read here is the
	// one the write replaces.
	v, closer, err := s.db.Get(sessionKey(make([]byte, 0, 1+len(id)), id))
	if errors.Is(err, pebble.ErrNotFound) {
		return eventlog.ErrNotFound
	}
	if err != nil {
		return err
	}
	_, sess, err := decodeSession(id, v)
	closer.Close()
	if err != nil {
		return err
	}
	if !at.After(sess.LastUsed) {
		return nil
	}
	sess.LastUsed = at
	return s.putRecord(ss, sess)
}

// DeleteSession implements [eventlog.Sessions] with range deletions, so
// its cost does not grow with the session's events.
func (s *Store) DeleteSession(ctx context.Context, id string) error {
	if err := s.enter(ctx, true); err != nil {
		return err
	}
	defer s.leave()
	ss := s.lockSession(id)
	if ss == nil {
		return eventlog.ErrNotFound
	}
	defer ss.mu.Unlock()
	t := s.begin()
	defer t.release()
	t.key = sessionKey(t.key[:0], id)
	t.del(t.key)
	for _, kind := range []byte{kindStream, kindIdent, kindOrder, kindEvent} {
		var k [18]byte
		lo := prefixKey(k[:0], kind, ss.num)
		_ = t.b.DeleteRange(lo, prefixKey(lo[len(lo):len(lo)], kind, ss.num+1), nil)
	}
	for _, st := range ss.streams {
		st.dropped = true
		t.dropped = append(t.dropped, st)
	}
	ss.recMu.Lock()
	defer ss.recMu.Unlock()
	if err := s.commit(t, nil); err != nil {
		return err
	}
	ss.live = false
	for ss.terminal.len() > 0 {
		s.unheap(ss.terminal.pop())
	}
	s.garbage.Add(ss.bytes)
	s.retained(-int64(ss.events), -ss.bytes)
	ss.streams = nil
	ss.order, ss.terminal = queue[run]{}, queue[*stream]{}
	ss.events, ss.bytes, ss.stale = 0, 0, 0
	s.mu.Lock()
	if s.sessions[id] == ss {
		delete(s.sessions, id)
	}
	s.mu.Unlock()
	return nil
}

// CreateStream implements [eventlog.Log]. Under SyncAlways the record is
// durable when it returns.
func (s *Store) CreateStream(ctx context.Context, in *eventlog.Stream) error {
	return s.createStream(ctx, in, nil)
}

// CreateStreamUnsynced is CreateStream without waiting for the disk: the
// record is committed and visible at once, and durable once a later synced
// write of this store has returned (under SyncAlways: any Append, of any
// stream, that started after it returned; or [Store.Sync]). The WAL is one
// sequence, so a synced write makes everything before it durable.
//
// The relay creates each call's stream with it: the call's response, one
// synced Append, then makes the stream durable together with its events,
// one fsync per call instead of two. A caller that names the stream to
// anyone (a cursor) before such a write must call Sync first.
func (s *Store) CreateStreamUnsynced(ctx context.Context, in *eventlog.Stream) error {
	return s.createStream(ctx, in, pebble.NoSync)
}

// Sync makes every write committed before it was called as durable as
// the policy makes an acknowledged write: under SyncAlways, one WAL fsync,
// shared with the commits waiting for one at the same time; under
// SyncInterval and SyncNone nothing (their writes are not durable when
// acknowledged either).
func (s *Store) Sync(ctx context.Context) error {
	if err := s.enter(ctx, true); err != nil {
		return err
	}
	defer s.leave()
	if s.sync != SyncAlways {
		return nil
	}
	if err := s.db.LogData(nil, pebble.Sync); err != nil {
		return s.fail(err)
	}
	if err := s.failed.Load(); err != nil {
		return *err
	}
	return nil
}

func (s *Store) createStream(ctx context.Context, in *eventlog.Stream, wo *pebble.WriteOptions) error {
	if in.Key == "" {
		return errEmptyKey
	}
	if err := s.enter(ctx, true); err != nil {
		return err
	}
	defer s.leave()
	ss := s.lockSession(in.Session)
	if ss == nil {
		return eventlog.ErrNotFound
	}
	defer ss.mu.Unlock()
	t := s.begin()
	defer t.release()
	s.expire(t, ss)

	s.mu.Lock()
	if old := s.streams[in.Key]; old != nil {
		// A key may be reused once its terminal stream has expired; an
		// expired stream of another session is dropped by its own session
		// or the background goroutine.
		rec, terminalAt, state := old.published()
		if state == pubPending || state == pubLive && !expired(rec.Terminal, terminalAt, t.now, s.ret.TerminalGrace) {
			s.mu.Unlock()
			// Commit what expire dropped.
			if err := s.commit(t, nil); err != nil {
				return err
			}
			return eventlog.ErrExists
		}
	}
	s.nextStream++
	st := &stream{
		streamRecord: streamRecord{
			num:     s.nextStream,
			sessNum: ss.num,
			rec: eventlog.Stream{
				Key:        in.Key,
				Session:    ss.id,
				Generation: in.Generation,
				RequestID:  bytes.Clone(in.RequestID),
				FirstSeq:   1,
			},
		},
		sess: ss,
	}
	s.streams[in.Key] = st
	s.mu.Unlock()
	ss.streams.add(st)
	t.key = pairKey(t.key[:0], kindIdent, ss.num, st.num)
	t.val = appendIdent(t.val[:0], &st.streamRecord)
	t.set(t.key, t.val)
	t.markDirty(st)
	if err := s.commit(t, wo); err != nil {
		st.dropped = true
		ss.streams.remove(st)
		s.unpublish([]*stream{st})
		return err
	}
	return nil
}

// Append implements [eventlog.Log]. It returns once the events are
// committed and, under SyncAlways, durable; only then can Read return them.
// Appends of different sessions commit concurrently and share WAL fsyncs;
// appends of one session are serialised, so one stream's stay in order.
func (s *Store) Append(ctx context.Context, key string, terminal bool, events ...eventlog.Event) (uint64, error) {
	if terminal && len(events) == 0 {
		return 0, errEmptyTerminal
	}
	if err := s.enter(ctx, true); err != nil {
		return 0, err
	}
	defer s.leave()
	st := s.stream(key)
	if st == nil {
		return 0, eventlog.ErrNotFound
	}
	ss := st.sess
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t := s.begin()
	defer t.release()
	s.expire(t, ss)
	var last uint64
	var err error
	switch {
	case st.dropped:
		err = eventlog.ErrNotFound
	case st.rec.Terminal:
		err = eventlog.ErrTerminal
	case len(events) == 0:
		last = st.rec.LastSeq
	default:
		last = s.appendEvents(t, st, terminal, events)
	}
	if cerr := s.commit(t, nil); cerr != nil {
		return 0, cerr
	}
	return last, err
}

// appendEvents adds events to t and updates the session's retention state.
func (s *Store) appendEvents(t *txn, st *stream, terminal bool, events []eventlog.Event) uint64 {
	ss := st.sess
	first := max(st.rec.LastSeq, st.floor) + 1
	if first > st.rec.LastSeq+1 {
		// Seqs a crashed process may have handed out: skip them.
		if st.rec.FirstSeq <= st.rec.LastSeq {
			st.holes = append(st.holes, hole{st.rec.LastSeq + 1, first})
		} else {
			st.rec.FirstSeq = first
		}
	}
	r := ss.order.back()
	if r == nil || r.st != st {
		ss.order.push(run{st: st, ord: ss.nextOrd})
		ss.nextOrd++
		st.runs++
		r = ss.order.back()
	}
	var n int64
	for i := range events {
		e := &events[i]
		e.Seq = first + uint64(i)
		op := t.b.SetDeferred(eventKeyLen, eventValueLen(e))
		putEventKey(op.Key, ss.num, st.num, e.Seq)
		putEventValue(op.Value, e)
		_ = op.Finish()
		n += int64(len(e.Data))
		r.sizes = append(r.sizes, uint32(len(e.Data)))
	}
	st.tail = tailOf(events, n)
	r.n += len(events)
	t.putRun(ss, r)
	st.rec.LastSeq = first + uint64(len(events)) - 1
	if st.rec.LastSeq > st.synced+seqReserve {
		t.sync = true // see seqReserve
	}
	st.bytes += n
	ss.bytes += n
	ss.events += len(events)
	s.retained(int64(len(events)), n)
	if terminal {
		st.rec.Terminal = true
		st.terminalAt = t.now.UnixNano()
		ss.terminal.push(st)
		s.termMu.Lock()
		heap.Push(&s.terminal, st)
		s.termMu.Unlock()
	}
	t.markDirty(st)
	s.evict(t, ss)
	return st.rec.LastSeq
}

// evict drops the session's oldest events until it is within its budget,
// always keeping the newest event.
func (s *Store) evict(t *txn, ss *session) {
	ret := &s.ret
	over := func() bool { return (ss.events > ret.MaxEvents || ss.bytes > ret.MaxBytes) && ss.events > 1 }
	if !over() {
		return
	}
	var z sizer
	defer z.close()
	var touched *run
	for over() {
		r := ss.order.front()
		st := r.st
		if st.dropped {
			t.key = pairKey(t.key[:0], kindOrder, ss.num, r.ord)
			t.del(t.key)
			ss.order.pop()
			ss.stale--
			continue
		}
		from := st.rec.FirstSeq
		seq := from
		k := 0
		for k < r.n && over() {
			var size int64
			if r.unknown > 0 {
				size = z.size(s, st, seq)
				r.unknown--
			} else {
				size = int64(r.sizes[0])
				r.sizes = r.sizes[1:]
			}
			st.bytes -= size
			ss.bytes -= size
			ss.events--
			s.retained(-1, -size)
			k++
			seq = st.nextSeq(seq)
		}
		st.rec.FirstSeq = seq
		for len(st.holes) > 0 && st.holes[0].to <= seq {
			st.holes = st.holes[1:]
		}
		t.delEvents(st, from, st.rec.FirstSeq)
		t.markDirty(st)
		if r.n -= k; r.n == 0 {
			t.key = pairKey(t.key[:0], kindOrder, ss.num, r.ord)
			t.del(t.key)
			ss.order.pop()
			st.runs--
			touched = nil
		} else {
			touched = r
		}
	}
	if touched != nil {
		t.putRun(ss, touched)
	}
}

// sizer reads the sizes of stored events for eviction, walking one
// iterator forward while the seqs are consecutive.
type sizer struct {
	it          *pebble.Iterator
	stream, seq uint64
	key         []byte
}

func (z *sizer) size(s *Store, st *stream, seq uint64) int64 {
	if z.it == nil {
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindEvent}, UpperBound: []byte{kindEvent + 1}})
		if err != nil {
			return 0
		}
		z.it = it
	}
	z.key = eventKey(z.key[:0], st.sessNum, st.num, seq)
	var ok bool
	if z.stream == st.num && z.seq+1 == seq && z.it.Valid() {
		ok = z.it.Next()
	} else {
		ok = z.it.SeekGE(z.key)
	}
	z.stream, z.seq = st.num, seq
	if !ok || !bytes.Equal(z.it.Key(), z.key) {
		z.stream = 0
		return 0 // missing: nothing to account for
	}
	v, err := z.it.ValueAndErr()
	if err != nil {
		return 0
	}
	return eventDataLen(v)
}

func (z *sizer) close() {
	if z.it != nil {
		z.it.Close()
	}
}

// expire drops the session's terminal streams whose grace has passed.
func (s *Store) expire(t *txn, ss *session) {
	for ss.terminal.len() > 0 {
		st := *ss.terminal.front()
		if !st.dropped && !expired(true, st.terminalAt, t.now, s.ret.TerminalGrace) {
			return
		}
		ss.terminal.pop()
		if !st.dropped {
			s.dropStream(t, st)
		}
	}
}

// dropStream deletes one stream's record and events. Its runs in the
// session's order stay as stale entries until eviction reaches them or
// they exceed a quarter of the order, when they are purged.
func (s *Store) dropStream(t *txn, st *stream) {
	ss := st.sess
	t.delEvents(st, st.rec.FirstSeq, st.rec.LastSeq+1)
	t.key = pairKey(t.key[:0], kindStream, ss.num, st.num)
	t.del(t.key)
	t.key = pairKey(t.key[:0], kindIdent, ss.num, st.num)
	t.del(t.key)
	ss.events -= st.retained()
	ss.bytes -= st.bytes
	s.retained(-int64(st.retained()), -st.bytes)
	s.garbage.Add(st.bytes)
	s.unheap(st)
	ss.stale += st.runs
	st.runs = 0
	st.dropped = true
	ss.streams.remove(st)
	t.dropped = append(t.dropped, st)
	if ss.stale > 16 && 4*ss.stale > ss.order.len() {
		var order queue[run]
		for ss.order.len() > 0 {
			r := ss.order.pop()
			if r.st.dropped {
				t.key = pairKey(t.key[:0], kindOrder, ss.num, r.ord)
				t.del(t.key)
				continue
			}
			order.push(r)
		}
		ss.order, ss.stale = order, 0
	}
}

// run is the background goroutine: it drops expired terminal streams and,
// under SyncInterval, fsyncs the WAL about every Interval.
func (s *Store) run() {
	defer close(s.stopped)
	tick := min(max(s.ret.TerminalGrace/2, 10*time.Millisecond), time.Second)
	if s.sync == SyncInterval {
		tick = min(tick, s.ivl)
	}
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-ticker.C:
		}
		s.compact()
		if s.unsynced.Swap(false) && s.failed.Load() == nil {
			if err := s.db.LogData(nil, pebble.Sync); err != nil {
				s.fail(err)
			}
		}
		s.compactDisk()
	}
}

// compactDisk compacts the whole key space once enough was deleted (see
// compactGarbage): deleted sessions then cost no disk space, and a restart
// reads nothing of them.
func (s *Store) compactDisk() {
	g := s.garbage.Load()
	if g < compactGarbage || s.failed.Load() != nil {
		return
	}
	if usage := s.db.Metrics().DiskSpaceUsage(); uint64(g) < usage/2 {
		return
	}
	s.garbage.Add(-g)
	start := time.Now()
	if err := s.db.Compact(s.ctx, []byte{0}, []byte{0xff}, false); err != nil {
		if s.ctx.Err() == nil {
			s.log.Warn("pebblestore: compacting after deletions", logErr, err)
		}
		return
	}
	s.log.Debug("pebblestore: compacted after deletions", "deleted", g, logElapsed, time.Since(start))
}

// compact drops every terminal stream whose grace has passed, one session
// at a time, each in its own small unsynced batch (a later synced commit
// makes it durable; if it is lost, it is simply done again).
func (s *Store) compact() {
	for s.failed.Load() == nil {
		select {
		case <-s.quit:
			return
		default:
		}
		now := s.now()
		s.termMu.Lock()
		if len(s.terminal) == 0 || !expired(true, s.terminal[0].terminalAt, now, s.ret.TerminalGrace) {
			s.termMu.Unlock()
			return
		}
		st := heap.Pop(&s.terminal).(*stream)
		s.termMu.Unlock()
		ss := st.sess
		ss.mu.Lock()
		if !st.dropped {
			t := s.begin()
			s.expire(t, ss)
			s.commit(t, pebble.NoSync)
			t.release()
		}
		ss.mu.Unlock()
	}
}

// queue is a FIFO on a slice.
type queue[T any] struct {
	s    []T
	head int
}

func (q *queue[T]) len() int { return len(q.s) - q.head }

func (q *queue[T]) push(v T) { q.s = append(q.s, v) }

func (q *queue[T]) front() *T {
	if q.len() == 0 {
		return nil
	}
	return &q.s[q.head]
}

func (q *queue[T]) back() *T {
	if q.len() == 0 {
		return nil
	}
	return &q.s[len(q.s)-1]
}

func (q *queue[T]) pop() T {
	var zero T
	v := q.s[q.head]
	q.s[q.head] = zero
	q.head++
	switch {
	case q.head == len(q.s):
		q.s, q.head = q.s[:0], 0
	case q.head >= 32 && 2*q.head >= len(q.s):
		n := copy(q.s, q.s[q.head:])
		clear(q.s[n:])
		q.s, q.head = q.s[:n], 0
	}
	return v
}
