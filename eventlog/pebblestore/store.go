package pebblestore

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcprelay/mcprelay/eventlog"
)

// Errors returned by the store besides the eventlog sentinels.
var (
	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("pebblestore: store is closed")
	// ErrCorrupt reports a stored record the store cannot decode.
	ErrCorrupt = errors.New("pebblestore: corrupt record")
	// ErrFailed wraps the write error (or Pebble's fatal error) after which
	// the store refuses further writes; reopen the directory to recover.
	// Errors that wrap it also wrap eventlog.ErrUnavailable.
	ErrFailed = errors.New("pebblestore: store failed")
	// ErrReadOnly is returned by every write to a store opened with
	// Options.ReadOnly.
	ErrReadOnly = errors.New("pebblestore: opened read-only")

	errEmptyID       = errors.New("pebblestore: empty session ID")
	errEmptyKey      = errors.New("pebblestore: empty stream key")
	errEmptyTerminal = errors.New("pebblestore: terminal append without events")
	errSyncPolicy    = errors.New("pebblestore: unknown sync policy")
)

// SyncPolicy says when appended events reach the disk.
type SyncPolicy int

// Sync policies.
const (
	// SyncAlways: an Append returns only after its events are durable (WAL
	// fsync); concurrent appends of all sessions share fsyncs.
	SyncAlways SyncPolicy = iota
	// SyncInterval: fsync the WAL about every Options.Interval; an OS crash
	// or power loss loses at most about that window.
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
	// Logger receives start-up statistics, Pebble's own messages (at debug
	// level, errors at error level) and write failures; nil discards.
	Logger *slog.Logger
	// ReadOnly opens an existing store for reading only: nothing is
	// written to the directory (Pebble replays its log in memory, the
	// store records no start-up marks, drops no expired stream, compacts
	// nothing) and every write returns ErrReadOnly. It still takes the
	// directory's lock: a directory another Store or process holds cannot
	// be opened, even read-only.
	ReadOnly bool
}

// Defaults, the same as the eventlog package's.
const (
	defaultMaxEvents     = 10000
	defaultMaxBytes      = 8 << 20
	defaultTerminalGrace = 5 * time.Minute
	defaultInterval      = 100 * time.Millisecond
	// memTableSize also sizes the WAL, which Pebble preallocates at about
	// 1.1 × memTableSize: 64 MiB reserved 71 MB on an idle data dir.
	memTableSize = 8 << 20
	cacheSize    = 64 << 20
	// compactGarbage: once sessions and streams holding this many bytes of
	// events were deleted (and at least half the disk usage), the
	// background goroutine compacts the whole key space, so that range
	// deletions free their disk space (Pebble alone leaves them for long).
	compactGarbage = 16 << 20
)

// seqReserve bounds, per stream, how far the seqs handed out (returned by
// Append and visible to Read) may run ahead of what is durable: under
// SyncInterval and SyncNone an append that would pass the last synced
// LastSeq by more than seqReserve is committed with an fsync. After a crash
// under those policies a stream's next seq is therefore its durable
// LastSeq + seqReserve + 1, never one a client may hold. Seqs are uint64:
// a hole of 2^16 per crash costs nothing, and a busy stream adds one fsync
// per 65536 events. A variable so that tests can exercise the forced fsync.
var seqReserve uint64 = 1 << 16

// Log attribute keys.
const (
	logDir      = "dir"
	logSessions = "sessions"
	logStreams  = "streams"
	logEvents   = "events"
	logElapsed  = "elapsed"
	logErr      = "err"
)

