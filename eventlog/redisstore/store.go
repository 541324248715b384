package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcprelay/mcprelay/eventlog"
)

// Options configure Open. The zero value is usable: it connects to
// redis://127.0.0.1:6379/0 with the default retention.
type Options struct {
	// URL is redis://[[user]:password@]host:port/db, or rediss:// for TLS.
	// Default redis://127.0.0.1:6379/0.
	URL string
	// Password, when not empty, overrides the URL's password.
	Password string
	// Retention bounds what is kept per session; zero fields take the
	// eventlog defaults (10000 events, 8 MiB, 5m terminal grace). Every
	// replica sharing a Redis should use the same.
	Retention eventlog.Retention
	// Prefix starts every key the store writes; default "mcprelay". It may
	// not contain '{' or '}'. Stores with different prefixes share nothing.
	Prefix string
	// Logger receives watch subscription failures; nil discards.
	Logger *slog.Logger
}

// Defaults, the same as the eventlog package's.
const (
	defaultURL           = "redis://127.0.0.1:6379/0"
	defaultPrefix        = "mcprelay"
	defaultMaxEvents     = 10000
	defaultMaxBytes      = 8 << 20
	defaultTerminalGrace = 5 * time.Minute
	// indexGraceMargin is how long a terminal stream's index entry
	// outlives the stream's grace.
	indexGraceMargin = time.Minute
	// maxCachedKeys bounds the in-process stream key → session cache;
	// it is emptied when full.
	maxCachedKeys = 1 << 17
	// maxLuaSeq is the largest cursor passed to the scripts: Lua numbers
	// are doubles, exact up to 2^53.
	maxLuaSeq = 1 << 53
)

// Store is an eventlog.Store on Redis. Several Stores (relay replicas) may
// share one Redis; see the package documentation for what they share and
// how leases fence them. It is safe for concurrent use. Create it with
// Open and release it with Close.
type Store struct {
	c      rueidis.Client
	prefix string
	log    *slog.Logger

	ret     eventlog.Retention
	maxE    string
	maxB    string
	graceMs string

	closed atomic.Bool

	idxMu sync.RWMutex
	idx   map[string]*keyInfo // stream key → what this Store knows of it

	tokMu  sync.Mutex
	tokens map[string]heldLease // session → the lease this Store holds

	proc  string // this Store's nonce: heartbeat ids and batch IDs begin with it
	hbMu  sync.Mutex
	hbs   map[string]*heartbeat // owner → its heartbeat
	hbSeq uint64

	liveMu sync.Mutex
	live   map[string]liveSeen // heartbeat id → the heartbeat, as last seen live

	hub *hub

	batchPrefix string        // random, per Store: batch IDs are unique across processes
	batches     atomic.Uint64 // batch IDs handed out
}

var _ eventlog.Store = (*Store)(nil)

// heldLease is a lease this Store holds: its fencing token, and the
// heartbeat and epoch it was last stamped with.
type heldLease struct {
	tok   uint64
	hb    *heartbeat
	epoch uint64
}

// keyInfo is what a Store remembers of a stream key.
type keyInfo struct {
	sid string // the owning session; never changes while the key lives

	mu  sync.Mutex
	num int64  // the stream's number in its session, 0 if not known yet
	hw  uint64 // the highest LastSeq this Store has seen of stream num

	// The last append that failed without telling whether it ran (its
	// answer lost): its events' fingerprint and batch ID, which an append
	// of the same events reuses (see scriptAppend). Guarded by mu.
	unsureFP    uint64
	unsureBatch string
}

// batchFor returns the batch ID of an append: the unsure append's if fp
// (summed only then: most appends follow a sure one) says these are its
// events (a retry), else next.
func (ki *keyInfo) batchFor(fp *appendPrint, next func() string) string {
	ki.mu.Lock()
	defer ki.mu.Unlock()
	if ki.unsureBatch != "" && ki.unsureFP == fp.sum() {
		return ki.unsureBatch
	}
	return next()
}

// settle records the outcome of an append of batch: unsure (it may or may
// not have run; fp is then summed) or known (done, or refused by Redis).
func (ki *keyInfo) settle(fp *appendPrint, batch string, unsure bool) {
	ki.mu.Lock()
	defer ki.mu.Unlock()
	if unsure {
		ki.unsureFP, ki.unsureBatch = fp.sum(), batch
	} else {
		ki.unsureFP, ki.unsureBatch = 0, ""
	}
}

