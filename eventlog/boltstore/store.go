package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/mcprelay/mcprelay/eventlog"
)

// Errors returned by the store besides the eventlog sentinels.
var (
	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("boltstore: store is closed")
	// ErrCorrupt reports a stored record the store cannot decode.
	ErrCorrupt = errors.New("boltstore: corrupt record")
	// ErrFailed wraps the write or fsync error after which the store
	// refuses further writes; reopen the file to recover.
	ErrFailed = errors.New("boltstore: store failed")

	errEmptyID       = errors.New("boltstore: empty session ID")
	errEmptyKey      = errors.New("boltstore: empty stream key")
	errLongKey       = fmt.Errorf("boltstore: session ID or stream key longer than %d bytes", bolt.MaxKeySize-16)
	errEmptyTerminal = errors.New("boltstore: terminal append without events")
	errSyncPolicy    = errors.New("boltstore: unknown sync policy")
)

// SyncPolicy says when appended events reach the disk.
type SyncPolicy int

const (
	// SyncAlways: an Append returns only after its events are durable
	// (fsync); concurrent appends share one transaction and fsync.
	SyncAlways SyncPolicy = iota
	// SyncInterval: fsync about every Options.Interval; an OS crash or power
	// loss loses at most about that window.
	SyncInterval
	// SyncNone: never fsync explicitly (tests, benchmarks).
	SyncNone
)

var syncNames = [...]string{SyncAlways: "always", SyncInterval: "interval", SyncNone: "none"}

// String returns the policy's name as ParseSyncPolicy accepts it.
func (p SyncPolicy) String() string {
	if p < 0 || int(p) >= len(syncNames) {
		return fmt.Sprintf("SyncPolicy(%d)", int(p))
	}
	return syncNames[p]
}

// ParseSyncPolicy parses "always", "interval" or "none".
func ParseSyncPolicy(s string) (SyncPolicy, error) {
	for p, name := range syncNames {
		if s == name {
			return SyncPolicy(p), nil
		}
	}
	return 0, fmt.Errorf("%w %q (want always, interval or none)", errSyncPolicy, s)
}

// Options configure Open. The zero value is usable.
type Options struct {
	// Retention bounds what is kept per session; zero fields take the
	// eventlog defaults (10000 events, 8 MiB, 5m terminal grace).
	Retention eventlog.Retention
	// Sync is the durability policy; default SyncAlways.
	Sync SyncPolicy
	// Interval is the fsync period under SyncInterval; default 100ms.
	Interval time.Duration
	// Logger receives start-up statistics and write failures; nil discards.
	Logger *slog.Logger
}

// Retention defaults, the same as the eventlog package's.
const (
	defaultMaxEvents     = 10000
	defaultMaxBytes      = 8 << 20
	defaultTerminalGrace = 5 * time.Minute
	defaultInterval      = 100 * time.Millisecond
)

// Log attribute keys.
const (
	logPath     = "path"
	logSessions = "sessions"
	logStreams  = "streams"
	logEvents   = "events"
	logElapsed  = "elapsed"
	logErr      = "err"
)

// Store is an eventlog.Store in one bbolt file. It is safe for concurrent
// use. Create it with Open and release it with Close.
type Store struct {
	db   *bolt.DB
	ret  eventlog.Retention
	sync SyncPolicy
	ivl  time.Duration
	log  *slog.Logger
	now  func() time.Time

	// commitMu is held for writing while a transaction commits (and, under
	// SyncAlways, fsyncs) and for reading while a reader opens its
	// snapshot, so no reader sees a transaction that is not yet durable.
	commitMu sync.RWMutex

	mu      sync.Mutex // guards pending, shut and failed
	pending []*op
	shut    bool
	failed  error

	closed    atomic.Bool
	kick      chan struct{} // cap 1: pending has ops
	quit      chan struct{} // closed by Close
	stopped   chan struct{} // closed when the writer goroutine returns
	closeOnce sync.Once
	closeErr  error

	w writer // owned by the writer goroutine (and by Open before it starts)
}

var _ eventlog.Store = (*Store)(nil)

// Open opens or creates (mode 0600) the store file at path, rebuilds the
// per-session retention state from it and starts the writer goroutine.
// It fails after a second if another process holds the file.
func Open(path string, opts Options) (*Store, error) {
	return open(path, opts, time.Now)
}