// Store is an eventlog.Store in one Pebble directory. It is safe for
// concurrent use. Create it with Open and release it with Close.
type Store struct {
	db   *pebble.DB
	ret  eventlog.Retention
	sync SyncPolicy
	wo   *pebble.WriteOptions
	ivl  time.Duration
	log  *slog.Logger
	now  func() time.Time

	// life is held for reading by every call while it uses db, and for
	// writing by Close, which so waits for calls in flight.
	life   sync.RWMutex
	closed bool // guarded by life

	failed atomic.Pointer[error] // set once a write failed

	mu         sync.RWMutex // guards the maps and counters below; held briefly
	sessions   map[string]*session
	streams    map[string]*stream
	nextSess   uint64
	nextStream uint64

	termMu   sync.Mutex
	terminal termHeap // terminal streams of all sessions by terminal time

	tails tailCache // the newest events of streams, for readers (see tailCache)

	fsync prometheus.Histogram // Pebble's WAL fsync latencies, in nanoseconds

	// Events and bytes of event data retained across sessions, kept with
	// each session's counters, for Retained.
	retEvents, retBytes atomic.Int64

	unsynced atomic.Bool  // SyncInterval: committed since the last WAL fsync
	garbage  atomic.Int64 // bytes of events deleted with their session or stream since the last compaction

	ctx    context.Context // cancelled by Close, to stop a compaction
	cancel context.CancelFunc

	crashed bool // the last process ran with a relaxed policy and did not Close

	bgMu      sync.Mutex // rate-limits the logging of Pebble's background errors
	bgLogged  time.Time
	bgSkipped int

	quit      chan struct{} // closed by Close
	stopped   chan struct{} // closed when the background goroutine returns
	closeOnce sync.Once
	closeErr  error
}

var _ eventlog.Store = (*Store)(nil)

// session is one session's state. Its writes are serialised by mu, which
// is held across their commit, so the in-memory retention state always
// matches what was committed and one stream's appends stay in order.
// Different sessions commit concurrently and so share WAL fsyncs.
type session struct {
	id  string
	num uint64

	mu    sync.Mutex   // serialises this session's writes; held across commit
	recMu sync.RWMutex // write-held while a change to the session record commits
	live  bool         // created and not deleted; written under mu and recMu

	// Writer state, guarded by mu.
	streams  streamSet
	order    queue[run]     // retained events in append order, run-length encoded; mirrors the "o" keys
	terminal queue[*stream] // terminal streams in order of their terminal append
	nextOrd  uint64
	events   int
	bytes    int64
	stale    int // runs in order whose stream was dropped

	viewMu sync.RWMutex
	shown  streamSet // published streams, for Streams
}

// streamSet is a session's streams. A session has few at a time (its
// standalone stream, the calls in flight, terminal streams within their
// grace), so they are a slice: two maps cost an idle session about 400
// bytes of heap.
type streamSet []*stream

func (set *streamSet) add(st *stream) { *set = append(*set, st) }

// remove removes st, if there, moving the last stream to its place; a
// set that shrank to a quarter of its capacity is reallocated.
func (set *streamSet) remove(st *stream) {
	s := *set
	i := slices.Index(s, st)
	if i < 0 {
		return
	}
	last := len(s) - 1
	s[i], s[last] = s[last], nil
	s = s[:last]
	if cap(s) > 8 && len(s) < cap(s)/4 {
		s = slices.Clone(s)
	}
	*set = s
}

// run is n consecutive events (in session append order) of one stream,
// stored under "o" sessNum ord. The sizes of its events (len(Data)) are
// kept in memory, so that eviction need not read what it deletes, except
// for the first unknown events: those were loaded at Open, which reads no
// events, and eviction looks their sizes up.
type run struct {
	st      *stream
	ord     uint64
	n       int
	unknown int      // leading events whose sizes are not in sizes
	sizes   []uint32 // sizes of the other n-unknown events, oldest first
}

// Publication states of a stream.
const (
	pubPending uint8 = iota // create not yet committed
	pubLive
	pubGone
)

type stream struct {
	streamRecord // writer state, guarded by sess.mu
	sess         *session
	runs         int // entries of sess.order that refer to this stream
	dirty        bool
	dropped      bool
	hpos         int // 1 + index in Store.terminal; 0 if not there; guarded by Store.termMu
	// floor: seqs up to it may have been handed out by a process that
	// crashed; the next append starts above it. synced: the highest seq
	// known to be durable (an fsync followed its commit).
	floor, synced uint64

	// tail: the events the current write appends, published with it as
	// pubTail; nil when not cached (see tailCache). Guarded by sess.mu.
	tail []eventlog.Event

	// What readers see: the record as of the last committed write.
	pubMu     sync.Mutex
	pubState  uint8
	pub       eventlog.Stream
	pubTermAt int64
	pubHoles  []hole
	pubTail   []eventlog.Event // the events of the last committed append, if cached; never modified
}