// appendPrint is the fingerprint of an append's events (and whether it
// ends the stream) for batchFor: the same events give the same sum. It
// reads every byte of the events, so it is computed only when asked for:
// when an append is unsure, or follows one.
type appendPrint struct {
	terminal bool
	events   []eventlog.Event
	v        uint64
	done     bool
}

func (p *appendPrint) sum() uint64 {
	if !p.done {
		p.v, p.done = fingerprint(p.terminal, p.events), true
	}
	return p.v
}

func fingerprint(terminal bool, events []eventlog.Event) uint64 {
	h := fnv.New64a()
	if terminal {
		h.Write([]byte{1})
	}
	var n [8]byte
	for i := range events {
		binary.LittleEndian.PutUint64(n[:], uint64(len(events[i].Type)))
		h.Write(n[:])
		h.Write([]byte(events[i].Type))
		binary.LittleEndian.PutUint64(n[:], uint64(len(events[i].Data)))
		h.Write(n[:])
		h.Write(events[i].Data)
	}
	return h.Sum64()
}

// number is the stream's number, 0 if not known.
func (ki *keyInfo) number() int64 {
	ki.mu.Lock()
	defer ki.mu.Unlock()
	return ki.num
}

// floor is the Append script's floor argument.
func (ki *keyInfo) floor() string {
	ki.mu.Lock()
	defer ki.mu.Unlock()
	if ki.num == 0 {
		return ""
	}
	return strconv.FormatInt(ki.num, 10) + ":" + strconv.FormatUint(min(ki.hw, maxLuaSeq), 10)
}

// seen records that stream num had LastSeq last. A new number means the
// key was dropped and created again: the old mark does not apply.
func (ki *keyInfo) seen(num int64, last uint64) {
	ki.mu.Lock()
	defer ki.mu.Unlock()
	if num != ki.num {
		ki.num, ki.hw = num, last
		return
	}
	ki.hw = max(ki.hw, last)
}

var (
	luaCreateSession = rueidis.NewLuaScript(scriptCreateSession)
	luaUpdateSession = rueidis.NewLuaScript(scriptUpdateSession)
	luaDeleteSession = rueidis.NewLuaScript(scriptDeleteSession)
	luaTouchSession  = rueidis.NewLuaScript(scriptTouchSession)
	luaCreateStream  = rueidis.NewLuaScript(scriptCreateStream)
	luaAppend        = rueidis.NewLuaScript(scriptAppend)
	luaStreams       = rueidis.NewLuaScript(scriptStreams)
	luaAcquire       = rueidis.NewLuaScript(scriptAcquire)
	luaRestamp       = rueidis.NewLuaScript(scriptRestamp)
	luaBeat          = rueidis.NewLuaScript(scriptBeat)
	luaRelease       = rueidis.NewLuaScript(scriptRelease)
	luaHolder        = rueidis.NewLuaScript(scriptHolder)
	luaDeleteIndex   = rueidis.NewLuaScript(scriptDeleteIndex)
	luaSwapIndex     = rueidis.NewLuaScript(scriptSwapIndex)
)

// Open connects to the Redis at opts.URL and checks that it answers.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.URL == "" {
		opts.URL = defaultURL
	}
	if opts.Prefix == "" {
		opts.Prefix = defaultPrefix
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("%w: prefix %q contains a brace", errBadURL, opts.Prefix)
	}
	co, err := rueidis.ParseURL(opts.URL)
	if err != nil {
		// The parser's message may quote the URL, password and all.
		msg := strings.ReplaceAll(err.Error(), opts.URL, redactURL(opts.URL))
		return nil, fmt.Errorf("%w: %s", errBadURL, msg)
	}
	if opts.Password != "" {
		co.Password = opts.Password
	}
	co.DisableCache = true
	c, err := rueidis.NewClient(co)
	if err != nil {
		return nil, fmt.Errorf("redisstore: connecting to %s: %w", redactURL(opts.URL), err)
	}
	if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redisstore: connecting to %s: %w", redactURL(opts.URL), err)
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
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		c:       c,
		prefix:  opts.Prefix,
		log:     log,
		ret:     r,
		maxE:    strconv.Itoa(r.MaxEvents),
		maxB:    strconv.FormatInt(r.MaxBytes, 10),
		graceMs: strconv.FormatInt(timeMs(r.TerminalGrace), 10),
		idx:     make(map[string]*keyInfo),
		tokens:  make(map[string]heldLease),
		live:    make(map[string]liveSeen),
		hbs:     make(map[string]*heartbeat),
	}
	var nonce [9]byte
	rand.Read(nonce[:])
	proc := base64.RawURLEncoding.EncodeToString(nonce[:])
	s.proc, s.batchPrefix = proc, proc+":"
	s.hub = newHub(c, log)
	return s, nil
}