// open is Open with the clock that terminal grace is measured on.
func open(path string, opts Options, now func() time.Time) (*Store, error) {
	if opts.Sync < SyncAlways || opts.Sync > SyncNone {
		return nil, fmt.Errorf("%w %d", errSyncPolicy, opts.Sync)
	}
	r := opts.Retention
	if r.MaxEvents <= 0 {
		r.MaxEvents = defaultMaxEvents
	}
	if r.MaxBytes <= 0 {
		r.MaxBytes = defaultMaxBytes
	}
	if r.TerminalGrace <= 0 {
		r.TerminalGrace = defaultTerminalGrace
	}
	if opts.Interval <= 0 {
		opts.Interval = defaultInterval
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        time.Second,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		NoSync:         opts.Sync != SyncAlways,
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	s := &Store{
		db:      db,
		ret:     r,
		sync:    opts.Sync,
		ivl:     opts.Interval,
		log:     log,
		now:     now,
		kick:    make(chan struct{}, 1),
		quit:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	s.w.s = s
	if err := db.Update(s.w.load); err != nil {
		db.Close()
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	log.Info("boltstore: opened", logPath, path, logSessions, len(s.w.sessions),
		logStreams, len(s.w.streams), logEvents, s.w.loadedEvents, logElapsed, time.Since(start))
	go s.w.run()
	return s, nil
}

// op is one mutation, applied by the writer goroutine inside a shared
// transaction. apply must either fail before writing anything or succeed.
type op struct {
	apply func(w *writer, now time.Time) error
	err   error
	done  chan struct{}
}

// do hands apply to the writer and waits until its transaction is committed
// (and durable under SyncAlways).
func (s *Store) do(ctx context.Context, apply func(w *writer, now time.Time) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	o := &op{apply: apply, done: make(chan struct{})}
	s.mu.Lock()
	switch {
	case s.shut:
		s.mu.Unlock()
		return ErrClosed
	case s.failed != nil:
		err := s.failed
		s.mu.Unlock()
		return err
	}
	s.pending = append(s.pending, o)
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	<-o.done
	return o.err
}

// view begins a read-only snapshot that contains only committed (under
// SyncAlways: durable) transactions. The caller must Rollback it.
func (s *Store) view(ctx context.Context) (*bolt.Tx, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.commitMu.RLock()
	tx, err := s.db.Begin(false)
	s.commitMu.RUnlock()
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return nil, ErrClosed
	}
	return tx, err
}

func checkKey(k string, empty error) error {
	switch {
	case k == "":
		return empty
	case len(k) > bolt.MaxKeySize-16:
		return errLongKey
	}
	return nil
}

// CreateSession implements [eventlog.Sessions].
func (s *Store) CreateSession(ctx context.Context, sess *eventlog.Session) error {
	if err := checkKey(sess.ID, errEmptyID); err != nil {
		return err
	}
	id, v := sess.ID, encodeSession(0, sess)
	return s.do(ctx, func(w *writer, _ time.Time) error { return w.createSession(id, v) })
}

// Session implements [eventlog.Sessions].
func (s *Store) Session(ctx context.Context, id string) (*eventlog.Session, error) {
	tx, err := s.view(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	v := tx.Bucket(bucketSessions).Get([]byte(id))
	if v == nil {
		return nil, eventlog.ErrNotFound
	}
	_, sess, err := decodeSession(id, v)
	return sess, err
}

// UpdateSession implements [eventlog.Sessions].
func (s *Store) UpdateSession(ctx context.Context, sess *eventlog.Session) error {
	id, v := sess.ID, encodeSession(0, sess)
	return s.do(ctx, func(w *writer, _ time.Time) error { return w.updateSession(id, v) })
}

// DeleteSession implements [eventlog.Sessions].
func (s *Store) DeleteSession(ctx context.Context, id string) error {
	return s.do(ctx, func(w *writer, _ time.Time) error { return w.deleteSession(id) })
}

// CreateStream implements [eventlog.Log].
func (s *Store) CreateStream(ctx context.Context, st *eventlog.Stream) error {
	if err := checkKey(st.Key, errEmptyKey); err != nil {
		return err
	}
	rec := eventlog.Stream{
		Key:        st.Key,
		Session:    st.Session,
		Generation: st.Generation,
		RequestID:  bytes.Clone(st.RequestID),
		FirstSeq:   1,
	}
	return s.do(ctx, func(w *writer, now time.Time) error { return w.createStream(rec, now) })
}

// Append implements [eventlog.Log]. It returns once the events are committed
// and, under SyncAlways, durable; only then can Read return them.
func (s *Store) Append(ctx context.Context, key string, terminal bool, events ...eventlog.Event) (uint64, error) {
	if terminal && len(events) == 0 {
		return 0, errEmptyTerminal
	}
	var last uint64
	err := s.do(ctx, func(w *writer, now time.Time) (err error) {
		last, err = w.append(key, terminal, events, now)
		return err
	})
	return last, err
}

// Read implements [eventlog.Log] with one bbolt cursor Seek, O(log n + k).
// The events' Data are copies, packed into a few shared allocations.
func (s *Store) Read(ctx context.Context, key string, after uint64, limit int, buf []eventlog.Event) (eventlog.Stream, []eventlog.Event, error) {
	buf = buf[:0]
	tx, err := s.view(ctx)
	if err != nil {
		return eventlog.Stream{}, buf, err
	}
	defer tx.Rollback()
	v := tx.Bucket(bucketStreams).Get([]byte(key))
	if v == nil {
		return eventlog.Stream{}, buf, eventlog.ErrNotFound
	}
	r, err := decodeStream(key, v)
	if err != nil {
		return eventlog.Stream{}, buf, err
	}
	if expired(r.rec.Terminal, r.terminalAt, s.now(), s.ret.TerminalGrace) {
		return eventlog.Stream{}, buf, eventlog.ErrNotFound
	}
	if limit <= 0 || after >= r.rec.LastSeq {
		return r.rec, buf, nil
	}
	from := max(after+1, r.rec.FirstSeq)
	var arena []byte
	c := tx.Bucket(bucketEvents).Cursor()
	seek := pair(make([]byte, 0, 16), r.num, from)
	for k, v := c.Seek(seek); k != nil && len(buf) < limit; k, v = c.Next() {
		if len(k) != 16 || !bytes.Equal(k[:8], seek[:8]) {
			break
		}
		e, err := decodeEvent(beUint64(k[8:]), v)
		if err != nil {
			return eventlog.Stream{}, buf[:0], err
		}
		if e.Seq > r.rec.LastSeq {
			break
		}
		if len(arena)+len(e.Data) > cap(arena) {
			arena = make([]byte, 0, max(len(e.Data), 32<<10))
		}
		n := len(arena)
		arena = append(arena, e.Data...)
		e.Data = arena[n:len(arena):len(arena)]
		buf = append(buf, e)
	}
	return r.rec, buf, nil
}

// Streams implements [eventlog.Log] through the session's index.
func (s *Store) Streams(ctx context.Context, session string) ([]eventlog.Stream, error) {
	tx, err := s.view(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	sv := tx.Bucket(bucketSessions).Get([]byte(session))
	if sv == nil {
		return nil, nil
	}
	num, err := sessionNum(sv)
	if err != nil {
		return nil, err
	}
	now := s.now()
	streams := tx.Bucket(bucketStreams)
	var out []eventlog.Stream
	prefix := pair(nil, num, 0)[:8]
	c := tx.Bucket(bucketIndex).Cursor()
	for k, key := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, key = c.Next() {
		v := streams.Get(key)
		if v == nil {
			continue
		}
		r, err := decodeStream(string(key), v)
		if err != nil {
			return nil, err
		}
		if !expired(r.rec.Terminal, r.terminalAt, now, s.ret.TerminalGrace) {
			out = append(out, r.rec)
		}
	}
	return out, nil
}

// Close flushes pending appends, stops the background goroutine and closes
// the file. Later calls return nil; other methods then fail with ErrClosed.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.mu.Lock()
		s.shut = true
		s.mu.Unlock()
		close(s.quit)
		<-s.stopped
		if s.sync == SyncInterval {
			s.closeErr = s.db.Sync()
		}
		if err := s.db.Close(); s.closeErr == nil {
			s.closeErr = err
		}
	})
	return s.closeErr
}