func (st *stream) retained() int {
	return int(st.rec.LastSeq + 1 - st.rec.FirstSeq - holeLen(st.holes))
}

// published returns the stream's committed record.
func (st *stream) published() (rec eventlog.Stream, terminalAt int64, state uint8) {
	st.pubMu.Lock()
	defer st.pubMu.Unlock()
	return st.pub, st.pubTermAt, st.pubState
}

// publishedHoles returns the holes of the committed record.
func (st *stream) publishedHoles() []hole {
	st.pubMu.Lock()
	defer st.pubMu.Unlock()
	return st.pubHoles
}

func newSession(id string, num uint64) *session {
	return &session{id: id, num: num}
}

// Open opens or creates the store in directory dir (created with mode
// 0700 if missing), rebuilds the per-session retention state from it and
// starts the background goroutine that drops expired terminal streams.
// It fails if another Store or process holds the directory.
func Open(dir string, opts Options) (*Store, error) {
	return open(dir, opts, time.Now, nil)
}

// open is Open with the clock that terminal grace is measured on and,
// if not nil, the file system Pebble uses.
func open(dir string, opts Options, now func() time.Time, fs vfs.FS) (*Store, error) {
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
	if fs == nil && !opts.ReadOnly {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("pebblestore: open %s: %w", dir, err)
		}
	}
	s := &Store{
		ret:      r,
		sync:     opts.Sync,
		wo:       pebble.NoSync,
		ivl:      opts.Interval,
		log:      log,
		now:      now,
		sessions: make(map[string]*session),
		streams:  make(map[string]*stream),
		quit:     make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if fs == nil {
		fs = vfs.Default
	}
	gfs := &guardFS{FS: fs}
	var opening atomic.Bool
	opening.Store(true)
	bgErrs := make(chan error, 1)
	popts := &pebble.Options{
		Logger:             pebbleLogger{log: log, s: s},
		MemTableSize:       memTableSize,
		CacheSize:          cacheSize,
		FormatMajorVersion: pebble.FormatNewest,
		FS:                 gfs,
		ReadOnly:           opts.ReadOnly,
		EventListener: &pebble.EventListener{BackgroundError: func(err error) {
			s.logBackground(err)
			if opening.Load() {
				select {
				case bgErrs <- err:
				default:
				}
			}
		}},
	}
	db, err := openPebble(dir, popts, gfs, bgErrs)
	opening.Store(false)
	if err == nil {
		if ferr := s.failed.Load(); ferr != nil {
			db.Close()
			err = *ferr
		}
	}
	if err != nil {
		return nil, fmt.Errorf("pebblestore: open %s: %w", dir, err)
	}
	s.db = db
	s.fsync = db.Metrics().LogWriter.FsyncLatency
	if opts.Sync == SyncAlways {
		s.wo = pebble.Sync
	}
	events, err := s.load(opts.ReadOnly)
	if err == nil {
		if ferr := s.failed.Load(); ferr != nil {
			err = *ferr
		}
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("pebblestore: open %s: %w", dir, err)
	}
	log.Info("pebblestore: opened", logDir, dir, logSessions, len(s.sessions),
		logStreams, len(s.streams), logEvents, events, logElapsed, time.Since(start), "read_only", opts.ReadOnly)
	if opts.ReadOnly {
		ro := ErrReadOnly
		s.failed.Store(&ro)
		close(s.stopped)
		return s, nil
	}
	go s.run()
	return s, nil
}

// openFailures is how many background errors pebble.Open may report
// before the store gives up on it.
const openFailures = 8

// openPebble runs pebble.Open, but gives up when it keeps failing in the
// background: Open waits for the flush of the recovered WAL, and Pebble
// retries a failed flush at once, forever, so on a full disk Open would
// spin without returning. Giving up returns the last error and slows that
// Pebble instance down (each file creation waits a second) instead of
// letting it spin; should it open after all (space came back), it is
// closed, which frees the directory for the next Open.
func openPebble(dir string, popts *pebble.Options, gfs *guardFS, bgErrs <-chan error) (*pebble.DB, error) {
	type result struct {
		db  *pebble.DB
		err error
	}
	done := make(chan result, 1)
	go func() {
		db, err := pebble.Open(dir, popts)
		done <- result{db, err}
	}()
	for failures := 0; ; {
		select {
		case r := <-done:
			return r.db, r.err
		case err := <-bgErrs:
			if failures++; failures >= openFailures {
				gfs.stall()
				go func() {
					if r := <-done; r.db != nil {
						r.db.Close()
					}
				}()
				return nil, fmt.Errorf("recovering the log keeps failing (%d times): %w", failures, err)
			}
		}
	}
}