// redactURL drops the password from a Redis URL for error messages.
func redactURL(u string) string {
	at := strings.LastIndexByte(u, '@')
	i := strings.Index(u, "://")
	if at < 0 || i < 0 || at < i {
		return u
	}
	return u[:i+3] + "***" + u[at:]
}

// Ready reports whether Redis answers (a PING).
func (s *Store) Ready(ctx context.Context) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return s.c.Do(ctx, s.c.B().Ping().Build()).Error()
}

// Close closes the connections. Calls after Close fail with ErrClosed.
// Close is idempotent.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.hub.close()
	s.c.Close()
	return nil
}

// Size reports Redis's used_memory (INFO memory): all the memory the
// Redis server holds for its data, this store's and anything else in it,
// which is what fills it up (maxmemory, or the machine). It is what
// relay.Limits.MaxStoreBytes bounds, and the same for every replica. On a
// Redis Cluster it is one node's.
func (s *Store) Size(ctx context.Context) (int64, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	info, err := s.c.Do(ctx, s.c.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		return 0, fmt.Errorf("redisstore: INFO memory: %w", err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("redisstore: INFO memory: used_memory %q: %w", v, err)
			}
			return n, nil
		}
	}
	return 0, errors.New("redisstore: INFO memory has no used_memory")
}

func (s *Store) check(ctx context.Context) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return ctx.Err()
}

// base is the key prefix of one session: "<prefix>:{<sid>}:".
func (s *Store) base(sid string) string { return s.prefix + ":{" + sid + "}:" }

// indexKey is the stream key → session index entry.
func (s *Store) indexKey(key string) string { return s.prefix + ":x:" + key }

// channel is the pub/sub channel of a stream's appends.
func (s *Store) channel(key string) string { return s.prefix + ":w:" + key }

// token returns the fencing token this Store holds for sid, "0" if none.
func (s *Store) token(sid string) string {
	s.tokMu.Lock()
	t := s.tokens[sid].tok
	s.tokMu.Unlock()
	return strconv.FormatUint(t, 10)
}

