package boltstore

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mcprelay/mcprelay/eventlog"
)

// compactBudget bounds the events one compaction transaction deletes.
const compactBudget = 16 << 10

// writer is the single writer: it alone runs update transactions, and it
// alone touches the fields below, so they need no lock. Readers never see
// them; they read committed records from bbolt snapshots.
type writer struct {
	s        *Store
	sessions map[string]*session
	streams  map[string]*stream
	terminal queue[*stream] // terminal streams of all sessions, in order of their terminal append

	// Per transaction.
	tx                           *bolt.Tx
	sessB, strB, evB, idxB, ordB *bolt.Bucket
	dirty                        []*stream // stream records to write before commit
	arena                        []byte    // keys and values handed to bbolt, valid until commit
	err                          error     // first storage error of the transaction
	loadedEvents                 int
	lastSync                     time.Time
	unsynced                     bool
}

// session is the writer's view of one session: what retention needs.
type session struct {
	id       string
	num      uint64
	streams  map[uint64]*stream
	order    queue[run]     // retained events in append order, run-length encoded; mirrors bucket order
	terminal queue[*stream] // this session's terminal streams in order of their terminal append
	nextOrd  uint64
	events   int
	bytes    int64
	stale    int // runs in order whose stream was dropped
}

// run is n consecutive events (in session append order) of one stream,
// stored under order key sessNum|ord.
type run struct {
	st  *stream
	ord uint64
	n   int
}

type stream struct {
	streamRecord
	sess    *session
	runs    int // entries of sess.order that refer to this stream
	dirty   bool
	dropped bool
}

func (st *stream) retained() int { return int(st.rec.LastSeq + 1 - st.rec.FirstSeq) }

// bind points the writer at tx's buckets.
func (w *writer) bind(tx *bolt.Tx) {
	w.tx = tx
	w.sessB = tx.Bucket(bucketSessions)
	w.strB = tx.Bucket(bucketStreams)
	w.evB = tx.Bucket(bucketEvents)
	w.idxB = tx.Bucket(bucketIndex)
	w.ordB = tx.Bucket(bucketOrder)
	w.arena = nil
	w.err = nil
}

// alloc returns n bytes of the transaction's arena with length 0.
func (w *writer) alloc(n int) []byte {
	if len(w.arena)+n > cap(w.arena) {
		// Chunks grow with the transaction; bbolt keeps referring to the
		// old ones until commit, so they are never reused.
		w.arena = make([]byte, 0, max(n, min(2*cap(w.arena), 1<<20), 1<<10))
	}
	return w.arena[len(w.arena):len(w.arena)]
}

// keep marks b, returned by alloc and appended to, as used.
func (w *writer) keep(b []byte) []byte {
	w.arena = w.arena[:len(w.arena)+len(b)]
	return b
}

func (w *writer) pair(a, b uint64) []byte { return w.keep(pair(w.alloc(16), a, b)) }

func (w *writer) put(b *bolt.Bucket, k, v []byte) {
	if err := b.Put(k, v); err != nil && w.err == nil {
		w.err = err
	}
}

func (w *writer) del(b *bolt.Bucket, k []byte) {
	if err := b.Delete(k); err != nil && w.err == nil {
		w.err = err
	}
}

func (w *writer) markDirty(st *stream) {
	if !st.dirty {
		st.dirty = true
		w.dirty = append(w.dirty, st)
	}
}

// flush writes the dirty stream records.
func (w *writer) flush() {
	for _, st := range w.dirty {
		st.dirty = false
		if !st.dropped {
			n := 128 + len(st.rec.Session) + len(st.rec.RequestID) // bounds appendStream's output
			w.put(w.strB, []byte(st.rec.Key), w.keep(appendStream(w.alloc(n), &st.streamRecord)))
		}
	}
	clear(w.dirty)
	w.dirty = w.dirty[:0]
}