// guardFS is the file system Pebble uses. Once stalled, creating a file
// first waits stallDelay.
type guardFS struct {
	vfs.FS
	stalled atomic.Bool
}

const stallDelay = time.Second

func (g *guardFS) stall() { g.stalled.Store(true) }

func (g *guardFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if g.stalled.Load() {
		time.Sleep(stallDelay)
	}
	return g.FS.Create(name, c)
}

func (g *guardFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if g.stalled.Load() {
		time.Sleep(stallDelay)
	}
	return g.FS.ReuseForWrite(oldname, newname, c)
}

// logBackground logs one of Pebble's background errors (a failed flush or
// compaction, which Pebble retries): the first at once, then at most one a
// second, with the number left out.
func (s *Store) logBackground(err error) {
	s.bgMu.Lock()
	now := time.Now()
	if !s.bgLogged.IsZero() && now.Sub(s.bgLogged) < time.Second {
		s.bgSkipped++
		s.bgMu.Unlock()
		return
	}
	skipped := s.bgSkipped
	s.bgLogged, s.bgSkipped = now, 0
	s.bgMu.Unlock()
	s.log.Error("pebble: background error", logErr, err.Error(), "suppressed", skipped)
}

// load checks the format version and rebuilds the in-memory state: it
// reads session, stream and order records, never events. readOnly: it
// writes nothing (and refuses a directory that needs an upgrade).
func (s *Store) load(readOnly bool) (events int, err error) {
	var ver byte // 0: new directory
	v, closer, err := s.db.Get(keyVersion)
	switch {
	case errors.Is(err, pebble.ErrNotFound) && readOnly:
		return 0, errors.New("pebblestore: not a store (no format version)")
	case errors.Is(err, pebble.ErrNotFound):
		if err := s.db.Set(keyVersion, []byte{formatVersion}, pebble.Sync); err != nil {
			return 0, err
		}
	case err != nil:
		return 0, err
	default:
		ver = v[0]
		closer.Close()
		switch ver {
		case formatVersion:
		case 1:
			if readOnly {
				return 0, errors.New("pebblestore: format version 1 needs an upgrade: open it once read-write")
			}
			if err := s.upgradeV1(); err != nil {
				return 0, fmt.Errorf("pebblestore: upgrading from format version 1: %w", err)
			}
		default:
			return 0, fmt.Errorf("pebblestore: format version %d, want %d", ver, formatVersion)
		}
	}
	last, closer, err := s.db.Get(keyRun)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		// A new directory, or one of an older version that did not record
		// its runs: assume the worst if it holds anything.
		s.crashed = ver != 0
	case err != nil:
		return 0, err
	default:
		s.crashed = len(last) == 0 || last[0] == runRelaxed
		closer.Close()
	}
	// After a relaxed crash the store stays marked relaxed until a Close
	// that leaves no stream with seqs still to skip (see Close): a crash
	// before then must make the next Open skip them too.
	mark := runRelaxed
	if s.sync == SyncAlways && !s.crashed {
		mark = runAlways
	}
	if !readOnly {
		if err := s.db.Set(keyRun, []byte{mark}, pebble.Sync); err != nil {
			return 0, err
		}
	}
	idents := make(map[string]streamRecord)
	err = s.scan(kindIdent, func(k, v []byte) error {
		var r streamRecord
		if len(k) != pairKeyLen || decodeIdent(v, &r) != nil {
			return fmt.Errorf("stream identity key %x: %w", k, ErrCorrupt)
		}
		idents[string(k[1:])] = r
		return nil
	})
	if err != nil {
		return 0, err
	}
	byNum := make(map[uint64]*session)
	byStream := make(map[uint64]*stream) // while loading: stream numbers are unique across sessions
	err = s.scan(kindSession, func(k, v []byte) error {
		if len(v) < 8 {
			return fmt.Errorf("session %q: %w", k[1:], ErrCorrupt)
		}
		ss := newSession(string(k[1:]), beUint64(v))
		ss.live = true
		s.sessions[ss.id], byNum[ss.num] = ss, ss
		s.nextSess = max(s.nextSess, ss.num)
		return nil
	})
	if err != nil {
		return 0, err
	}
	var terminal []*stream
	err = s.scan(kindStream, func(k, v []byte) error {
		if len(k) != pairKeyLen {
			return fmt.Errorf("stream key %x: %w", k, ErrCorrupt)
		}
		r, ok := idents[string(k[1:])]
		if !ok {
			return fmt.Errorf("stream key %x: %w: no identity record", k, ErrCorrupt)
		}
		if err := decodeStream(v, &r); err != nil {
			return fmt.Errorf("stream key %x: %w", k, err)
		}
		ss := byNum[beUint64(k[1:])]
		if ss == nil {
			return fmt.Errorf("stream %q: %w: unknown session", r.rec.Key, ErrCorrupt)
		}
		r.sessNum, r.num, r.rec.Session = ss.num, beUint64(k[9:]), ss.id
		st := &stream{streamRecord: r, sess: ss, pubState: pubLive, pub: r.rec, pubTermAt: r.terminalAt, pubHoles: r.holes,
			floor: r.rec.LastSeq, synced: r.rec.LastSeq}
		if s.crashed && !r.rec.Terminal {
			st.floor += seqReserve
		}
		ss.streams.add(st)
		ss.shown.add(st)
		byStream[r.num] = st
		// A key reused after its terminal stream expired: the newer wins.
		if old := s.streams[r.rec.Key]; old == nil || old.num < r.num {
			s.streams[r.rec.Key] = st
		}
		s.nextStream = max(s.nextStream, r.num)
		ss.events += st.retained()
		ss.bytes += st.bytes
		s.retained(int64(st.retained()), st.bytes)
		events += st.retained()
		if r.rec.Terminal {
			terminal = append(terminal, st)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	slices.SortFunc(terminal, func(a, b *stream) int { return cmp.Compare(a.terminalAt, b.terminalAt) })
	for _, st := range terminal {
		st.sess.terminal.push(st)
		s.terminal = append(s.terminal, st)
		st.hpos = len(s.terminal)
	}
	heap.Init(&s.terminal)
	// Append order: keys sort by session, then ord. Runs of streams that no
	// longer exist are stale; drop them now.
	b := s.db.NewBatch()
	defer b.Close()
	err = s.scan(kindOrder, func(k, v []byte) error {
		if len(k) != pairKeyLen || len(v) < 9 {
			return fmt.Errorf("order key %x: %w", k, ErrCorrupt)
		}
		ss := byNum[beUint64(k[1:])]
		n, _ := binary.Uvarint(v[8:])
		var st *stream
		if ss != nil {
			if st = byStream[beUint64(v)]; st != nil && st.sess != ss {
				st = nil
			}
		}
		if st == nil || n == 0 {
			return b.Delete(k, nil)
		}
		ord := beUint64(k[9:])
		ss.order.push(run{st: st, ord: ord, n: int(n), unknown: int(n)})
		st.runs++
		ss.nextOrd = ord + 1
		return nil
	})
	if err != nil {
		return 0, err
	}
	if !b.Empty() && !readOnly {
		if err := b.Commit(pebble.Sync); err != nil {
			return 0, err
		}
	}
	return events, nil
}

// upgradeV1 moves every stream's identity out of its record (format 1)
// into its own key (format 2), in one synced batch.
func (s *Store) upgradeV1() error {
	b := s.db.NewBatch()
	defer b.Close()
	var val []byte
	err := s.scan(kindStream, func(k, v []byte) error {
		r, err := decodeStreamV1(v)
		if err != nil {
			return fmt.Errorf("stream key %x: %w", k, err)
		}
		ik := append([]byte{kindIdent}, k[1:]...)
		if err := b.Set(ik, appendIdent(val[:0], &r), nil); err != nil {
			return err
		}
		val = appendStream(val[:0], &r)
		return b.Set(k, val, nil)
	})
	if err != nil {
		return err
	}
	if err := b.Set(keyVersion, []byte{formatVersion}, nil); err != nil {
		return err
	}
	return b.Commit(pebble.Sync)
}

// scan calls f for every key of one kind, in order.
func (s *Store) scan(kind byte, f func(k, v []byte) error) error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kind}, UpperBound: []byte{kind + 1}})
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return err
		}
		if err := f(it.Key(), v); err != nil {
			it.Close()
			return err
		}
	}
	return errors.Join(it.Error(), it.Close())
}