// mapErr maps the scripts' error replies to sentinels.
func mapErr(err error) error {
	if err == nil {
		return nil
	}
	if re, ok := rueidis.IsRedisErr(err); ok {
		switch strings.TrimPrefix(re.Error(), "ERR ") {
		case codeNotFound:
			return eventlog.ErrNotFound
		case codeExists:
			return eventlog.ErrExists
		case codeTerminal:
			return eventlog.ErrTerminal
		case codeFenced:
			return eventlog.ErrFenced
		case codeLeaseLost:
			return ErrLeaseLost
		}
		switch prefix, _, _ := strings.Cut(re.Error(), " "); prefix {
		case "LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "OOM", "MISCONF":
			// Redis is starting, failing over or full: not now.
			return fmt.Errorf("redisstore: %w: %w", eventlog.ErrUnavailable, err)
		}
		return fmt.Errorf("redisstore: %w", err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if errors.Is(err, rueidis.ErrClosing) {
		return ErrClosed
	}
	// Redis cannot be reached (refused, reset, a timeout of the client's):
	// retry later.
	return fmt.Errorf("redisstore: %w: %w", eventlog.ErrUnavailable, err)
}

func (s *Store) exec(ctx context.Context, l *rueidis.Lua, key string, args ...string) rueidis.RedisResult {
	return l.Exec(ctx, s.c, []string{key}, args)
}

// CreateSession implements [eventlog.Sessions]. It is fenced.
func (s *Store) CreateSession(ctx context.Context, sess *eventlog.Session) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if sess.ID == "" {
		return errEmptyID
	}
	b := s.base(sess.ID)
	if err := mapErr(s.exec(ctx, luaCreateSession, b+"s", b, s.token(sess.ID), rueidis.BinaryString(encodeSession(sess)), listeningArg(sess)).Error()); err != nil {
		return err
	}
	return s.indexUse(ctx, sess)
}

// listeningArg is the scripts' argument for sess.Listening, which is kept
// in the session hash's field L, not in the encoded record: a replica of an
// earlier version refuses a record with bytes it does not know, and would
// then refuse every session that listens during a rolling upgrade.
func listeningArg(sess *eventlog.Session) string {
	if sess.Listening {
		return "1"
	}
	return ""
}

// usedKey is the sorted set of sessions by last use (unix milliseconds):
// the index IdleSessions reads. It is a key of its own, not one of a
// session's (they share a hash slot, this one does not), so it is written
// after the session's record, not in the same script: a session whose
// process died between the two is not indexed, and never listed idle.
func (s *Store) usedKey() string { return s.prefix + ":used" }

// indexUse records sess's last use in usedKey (a record that does not say
// when it was used leaves it).
func (s *Store) indexUse(ctx context.Context, sess *eventlog.Session) error {
	var cmd rueidis.Completed
	if u := sess.LastUse(); u.IsZero() {
		cmd = s.c.B().Zrem().Key(s.usedKey()).Member(sess.ID).Build()
	} else {
		// GT: a use TouchSession recorded later than the record's stays.
		cmd = s.c.B().Zadd().Key(s.usedKey()).Gt().ScoreMember().ScoreMember(float64(u.UnixMilli()), sess.ID).Build()
	}
	return mapErr(s.c.Do(ctx, cmd).Error())
}

// IdleSessions returns up to limit IDs of sessions last used before
// before, in any order (see [eventlog.Store]), from the index of last uses
// the session writes keep. An indexed session whose record is gone (its
// process died between deleting the record and the index entry) is dropped
// from the index, not listed.
func (s *Store) IdleSessions(ctx context.Context, before time.Time, limit int) ([]string, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	ids, err := s.c.Do(ctx, s.c.B().Zrangebyscore().Key(s.usedKey()).Min("-inf").Max(fmt.Sprintf("(%d", before.UnixMilli())).
		Limit(0, int64(limit)).Build()).AsStrSlice()
	if err != nil {
		return nil, mapErr(err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make(rueidis.Commands, len(ids))
	for i, id := range ids {
		cmds[i] = s.c.B().Hexists().Key(s.base(id) + "s").Field("r").Build()
	}
	out := ids[:0]
	var gone []string
	for i, r := range s.c.DoMulti(ctx, cmds...) {
		ok, err := r.AsBool()
		if err != nil {
			return nil, mapErr(err)
		}
		if ok {
			out = append(out, ids[i])
		} else {
			gone = append(gone, ids[i])
		}
	}
	if len(gone) > 0 {
		if err := s.c.Do(ctx, s.c.B().Zrem().Key(s.usedKey()).Member(gone...).Build()).Error(); err != nil {
			return nil, mapErr(err)
		}
	}
	return out, nil
}

// Session implements [eventlog.Sessions].
func (s *Store) Session(ctx context.Context, id string) (*eventlog.Session, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	vs, err := s.c.Do(ctx, s.c.B().Hmget().Key(s.base(id)+"s").Field("r", "u", "L").Build()).ToArray()
	if err != nil {
		return nil, mapErr(err)
	}
	if len(vs) != 3 {
		return nil, ErrCorrupt
	}
	v, err := vs[0].AsBytes()
	if rueidis.IsRedisNil(err) {
		return nil, eventlog.ErrNotFound
	}
	if err != nil {
		return nil, mapErr(err)
	}
	sess, err := decodeSession(id, v)
	if err != nil {
		return nil, err
	}
	if l, err := vs[2].ToString(); err == nil {
		sess.Listening = l == "1"
	}
	// A use recorded by TouchSession after the record was last written.
	if u, err := vs[1].ToString(); err == nil {
		n, err := strconv.ParseInt(u, 10, 64)
		if err != nil {
			return nil, ErrCorrupt
		}
		if t := time.Unix(0, n).UTC(); t.After(sess.LastUsed) {
			sess.LastUsed = t
		}
	}
	return sess, nil
}

// TouchSession records a use of the session at at: its LastUsed, as Session
// reads it, becomes at if that is later (see [eventlog.Store]). It is not
// fenced: a replica that serves the session's streams without owning it
// records uses too.
func (s *Store) TouchSession(ctx context.Context, id string, at time.Time) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if err := mapErr(s.exec(ctx, luaTouchSession, s.base(id)+"s", fmt.Sprintf("%019d", at.UnixNano())).Error()); err != nil {
		return err
	}
	// The index only lags if this fails (see UpdateSession).
	s.c.Do(ctx, s.c.B().Zadd().Key(s.usedKey()).Gt().ScoreMember().ScoreMember(float64(at.UnixMilli()), id).Build())
	return nil
}

// UpdateSession implements [eventlog.Sessions]. It is fenced.
func (s *Store) UpdateSession(ctx context.Context, sess *eventlog.Session) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	b := s.base(sess.ID)
	if err := mapErr(s.exec(ctx, luaUpdateSession, b+"s", b, s.token(sess.ID), rueidis.BinaryString(encodeSession(sess)), listeningArg(sess)).Error()); err != nil {
		return err
	}
	// The record is written: an index entry that is not updated only
	// lags (IdleSessions may list the session early; its callers read the
	// record before acting), so its failure does not fail the update.
	s.indexUse(ctx, sess)
	return nil
}

// DeleteSession implements [eventlog.Sessions]. It is not fenced, it also
// deletes the session's lease and fencing counter, and it wakes the
// watchers of the session's streams (which then read ErrNotFound).
func (s *Store) DeleteSession(ctx context.Context, id string) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	b := s.base(id)
	keys, err := s.exec(ctx, luaDeleteSession, b+"s", b, s.channel("")).AsStrSlice()
	if err != nil {
		return mapErr(err)
	}
	// An entry left behind is dropped by the next IdleSessions that lists
	// it: its failure does not fail the deletion.
	s.c.Do(ctx, s.c.B().Zrem().Key(s.usedKey()).Member(id).Build())
	s.tokMu.Lock()
	delete(s.tokens, id)
	s.tokMu.Unlock()
	s.idxMu.Lock()
	for _, k := range keys {
		delete(s.idx, k)
	}
	s.idxMu.Unlock()
	if len(keys) > 0 {
		execs := make([]rueidis.LuaExec, len(keys))
		for i, k := range keys {
			execs[i] = rueidis.LuaExec{Keys: []string{s.indexKey(k)}, Args: []string{id}}
		}
		for _, r := range luaDeleteIndex.ExecMulti(ctx, s.c, execs...) {
			if err := r.Error(); err != nil {
				return mapErr(err)
			}
		}
	}
	return nil
}