// load creates the buckets and rebuilds the writer's state (Open).
func (w *writer) load(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketMeta, bucketSessions, bucketStreams, bucketEvents, bucketIndex, bucketOrder} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	meta := tx.Bucket(bucketMeta)
	switch v := meta.Get(keyVersion); {
	case v == nil:
		if err := meta.Put(keyVersion, binary.AppendUvarint(nil, formatVersion)); err != nil {
			return err
		}
	default:
		if ver, _ := binary.Uvarint(v); ver != formatVersion {
			return fmt.Errorf("boltstore: file format version %d, want %d", ver, formatVersion)
		}
	}
	w.bind(tx)
	w.sessions = make(map[string]*session)
	w.streams = make(map[string]*stream)
	byNum := make(map[uint64]*session)
	err := w.sessB.ForEach(func(k, v []byte) error {
		num, err := sessionNum(v)
		if err != nil {
			return fmt.Errorf("session %q: %w", k, err)
		}
		ss := &session{id: string(k), num: num, streams: make(map[uint64]*stream)}
		w.sessions[ss.id], byNum[num] = ss, ss
		return nil
	})
	if err != nil {
		return err
	}
	streamByNum := make(map[uint64]*stream)
	var terminal []*stream
	err = w.strB.ForEach(func(k, v []byte) error {
		r, err := decodeStream(string(k), v)
		if err != nil {
			return fmt.Errorf("stream %q: %w", k, err)
		}
		ss := byNum[r.sessNum]
		if ss == nil {
			return fmt.Errorf("stream %q: %w: unknown session", k, ErrCorrupt)
		}
		st := &stream{streamRecord: r, sess: ss}
		w.streams[r.rec.Key], streamByNum[r.num], ss.streams[r.num] = st, st, st
		ss.events += st.retained()
		ss.bytes += st.bytes
		w.loadedEvents += st.retained()
		if r.rec.Terminal {
			terminal = append(terminal, st)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Terminal streams in order of their terminal append.
	slices.SortFunc(terminal, func(a, b *stream) int { return cmp.Compare(a.terminalAt, b.terminalAt) })
	for _, st := range terminal {
		w.terminal.push(st)
		st.sess.terminal.push(st)
	}
	// Append order: keys sort by session, then ord. Runs of streams that no
	// longer exist are stale; drop them now.
	var stale [][]byte
	err = w.ordB.ForEach(func(k, v []byte) error {
		if len(k) != 16 || len(v) < 9 {
			return fmt.Errorf("order key %x: %w", k, ErrCorrupt)
		}
		ss := byNum[beUint64(k)]
		st := streamByNum[beUint64(v)]
		n, _ := binary.Uvarint(v[8:])
		if ss == nil || st == nil || st.sess != ss || n == 0 {
			stale = append(stale, bytes.Clone(k))
			return nil
		}
		ord := beUint64(k[8:])
		ss.order.push(run{st: st, ord: ord, n: int(n)})
		st.runs++
		ss.nextOrd = ord + 1
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range stale {
		w.del(w.ordB, k)
	}
	return w.err
}

func beUint64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

// run is the writer goroutine: it commits batches of pending ops, runs
// compaction steps and, under SyncInterval, periodic fsyncs.
func (w *writer) run() {
	s := w.s
	defer close(s.stopped)
	tick := min(max(s.ret.TerminalGrace/2, 10*time.Millisecond), time.Second)
	if s.sync == SyncInterval {
		tick = min(tick, s.ivl)
	}
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	w.lastSync = time.Now()
	quitting := false
	for {
		select {
		case <-s.kick:
		case <-ticker.C:
		case <-s.quit:
			quitting = true
		}
		// Commit what is pending, then one bounded compaction step if
		// one is due, and again until neither has work: appends wait for
		// at most one compaction transaction.
		for {
			s.mu.Lock()
			ops := s.pending
			s.pending = nil
			s.mu.Unlock()
			if len(ops) > 0 {
				w.commit(ops)
			}
			more := !quitting && s.failedErr() == nil && w.compact()
			if len(ops) == 0 && !more {
				break
			}
		}
		w.maybeSync(quitting)
		if quitting {
			return
		}
	}
}

func (s *Store) failedErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// fail poisons the store: the writer's in-memory state no longer matches
// the file, so every later write fails until the file is reopened.
func (w *writer) fail(err error) error {
	err = fmt.Errorf("%w: %w", ErrFailed, err)
	w.s.log.Error("boltstore: write failed; store refuses writes until reopened", logErr, err)
	w.s.mu.Lock()
	if w.s.failed == nil {
		w.s.failed = err
	}
	w.s.mu.Unlock()
	return err
}

// commit applies ops in one transaction and completes them once it is
// committed (and, under SyncAlways, durable).
func (w *writer) commit(ops []*op) {
	err := w.s.failedErr()
	if err == nil {
		err = w.update(func(now time.Time) {
			for _, o := range ops {
				o.err = o.apply(w, now)
			}
		})
	}
	for _, o := range ops {
		if err != nil {
			o.err = err
		}
		close(o.done)
	}
}

// update runs f in a write transaction and commits it. A storage error
// poisons the store and is returned.
func (w *writer) update(f func(now time.Time)) error {
	tx, err := w.s.db.Begin(true)
	if err != nil {
		return w.fail(err)
	}
	w.bind(tx)
	f(w.s.now())
	w.flush()
	if w.err != nil {
		tx.Rollback()
		return w.fail(w.err)
	}
	w.s.commitMu.Lock()
	err = tx.Commit()
	w.s.commitMu.Unlock()
	w.tx, w.arena = nil, nil
	if err != nil {
		return w.fail(err)
	}
	w.unsynced = w.s.sync == SyncInterval
	return nil
}

// maybeSync fsyncs under SyncInterval when the interval has passed (or the
// store is closing, which Close handles).
func (w *writer) maybeSync(quitting bool) {
	if !w.unsynced || quitting || time.Since(w.lastSync) < w.s.ivl {
		return
	}
	if err := w.s.db.Sync(); err != nil {
		w.fail(err)
	}
	w.lastSync, w.unsynced = time.Now(), false
}

// compact drops expired terminal streams in one bounded transaction and
// reports whether more are due.
func (w *writer) compact() (more bool) {
	now := w.s.now()
	due := func() bool {
		for w.terminal.len() > 0 && (*w.terminal.front()).dropped {
			w.terminal.pop()
		}
		if w.terminal.len() == 0 {
			return false
		}
		st := *w.terminal.front()
		return expired(true, st.terminalAt, now, w.s.ret.TerminalGrace)
	}
	if !due() {
		return false
	}
	err := w.update(func(time.Time) {
		budget := compactBudget
		for budget > 0 && due() {
			st := w.terminal.pop()
			budget -= st.retained() + 1
			w.dropStream(st)
		}
	})
	return err == nil && due()
}

func (w *writer) createSession(id string, v []byte) error {
	if w.sessions[id] != nil {
		return eventlog.ErrExists
	}
	num, err := w.sessB.NextSequence()
	if err != nil {
		w.err = err
		return err
	}
	binary.BigEndian.PutUint64(v, num)
	w.put(w.sessB, []byte(id), v)
	w.sessions[id] = &session{id: id, num: num, streams: make(map[uint64]*stream)}
	return nil
}

func (w *writer) updateSession(id string, v []byte) error {
	ss := w.sessions[id]
	if ss == nil {
		return eventlog.ErrNotFound
	}
	binary.BigEndian.PutUint64(v, ss.num)
	w.put(w.sessB, []byte(id), v)
	return nil
}

func (w *writer) deleteSession(id string) error {
	ss := w.sessions[id]
	if ss == nil {
		return eventlog.ErrNotFound
	}
	for _, st := range ss.streams {
		w.dropStream(st)
	}
	for ss.order.len() > 0 {
		r := ss.order.pop()
		w.del(w.ordB, w.pair(ss.num, r.ord))
	}
	w.del(w.sessB, []byte(id))
	delete(w.sessions, id)
	return nil
}

func (w *writer) createStream(rec eventlog.Stream, now time.Time) error {
	ss := w.sessions[rec.Session]
	if ss == nil {
		return eventlog.ErrNotFound
	}
	if old := w.streams[rec.Key]; old != nil {
		if !expired(old.rec.Terminal, old.terminalAt, now, w.s.ret.TerminalGrace) {
			return eventlog.ErrExists
		}
		w.dropStream(old)
	}
	num, err := w.strB.NextSequence()
	if err != nil {
		w.err = err
		return err
	}
	st := &stream{streamRecord: streamRecord{num: num, sessNum: ss.num, rec: rec}, sess: ss}
	w.streams[rec.Key], ss.streams[num] = st, st
	w.put(w.idxB, w.pair(ss.num, num), []byte(rec.Key))
	w.markDirty(st)
	return nil
}

func (w *writer) append(key string, terminal bool, events []eventlog.Event, now time.Time) (uint64, error) {
	st := w.streams[key]
	if st == nil {
		return 0, eventlog.ErrNotFound
	}
	ss := st.sess
	w.expire(ss, now)
	if st.dropped {
		return 0, eventlog.ErrNotFound
	}
	if st.rec.Terminal {
		return 0, eventlog.ErrTerminal
	}
	if len(events) == 0 {
		return st.rec.LastSeq, nil
	}
	var n int64
	for i := range events {
		e := &events[i]
		st.rec.LastSeq++
		e.Seq = st.rec.LastSeq
		v := w.keep(appendEvent(w.alloc(binary.MaxVarintLen64+len(e.Type)+len(e.Data)), e))
		w.put(w.evB, w.pair(st.num, e.Seq), v)
		n += int64(len(e.Data))
	}
	st.bytes += n
	ss.bytes += n
	ss.events += len(events)
	if b := ss.order.back(); b != nil && b.st == st {
		b.n += len(events)
		w.putRun(ss, b)
	} else {
		ss.order.push(run{st: st, ord: ss.nextOrd, n: len(events)})
		ss.nextOrd++
		st.runs++
		w.putRun(ss, ss.order.back())
	}
	if terminal {
		st.rec.Terminal = true
		st.terminalAt = now.UnixNano()
		w.terminal.push(st)
		ss.terminal.push(st)
	}
	w.markDirty(st)
	w.evict(ss)
	return st.rec.LastSeq, nil
}

func (w *writer) putRun(ss *session, r *run) {
	v := w.keep(binary.AppendUvarint(binary.BigEndian.AppendUint64(w.alloc(8+binary.MaxVarintLen64), r.st.num), uint64(r.n)))
	w.put(w.ordB, w.pair(ss.num, r.ord), v)
}

// evict drops the session's oldest events until it is within its budget,
// always keeping the newest event.
func (w *writer) evict(ss *session) {
	ret := &w.s.ret
	var touched *run
	for (ss.events > ret.MaxEvents || ss.bytes > ret.MaxBytes) && ss.events > 1 {
		r := ss.order.front()
		st := r.st
		if st.dropped {
			w.del(w.ordB, w.pair(ss.num, r.ord))
			ss.order.pop()
			ss.stale--
			continue
		}
		k := w.pair(st.num, st.rec.FirstSeq)
		size := eventDataLen(w.evB.Get(k))
		w.del(w.evB, k)
		st.rec.FirstSeq++
		st.bytes -= size
		ss.bytes -= size
		ss.events--
		w.markDirty(st)
		if r.n--; r.n == 0 {
			w.del(w.ordB, w.pair(ss.num, r.ord))
			ss.order.pop()
			st.runs--
			touched = nil
		} else {
			touched = r
		}
	}
	if touched != nil {
		w.putRun(ss, touched)
	}
}

// expire drops the session's terminal streams whose grace has passed.
func (w *writer) expire(ss *session, now time.Time) {
	for ss.terminal.len() > 0 {
		st := *ss.terminal.front()
		if !st.dropped && !expired(true, st.terminalAt, now, w.s.ret.TerminalGrace) {
			return
		}
		ss.terminal.pop()
		if !st.dropped {
			w.dropStream(st)
		}
	}
}

// dropStream deletes one stream, its events and its index entry. Its runs
// in the session's order stay as stale entries until eviction reaches them
// or they exceed a quarter of the order, when they are purged.
func (w *writer) dropStream(st *stream) {
	ss := st.sess
	for seq := st.rec.FirstSeq; seq <= st.rec.LastSeq; seq++ {
		w.del(w.evB, w.pair(st.num, seq))
	}
	w.del(w.strB, []byte(st.rec.Key))
	w.del(w.idxB, w.pair(ss.num, st.num))
	ss.events -= st.retained()
	ss.bytes -= st.bytes
	ss.stale += st.runs
	st.runs = 0
	st.dropped = true
	delete(ss.streams, st.num)
	if w.streams[st.rec.Key] == st {
		delete(w.streams, st.rec.Key)
	}
	if ss.stale > 16 && 4*ss.stale > ss.order.len() {
		w.purgeStale(ss)
	}
}

// purgeStale removes the runs of dropped streams from the session's order.
func (w *writer) purgeStale(ss *session) {
	var order queue[run]
	for ss.order.len() > 0 {
		r := ss.order.pop()
		if r.st.dropped {
			w.del(w.ordB, w.pair(ss.num, r.ord))
			continue
		}
		order.push(r)
	}
	ss.order, ss.stale = order, 0
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