// enter admits a call, or refuses it after Close; write calls are also
// refused once the store failed. leave ends it.
func (s *Store) enter(ctx context.Context, write bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.life.RLock()
	if s.closed {
		s.life.RUnlock()
		return ErrClosed
	}
	if write {
		if err := s.failed.Load(); err != nil {
			s.life.RUnlock()
			return *err
		}
	}
	return nil
}

func (s *Store) leave() { s.life.RUnlock() }

// Retained returns the events and bytes of event data the store holds,
// across all sessions.
func (s *Store) Retained() (events, bytes int64) {
	return s.retEvents.Load(), s.retBytes.Load()
}

// retained adds to the totals Retained reports.
func (s *Store) retained(events, bytes int64) {
	s.retEvents.Add(events)
	s.retBytes.Add(bytes)
}

// Ready reports whether the store takes writes: not closed, and no write
// failed (a full or failing disk; see ErrFailed). It touches no disk.
func (s *Store) Ready(ctx context.Context) error {
	if err := s.enter(ctx, true); err != nil {
		return err
	}
	s.leave()
	return nil
}

func (s *Store) session(id string) *session {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.sessions[id]
}

func (s *Store) stream(key string) *stream {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.streams[key]
}

// Size reports the disk space the store's files take (Pebble's own
// measure: WAL, preallocated and recycled WAL files included, tables live
// and awaiting deletion, manifest and options): what
// relay.Limits.MaxStoreBytes bounds. It does not count the secret and lock
// next to the store, nor space the file system reserves.
//
// Pebble counts the WAL being written at its size when it was opened,
// which for a new file is nothing however much it holds; Size counts the
// live WALs at least at their logical size, the bytes written to them.
func (s *Store) Size(ctx context.Context) (int64, error) {
	if err := s.enter(ctx, false); err != nil {
		return 0, err
	}
	defer s.leave()
	m := s.db.Metrics()
	n := m.DiskSpaceUsage()
	if m.WAL.Size > m.WAL.PhysicalSize {
		n += m.WAL.Size - m.WAL.PhysicalSize
	}
	return int64(n), nil
}