// resolve returns what this Store knows of a stream key, from the
// in-process cache (cached reports so) or from the index.
func (s *Store) resolve(ctx context.Context, key string) (ki *keyInfo, cached bool, err error) {
	s.idxMu.RLock()
	ki = s.idx[key]
	s.idxMu.RUnlock()
	if ki != nil {
		return ki, true, nil
	}
	sid, err := s.c.Do(ctx, s.c.B().Get().Key(s.indexKey(key)).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return nil, false, eventlog.ErrNotFound
	}
	if err != nil {
		return nil, false, mapErr(err)
	}
	return s.remember(key, sid), false, nil
}

// remember caches key's session, keeping what is known if it is the same.
func (s *Store) remember(key, sid string) *keyInfo {
	s.idxMu.Lock()
	defer s.idxMu.Unlock()
	if ki := s.idx[key]; ki != nil && ki.sid == sid {
		return ki
	}
	if len(s.idx) >= maxCachedKeys {
		clear(s.idx)
	}
	ki := &keyInfo{sid: sid}
	s.idx[key] = ki
	return ki
}

func (s *Store) forget(key string) {
	s.idxMu.Lock()
	delete(s.idx, key)
	s.idxMu.Unlock()
}

// onStream runs op on the session of key. If op reports ErrNotFound with a
// cached session, the cache may be stale (the key was dropped and created
// again in another session): it looks the key up again and retries once.
func (s *Store) onStream(ctx context.Context, key string, op func(ki *keyInfo) error) error {
	ki, cached, err := s.resolve(ctx, key)
	if err != nil {
		return err
	}
	err = op(ki)
	if !cached || !errors.Is(err, eventlog.ErrNotFound) {
		return err
	}
	s.forget(key)
	ki2, _, err2 := s.resolve(ctx, key)
	if err2 != nil {
		return err2
	}
	if ki2.sid == ki.sid {
		return err
	}
	return op(ki2)
}