// Session implements [eventlog.Sessions].
func (s *Store) Session(ctx context.Context, id string) (*eventlog.Session, error) {
	if err := s.enter(ctx, false); err != nil {
		return nil, err
	}
	defer s.leave()
	ss := s.session(id)
	if ss == nil {
		return nil, eventlog.ErrNotFound
	}
	// recMu keeps a record change invisible until it is committed (and,
	// under SyncAlways, durable).
	ss.recMu.RLock()
	defer ss.recMu.RUnlock()
	if !ss.live {
		return nil, eventlog.ErrNotFound
	}
	v, closer, err := s.db.Get(sessionKey(make([]byte, 0, 1+len(id)), id))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, eventlog.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	_, sess, err := decodeSession(id, v)
	return sess, err
}

// Read implements [eventlog.Log] with one iterator SeekGE, O(log n + k),
// or from memory for a cursor inside the stream's last append (its tail,
// see tailCache). It returns only committed events (under SyncAlways:
// durable ones), as the record last published by a write says; the
// events' Data are copies, packed into a few shared allocations (a
// tail's are the Data Append was given, shared read-only by its readers).
// A Read that races an eviction reports as FirstSeq the first event it
// actually found.
func (s *Store) Read(ctx context.Context, key string, after uint64, limit int, buf []eventlog.Event) (eventlog.Stream, []eventlog.Event, error) {
	buf = buf[:0]
	if err := s.enter(ctx, false); err != nil {
		return eventlog.Stream{}, buf, err
	}
	defer s.leave()
	st := s.stream(key)
	if st == nil {
		return eventlog.Stream{}, buf, eventlog.ErrNotFound
	}
	st.pubMu.Lock()
	rec, terminalAt, state, tail := st.pub, st.pubTermAt, st.pubState, st.pubTail
	st.pubMu.Unlock()
	if state != pubLive || expired(rec.Terminal, terminalAt, s.now(), s.ret.TerminalGrace) {
		return eventlog.Stream{}, buf, eventlog.ErrNotFound
	}
	if limit <= 0 || after >= rec.LastSeq {
		return rec, buf, nil
	}
	from := max(after+1, rec.FirstSeq)
	if len(tail) > 0 && from >= tail[0].Seq && tail[len(tail)-1].Seq == rec.LastSeq {
		// What was just appended, as readers following the stream ask
		// for it: from memory, without an iterator. The tail holds the
		// seqs up to rec.LastSeq without a gap, none of them evicted.
		tail = tail[from-tail[0].Seq:]
		return rec, append(buf, tail[:min(len(tail), limit)]...), nil
	}
	var bounds [2 * eventKeyLen]byte
	lo := eventKey(bounds[:0], st.sessNum, st.num, from)
	hi := eventKey(lo[len(lo):len(lo)], st.sessNum, st.num, rec.LastSeq+1)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return eventlog.Stream{}, buf, err
	}
	var arena []byte
	for ok := it.First(); ok && len(buf) < limit; ok = it.Next() {
		k := it.Key()
		v, err := it.ValueAndErr()
		if err == nil && len(k) != eventKeyLen {
			err = ErrCorrupt
		}
		var e eventlog.Event
		if err == nil {
			e, err = decodeEvent(beUint64(k[17:]), v)
		}
		if err != nil {
			it.Close()
			return eventlog.Stream{}, buf[:0], err
		}
		if len(arena)+len(e.Data) > cap(arena) {
			// Room for the rest at this event's size, within 16 KiB.
			arena = make([]byte, 0, max(len(e.Data), min(16<<10, len(e.Data)*(limit-len(buf)))))
		}
		n := len(arena)
		arena = append(arena, e.Data...)
		e.Data = arena[n:len(arena):len(arena)]
		buf = append(buf, e)
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return eventlog.Stream{}, buf[:0], err
	}
	// An eviction (or drop) committed after the record was published. A
	// cursor in a crash hole expects the event after the hole.
	expect := from
	for _, h := range st.publishedHoles() {
		if h.from <= from && from < h.to {
			expect = h.to
		}
	}
	switch {
	case len(buf) > 0 && buf[0].Seq > expect:
		rec.FirstSeq = buf[0].Seq
	case len(buf) == 0:
		if _, _, state := st.published(); state != pubLive {
			return eventlog.Stream{}, buf, eventlog.ErrNotFound
		}
		rec.FirstSeq = rec.LastSeq + 1
	}
	return rec, buf, nil
}