// CreateStream implements [eventlog.Log]. It is fenced.
func (s *Store) CreateStream(ctx context.Context, st *eventlog.Stream) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if st.Key == "" {
		return errEmptyKey
	}
	ik := s.indexKey(st.Key)
	set := s.c.Do(ctx, s.c.B().Set().Key(ik).Value(st.Session).Nx().Build())
	claimed := true
	if err := set.Error(); rueidis.IsRedisNil(err) {
		claimed = false
	} else if err != nil {
		return mapErr(err)
	}
	if !claimed {
		owner, err := s.c.Do(ctx, s.c.B().Get().Key(ik).Build()).ToString()
		switch {
		case rueidis.IsRedisNil(err): // expired meanwhile: try once more
			if err := s.c.Do(ctx, s.c.B().Set().Key(ik).Value(st.Session).Nx().Build()).Error(); err != nil {
				if rueidis.IsRedisNil(err) {
					return eventlog.ErrExists
				}
				return mapErr(err)
			}
		case err != nil:
			return mapErr(err)
		case owner != st.Session:
			// Taken, unless the entry outlived its stream (a crash
			// between a session's deletion and its index cleanup).
			n, err := s.c.Do(ctx, s.c.B().Hexists().Key(s.base(owner)+"k").Field(st.Key).Build()).AsInt64()
			if err != nil {
				return mapErr(err)
			}
			if n == 1 {
				return eventlog.ErrExists
			}
			swapped, err := s.exec(ctx, luaSwapIndex, ik, owner, st.Session).AsInt64()
			if err != nil {
				return mapErr(err)
			}
			if swapped == 0 {
				return eventlog.ErrExists
			}
		}
	}
	rid, ridNil := rueidis.BinaryString(st.RequestID), "0"
	if st.RequestID == nil {
		ridNil = "1"
	}
	b := s.base(st.Session)
	err := mapErr(s.exec(ctx, luaCreateStream, b+"s", b, s.token(st.Session), st.Key,
		strconv.FormatUint(st.Generation, 10), rid, ridNil).Error())
	if errors.Is(err, eventlog.ErrNotFound) || errors.Is(err, eventlog.ErrFenced) {
		// The stream does not exist: release the index entry.
		s.exec(context.WithoutCancel(ctx), luaDeleteIndex, ik, st.Session)
		return err
	}
	if err == nil {
		s.remember(st.Key, st.Session)
	}
	return err
}

// Append implements [eventlog.Log]. It is fenced, and it publishes the new
// LastSeq to the stream's watchers (see Watch).
func (s *Store) Append(ctx context.Context, key string, terminal bool, events ...eventlog.Event) (uint64, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	if terminal && len(events) == 0 {
		return 0, errEmptyTerminal
	}
	term := "0"
	if terminal {
		term = "1"
	}
	var last uint64
	fp := &appendPrint{terminal: terminal, events: events}
	err := s.onStream(ctx, key, func(ki *keyInfo) error {
		b := s.base(ki.sid)
		batch := ki.batchFor(fp, s.nextBatch)
		args := make([]string, 0, 10+2*len(events))
		args = append(args, b, s.token(ki.sid), key, term, s.maxE, s.maxB, s.graceMs, s.channel(key),
			ki.floor(), batch)
		for i := range events {
			args = append(args, events[i].Type, rueidis.BinaryString(events[i].Data))
		}
		v, err := luaAppend.Exec(ctx, s.c, []string{b + "s"}, args).AsIntSlice()
		// An error that is not Redis's answer leaves the append unsure:
		// it may have run. Retried with the same events, it reuses the
		// batch ID, and does not append them twice.
		_, answered := rueidis.IsRedisErr(err)
		ki.settle(fp, batch, err != nil && !answered)
		if err != nil {
			return mapErr(err)
		}
		if len(v) != 2 || v[0] < 0 {
			return ErrCorrupt
		}
		last = uint64(v[0])
		ki.seen(v[1], last)
		return nil
	})
	if err != nil {
		return 0, err
	}
	for i := range events {
		events[i].Seq = last - uint64(len(events)-1-i)
	}
	if terminal {
		// The index entry outlives the stream's grace and then goes by itself.
		ttl := timeMs(s.ret.TerminalGrace + indexGraceMargin)
		s.c.Do(context.WithoutCancel(ctx), s.c.B().Pexpire().Key(s.indexKey(key)).Milliseconds(ttl).Build())
	}
	return last, nil
}