// Streams implements [eventlog.Log] from memory, without reading the store.
func (s *Store) Streams(ctx context.Context, session string) ([]eventlog.Stream, error) {
	if err := s.enter(ctx, false); err != nil {
		return nil, err
	}
	defer s.leave()
	ss := s.session(session)
	if ss == nil {
		return nil, nil
	}
	now := s.now()
	ss.viewMu.RLock()
	defer ss.viewMu.RUnlock()
	var out []eventlog.Stream
	for _, st := range ss.shown {
		rec, terminalAt, state := st.published()
		if state == pubLive && !expired(rec.Terminal, terminalAt, now, s.ret.TerminalGrace) {
			out = append(out, rec)
		}
	}
	return out, nil
}

// ListSessions returns a summary of every session, in any order: its
// record (read from the store) and, from memory, its streams (as Streams
// lists them) and the events and bytes it retains. Sessions created or
// deleted meanwhile may or may not be listed.
func (s *Store) ListSessions(ctx context.Context) ([]eventlog.SessionSummary, error) {
	if err := s.enter(ctx, false); err != nil {
		return nil, err
	}
	s.mu.RLock()
	all := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		all = append(all, ss)
	}
	s.mu.RUnlock()
	s.leave()
	out := make([]eventlog.SessionSummary, 0, len(all))
	for _, ss := range all {
		rec, err := s.Session(ctx, ss.id)
		if errors.Is(err, eventlog.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		streams, err := s.Streams(ctx, ss.id)
		if err != nil {
			return nil, err
		}
		ss.mu.Lock()
		events, bytes := ss.events, ss.bytes
		ss.mu.Unlock()
		out = append(out, eventlog.SessionSummary{Session: *rec, Streams: len(streams), Events: events, Bytes: bytes})
	}
	return out, nil
}