// nextBatch returns a new batch ID.
func (s *Store) nextBatch() string {
	return s.batchPrefix + strconv.FormatUint(s.batches.Add(1), 36)
}

// Read implements [eventlog.Log]. Data of the returned events aliases the
// client's reply buffer; callers must not modify it.
//
// Read runs no script: it is one MULTI/EXEC of HMGET (the stream record),
// XRANGE (the events, from after+1, so from FirstSeq when the cursor is in
// a hole since evicted entries are trimmed) and TIME (for the terminal
// grace), which Redis serves natively; a script returning the same
// entries spends most of its time converting them to Lua and back.
func (s *Store) Read(ctx context.Context, key string, after uint64, max int, buf []eventlog.Event) (eventlog.Stream, []eventlog.Event, error) {
	buf = buf[:0]
	if err := s.check(ctx); err != nil {
		return eventlog.Stream{}, buf, err
	}
	var rec eventlog.Stream
	err := s.onStream(ctx, key, func(ki *keyInfo) error {
		b := s.base(ki.sid)
		for range 3 { // the cached stream number may be stale
			num := ki.number()
			if num == 0 {
				n, err := s.c.Do(ctx, s.c.B().Hget().Key(b+"k").Field(key).Build()).AsInt64()
				if rueidis.IsRedisNil(err) {
					return eventlog.ErrNotFound
				}
				if err != nil {
					return mapErr(err)
				}
				ki.seen(n, 0)
				num = n
			}
			ns := strconv.FormatInt(num, 10)
			cmds := make(rueidis.Commands, 0, 5)
			cmds = append(cmds, s.c.B().Multi().Build(),
				s.c.B().Hmget().Key(b+"m:"+ns).Field("g", "q", "l", "n", "t").Build())
			withEvents := max > 0 && after < maxLuaSeq
			if withEvents {
				cmds = append(cmds, s.c.B().Xrange().Key(b+"e:"+ns).Start(strconv.FormatUint(after+1, 10)+"-0").End("+").Count(int64(max)).Build())
			}
			cmds = append(cmds, s.c.B().Time().Build(), s.c.B().Exec().Build())
			res := s.c.DoMulti(ctx, cmds...)
			v, err := res[len(res)-1].ToArray()
			if err != nil {
				return mapErr(err)
			}
			if len(v) != len(cmds)-2 {
				return ErrCorrupt
			}
			m, err := v[0].ToArray()
			if err != nil || len(m) != 5 {
				return ErrCorrupt
			}
			if m[0].IsNil() { // dropped, or dropped and created again
				ki.seen(0, 0)
				continue
			}
			if !m[4].IsNil() {
				at, err1 := m[4].AsInt64()
				tv, err2 := v[len(v)-1].AsStrSlice()
				if err1 != nil || err2 != nil || len(tv) != 2 {
					return ErrCorrupt
				}
				sec, err1 := strconv.ParseInt(tv[0], 10, 64)
				usec, err2 := strconv.ParseInt(tv[1], 10, 64)
				if err1 != nil || err2 != nil {
					return ErrCorrupt
				}
				if sec*1000+usec/1000-at >= timeMs(s.ret.TerminalGrace) {
					return eventlog.ErrNotFound
				}
			}
			rec, err = decodeStream(key, ki.sid, m[0], m[1], m[2], m[3], m[4])
			if err != nil {
				return err
			}
			ki.seen(num, rec.LastSeq)
			if !withEvents {
				return nil
			}
			entries, err := v[1].ToArray()
			if err != nil {
				return ErrCorrupt
			}
			for i := range entries {
				e, err := decodeEvent(&entries[i])
				if err != nil {
					return err
				}
				if e.Seq > rec.LastSeq {
					break
				}
				buf = append(buf, e)
			}
			return nil
		}
		return eventlog.ErrNotFound
	})
	if err != nil {
		return eventlog.Stream{}, buf[:0], err
	}
	return rec, buf, nil
}

// decodeStream builds a stream record from the fields of its hash; term
// is the terminal time, nil while the stream is open.
func decodeStream(key, sid string, g, q, l, n, term rueidis.RedisMessage) (eventlog.Stream, error) {
	rec := eventlog.Stream{Key: key, Session: sid}
	var err1, err2 error
	rec.Generation, err1 = g.AsUint64()
	rec.LastSeq, err2 = l.AsUint64()
	kept, err3 := n.AsUint64()
	if err := errors.Join(err1, err2, err3); err != nil || kept > rec.LastSeq {
		return rec, ErrCorrupt
	}
	rec.FirstSeq = rec.LastSeq + 1 - kept
	rec.Terminal = !term.IsNil()
	if !q.IsNil() {
		b, err := q.AsBytes()
		if err != nil {
			return rec, ErrCorrupt
		}
		rec.RequestID = append([]byte{}, b...)
	}
	return rec, nil
}

// decodeEvent decodes one stream entry: [id, [d, data, (t, type)]].
func decodeEvent(m *rueidis.RedisMessage) (eventlog.Event, error) {
	e, err := m.ToArray()
	if err != nil || len(e) != 2 {
		return eventlog.Event{}, ErrCorrupt
	}
	id, err := e[0].ToString()
	if err != nil {
		return eventlog.Event{}, ErrCorrupt
	}
	dash := strings.IndexByte(id, '-')
	if dash < 0 {
		return eventlog.Event{}, ErrCorrupt
	}
	seq, err := strconv.ParseUint(id[:dash], 10, 64)
	if err != nil {
		return eventlog.Event{}, ErrCorrupt
	}
	f, err := e[1].ToArray()
	if err != nil || (len(f) != 2 && len(f) != 4) {
		return eventlog.Event{}, ErrCorrupt
	}
	ev := eventlog.Event{Seq: seq}
	if ev.Data, err = f[1].AsBytes(); err != nil {
		return eventlog.Event{}, ErrCorrupt
	}
	if len(f) == 4 {
		if ev.Type, err = f[3].ToString(); err != nil {
			return eventlog.Event{}, ErrCorrupt
		}
	}
	return ev, nil
}

// Streams implements [eventlog.Log].
func (s *Store) Streams(ctx context.Context, session string) ([]eventlog.Stream, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	b := s.base(session)
	v, err := s.exec(ctx, luaStreams, b+"s", b, s.graceMs).ToArray()
	if err != nil {
		return nil, mapErr(err)
	}
	if len(v) == 0 {
		return nil, nil
	}
	out := make([]eventlog.Stream, len(v))
	for i := range v {
		f, err := v[i].ToArray()
		if err != nil || len(f) != 6 {
			return nil, ErrCorrupt
		}
		key, err := f[0].ToString()
		if err != nil {
			return nil, ErrCorrupt
		}
		if out[i], err = decodeStream(key, session, f[1], f[2], f[3], f[4], f[5]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// LoadOrCreateSecret returns the relay secret shared by every Store on
// this Redis and prefix: 32 random bytes, created by the first caller
// (SET NX) and never changed. If Redis loses its data, a new secret is
// created, and every event ID minted with the old one stops verifying.
func (s *Store) LoadOrCreateSecret(ctx context.Context) ([]byte, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	k := s.prefix + ":secret"
	fresh := make([]byte, 32)
	rand.Read(fresh)
	err := s.c.Do(ctx, s.c.B().Set().Key(k).Value(rueidis.BinaryString(fresh)).Nx().Build()).Error()
	if err == nil {
		return fresh, nil
	}
	if !rueidis.IsRedisNil(err) {
		return nil, mapErr(err)
	}
	b, err := s.c.Do(ctx, s.c.B().Get().Key(k).Build()).AsBytes()
	if err != nil {
		return nil, mapErr(err)
	}
	if len(b) < 32 {
		return nil, fmt.Errorf("%w: relay secret of %d bytes, want 32", ErrCorrupt, len(b))
	}
	return append([]byte{}, b...), nil
}