// IdleSessions returns up to limit IDs of sessions last used before
// before, in any order (see [eventlog.Store]). It reads every session's
// record.
func (s *Store) IdleSessions(ctx context.Context, before time.Time, limit int) ([]string, error) {
	if err := s.enter(ctx, false); err != nil {
		return nil, err
	}
	s.mu.RLock()
	ids := make([]string, 0, len(s.sessions))
	for id := range s.sessions {
		ids = append(ids, id)
	}
	s.mu.RUnlock()
	s.leave()
	var out []string
	for _, id := range ids {
		if len(out) >= limit {
			break
		}
		rec, err := s.Session(ctx, id)
		if errors.Is(err, eventlog.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return out, err
		}
		if rec.IdleSince(before) {
			out = append(out, id)
		}
	}
	return out, nil
}

// Close waits for calls in flight, stops the background goroutine, syncs
// the WAL under SyncInterval and closes the database. Later calls return
// nil; other methods then fail with ErrClosed.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		close(s.quit)
		<-s.stopped
		s.life.Lock()
		s.closed = true
		s.life.Unlock()
		if s.failed.Load() == nil {
			// Everything handed out is durable once this returns: the next
			// Open need not skip seqs, unless a stream has not yet made
			// the skip a crash before this process asked of it.
			mark := runClean
			if s.skipPending() {
				mark = runRelaxed
			}
			s.closeErr = s.db.Set(keyRun, []byte{mark}, pebble.Sync)
		}
		if err := s.db.Close(); s.closeErr == nil {
			s.closeErr = err
		}
	})
	return s.closeErr
}

// skipPending reports whether a stream still has to skip seqs at its next
// append (see seqReserve). Close calls it once no call is in flight.
func (s *Store) skipPending() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, st := range s.streams {
		if !st.dropped && !st.rec.Terminal && st.floor > st.rec.LastSeq {
			return true
		}
	}
	return false
}

// pebbleLogger sends Pebble's messages to the store's logger.
type pebbleLogger struct {
	log *slog.Logger
	s   *Store
}

func (l pebbleLogger) Infof(format string, args ...any) {
	l.log.Debug("pebble: " + fmt.Sprintf(format, args...))
}

func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error("pebble: " + fmt.Sprintf(format, args...))
}

// Fatalf is called on conditions Pebble cannot continue from, such as a
// WAL or MANIFEST write failing on a full disk, often in one of Pebble's
// own goroutines. A library must neither exit the process nor panic where
// nobody can recover, so Fatalf fails the store instead: every later write
// returns an error wrapping eventlog.ErrUnavailable (a commit that returns
// after Fatalf counts as failed and is not published), reads are still
// served from what was committed before, and reopening the directory
// recovers once the cause is gone.
func (l pebbleLogger) Fatalf(format string, args ...any) {
	l.s.fail(fmt.Errorf(format, args...))
}

// termHeap orders terminal streams by their terminal time. A stream
// dropped otherwise (its session deleted, or expired by a write to its
// session) is removed at once, so that it holds no memory after that.
// Each stream knows its position (hpos, guarded by termMu).
type termHeap []*stream

func (h termHeap) Len() int { return len(h) }

// Less reads terminalAt, which is set before the push and never changes.
func (h termHeap) Less(i, j int) bool { return h[i].terminalAt < h[j].terminalAt }
func (h termHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hpos, h[j].hpos = i+1, j+1
}
func (h *termHeap) Push(x any) {
	st := x.(*stream)
	*h = append(*h, st)
	st.hpos = len(*h)
}
func (h *termHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	x.hpos = 0
	return x
}

// unheap removes st from the terminal heap if it is there.
func (s *Store) unheap(st *stream) {
	s.termMu.Lock()
	if st.hpos > 0 {
		heap.Remove(&s.terminal, st.hpos-1)
	}
	s.termMu.Unlock()
}
