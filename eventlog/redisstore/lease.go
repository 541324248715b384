package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Lease is a session's ownership by one writer (relay replica).
type Lease struct {
	// Owner is opaque to the store: the owner replica's advertised URL.
	Owner string
	// Token is the fencing token: the value of the session's fencing
	// counter when the lease was acquired. It only grows.
	Token uint64
}

// HeldError is the error AcquireLease returns when another owner holds the
// lease. It wraps ErrLeaseHeld.
type HeldError struct {
	Holder Lease         // the current holder
	TTL    time.Duration // how long its lease runs unless renewed
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("redisstore: lease held by %q (token %d) for %v more", e.Holder.Owner, e.Holder.Token, e.TTL)
}

// Unwrap returns ErrLeaseHeld.
func (e *HeldError) Unwrap() error { return ErrLeaseHeld }

func (s *Store) leaseArgs(ctx context.Context, session string, ttl time.Duration) (key string, err error) {
	if err := s.check(ctx); err != nil {
		return "", err
	}
	if session == "" {
		return "", errEmptyID
	}
	if ttl < time.Millisecond {
		return "", errBadTTL
	}
	return s.base(session) + "l", nil
}

// A lease is live while its owner's heartbeat lasts, not for a TTL of
// its own, so that keeping thousands of sessions is one heartbeat per
// renewal round rather than one write per session:
//
//   - Every owner has a heartbeat key "<prefix>:h:<id>" (id: a nonce of
//     the owner in this Store), whose value is the owner's epoch, with a
//     TTL. An owner is a replica process: the heartbeat is its own, not
//     its Store's, so that an owner that stops renewing loses its leases
//     even while another owner on the same Store renews its own.
//   - A lease's value is "<token> @<id>.<epoch> <owner>", without a TTL:
//     it is live while the heartbeat id holds that epoch.
//   - A heartbeat that finds its key gone (it lapsed: the process was
//     paused, Redis was out of reach) starts a new epoch. Every lease
//     stamped with the old one is then dead, and the Store re-stamps each
//     before it reports it renewed, by a compare-and-set that succeeds only
//     while the session's fencing counter still equals the lease's token,
//     that is, while nobody acquired the session since.
//   - Acquiring a leased session reads the lease, checks its owner's
//     heartbeat (another key, in Redis Cluster another slot) and takes the
//     lease only if its value is still the one it read. An owner whose
//     heartbeat lapsed and came back re-stamps its leases first, which
//     changes that value: of the two, exactly one wins.
//
// Leases written by an earlier version, "<token> <owner>" with a TTL, are
// honoured until they expire.

// AcquireLease makes owner the session's writer: it takes the lease if
// nobody holds a live one, with a new token from the session's fencing
// counter (INCR), or if owner already holds it, with the same token, and
// refreshes owner's heartbeat so that the lease lives at least ttl from
// the call. Otherwise it returns a *HeldError. Every lease of owner lives
// as long as its heartbeat: renewing one (RenewLease, RenewLeases) keeps
// them all.
//
// From then on this Store's writes to the session carry the token, and
// every Store's writes to it are refused with eventlog.ErrFenced unless
// they carry the session's latest token. The session need not exist yet.
// Its fencing counter lives until DeleteSession.
func (s *Store) AcquireLease(ctx context.Context, session, owner string, ttl time.Duration) (Lease, error) {
	return s.acquire(ctx, session, owner, ttl, "")
}

// acquire is AcquireLease; dead is the value of a lease the caller already
// found dead, or "" (tests replay a stale read with it).
func (s *Store) acquire(ctx context.Context, session, owner string, ttl time.Duration, dead string) (Lease, error) {
	lk, err := s.leaseArgs(ctx, session, ttl)
	if err != nil {
		return Lease{}, err
	}
	if owner == "" {
		return Lease{}, errEmptyOwner
	}
	// The lease is written with the heartbeat's epoch as this Store knows
	// it, then the heartbeat is refreshed: a session held by another
	// replica costs one round trip, and a lease taken lives at least ttl
	// from the beat, which is sent after this call began.
	hb := s.heartbeatOf(owner)
	epoch := hb.epoch.Load()
	if mono(time.Now()) >= hb.expires.Load() {
		// No beat keeps it now (a new owner, or no lease to renew for a
		// while): a lease stamped with it would be dead. Beat first.
		if epoch, err = s.beat(ctx, hb, ttl); err != nil {
			return Lease{}, err
		}
	}
	expect := dead // the dead lease a retry may replace
	for try := 0; ; try++ {
		stamp := hb.stamp(epoch)
		v, err := s.exec(ctx, luaAcquire, lk, s.base(session), owner, stamp, expect).ToArray()
		if err != nil {
			return Lease{}, mapErr(err)
		}
		if len(v) < 3 {
			return Lease{}, ErrCorrupt
		}
		ok, err1 := v[0].AsInt64()
		tok, err2 := v[1].AsUint64()
		own, err3 := v[2].ToString()
		if err1 != nil || err2 != nil || err3 != nil {
			return Lease{}, ErrCorrupt
		}
		l := Lease{Owner: own, Token: tok}
		if ok == 1 {
			now, err := s.beat(ctx, hb, ttl)
			if err != nil {
				return Lease{}, err
			}
			if now != epoch && try < 2 {
				// The heartbeat had lapsed, so the lease was written
				// dead: stamp it again, unless another replica took it
				// meanwhile.
				epoch = now
				continue
			}
			if now != epoch {
				return Lease{}, errors.New("redisstore: AcquireLease: the owner's heartbeat keeps lapsing")
			}
			s.hold(session, tok, hb, epoch)
			return l, nil
		}
		if len(v) != 6 {
			return Lease{}, ErrCorrupt
		}
		holder, err1 := v[3].ToString()
		cur, err2 := v[4].ToString()
		ms, err3 := v[5].AsInt64()
		if err1 != nil || err2 != nil || err3 != nil {
			return Lease{}, ErrCorrupt
		}
		left := time.Duration(max(ms, 0)) * time.Millisecond
		if holder != "" { // a heartbeat lease: live while its owner beats
			live, hbLeft, err := s.stampLive(ctx, holder)
			if err != nil {
				return Lease{}, err
			}
			if !live && try < 2 {
				expect = cur
				continue
			}
			left = hbLeft
		}
		return Lease{}, &HeldError{Holder: l, TTL: left}
	}
}

// hold records that this Store writes to session with token tok, under a
// lease stamped with hb's epoch.
func (s *Store) hold(session string, tok uint64, hb *heartbeat, epoch uint64) {
	s.tokMu.Lock()
	s.tokens[session] = heldLease{tok: tok, hb: hb, epoch: epoch}
	s.tokMu.Unlock()
}

// stamped reports whether this Store stamped session's lease of token tok
// with hb's epoch.
func (s *Store) stamped(session string, tok uint64, hb *heartbeat, epoch uint64) bool {
	s.tokMu.Lock()
	h, ok := s.tokens[session]
	s.tokMu.Unlock()
	return ok && h.tok == tok && h.hb == hb && h.epoch == epoch
}

// RenewLease keeps l for at least ttl more. It returns ErrLeaseLost if l
// is no longer the session's lease. A lease that lapsed is renewed as
// long as nobody acquired the session since.
func (s *Store) RenewLease(ctx context.Context, session string, l Lease, ttl time.Duration) error {
	if _, err := s.leaseArgs(ctx, session, ttl); err != nil {
		return err
	}
	return s.RenewLeases(ctx, []string{session}, []Lease{l}, ttl)[0]
}

// RenewLeases renews many leases at once: errs[i] is what RenewLease
// would have returned for sessions[i] and leases[i]. While the owners'
// heartbeat has not lapsed (a replica's leases have one owner), that is
// the heartbeat alone, whatever the number of leases; after a lapse, the
// leases are re-stamped, pipelined in one round trip.
func (s *Store) RenewLeases(ctx context.Context, sessions []string, leases []Lease, ttl time.Duration) []error {
	errs := make([]error, len(sessions))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if len(leases) != len(sessions) {
		return fail(errors.New("redisstore: RenewLeases: as many leases as sessions are needed"))
	}
	if err := s.check(ctx); err != nil {
		return fail(err)
	}
	if ttl < time.Millisecond {
		return fail(errBadTTL)
	}
	type beaten struct {
		hb    *heartbeat
		epoch uint64
		err   error
	}
	owners := make(map[string]beaten, 1)
	execs := make([]rueidis.LuaExec, 0, len(sessions))
	at := make([]int, 0, len(sessions))
	for i, session := range sessions {
		owner := leases[i].Owner
		switch {
		case session == "":
			errs[i] = errEmptyID
			continue
		case owner == "":
			errs[i] = errEmptyOwner
			continue
		}
		o, ok := owners[owner]
		if !ok {
			o.hb = s.heartbeatOf(owner)
			o.epoch, o.err = s.beat(ctx, o.hb, ttl)
			owners[owner] = o
		}
		switch {
		case o.err != nil:
			errs[i] = o.err
		case !s.stamped(session, leases[i].Token, o.hb, o.epoch):
			b := s.base(session)
			execs = append(execs, rueidis.LuaExec{Keys: []string{b + "l"},
				Args: []string{b, strconv.FormatUint(leases[i].Token, 10), owner, o.hb.stamp(o.epoch)}})
			at = append(at, i)
		}
	}
	if len(execs) == 0 {
		return errs
	}
	for j, res := range luaRestamp.ExecMulti(ctx, s.c, execs...) {
		i := at[j]
		if errs[i] = mapErr(res.Error()); errs[i] == nil {
			o := owners[leases[i].Owner]
			s.hold(sessions[i], leases[i].Token, o.hb, o.epoch)
		}
	}
	return errs
}

// heartbeat is an owner's liveness, which its leases share.
type heartbeat struct {
	key  string        // "<prefix>:h:<id>"
	id   string        // the owner's nonce in this Store, in its leases' stamps
	turn chan struct{} // one beat at a time (a lock a context can give up on)

	// Written under turn.
	epoch   atomic.Uint64 // the epoch of the live heartbeat, if it lives
	expires atomic.Int64  // mono(): the heartbeat lives at least until then
}

// clockBase is mono's origin.
var clockBase = time.Now()

// mono is the process's monotonic clock in nanoseconds: a heartbeat's
// expiry must not move when the wall clock is stepped.
func mono(t time.Time) int64 { return int64(t.Sub(clockBase)) }

// heartbeatOf returns owner's heartbeat in this Store, made on first use.
// Heartbeats not beaten for a minute are forgotten when there are many:
// their leases are dead, and an owner that comes back gets a new one and
// re-stamps its leases.
func (s *Store) heartbeatOf(owner string) *heartbeat {
	s.hbMu.Lock()
	defer s.hbMu.Unlock()
	if hb, ok := s.hbs[owner]; ok {
		return hb
	}
	if len(s.hbs) >= 64 {
		stale := mono(time.Now().Add(-time.Minute))
		for o, hb := range s.hbs {
			if hb.expires.Load() < stale {
				delete(s.hbs, o)
			}
		}
	}
	s.hbSeq++
	id := s.proc + strconv.FormatUint(s.hbSeq, 10) // proc has a fixed length
	hb := &heartbeat{key: s.prefix + ":h:" + id, id: id, turn: make(chan struct{}, 1)}
	s.hbs[owner] = hb
	return hb
}

// beat refreshes hb so that it lasts at least ttl from now and returns its
// epoch: leases stamped with it are live until then. A heartbeat found
// gone starts a new epoch. A heartbeat known to last ttl from when this
// call began (a beat sent since, by a concurrent renewal or acquisition)
// serves it without another round trip.
func (s *Store) beat(ctx context.Context, hb *heartbeat, ttl time.Duration) (uint64, error) {
	asked := time.Now()
	select {
	case hb.turn <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-hb.turn }()
	epoch := hb.epoch.Load()
	if hb.expires.Load() >= mono(asked.Add(ttl)) {
		return epoch, nil
	}
	sent := time.Now()
	e := strconv.FormatUint(epoch, 10)
	next := strconv.FormatUint(epoch+1, 10)
	kept, err := luaBeat.Exec(ctx, s.c, []string{hb.key}, []string{e, next, strconv.FormatInt(timeMs(ttl), 10)}).AsInt64()
	if err != nil {
		return 0, mapErr(err)
	}
	if kept == 0 {
		epoch++
		hb.epoch.Store(epoch)
		s.log.Info("redisstore: a heartbeat had lapsed: its leases are re-stamped before they are renewed", "heartbeat", hb.key, "epoch", epoch)
	}
	exp := mono(sent.Add(ttl))
	if kept == 1 { // the script raises the TTL, never lowers it
		exp = max(exp, hb.expires.Load())
	}
	hb.expires.Store(exp)
	return epoch, nil
}

// stamp is the stamp of hb's leases in epoch: "<id>.<epoch>".
func (hb *heartbeat) stamp(epoch uint64) string {
	return hb.id + "." + strconv.FormatUint(epoch, 10)
}

// stampLive reports whether the heartbeat a lease's stamp names still
// holds its epoch, and for how long it does at least. A heartbeat seen
// live is remembered until the TTL it had then runs out: it cannot lapse
// before that, so lookups of the leases of a replica that lives (a
// replica forwarding to the owner, readers asking LeaseHeld) cost no
// round trip for it.
func (s *Store) stampLive(ctx context.Context, stamp string) (bool, time.Duration, error) {
	id, epoch, ok := strings.Cut(stamp, ".")
	if !ok || id == "" {
		return false, 0, ErrCorrupt
	}
	asked := time.Now()
	s.liveMu.Lock()
	seen, ok := s.live[id]
	s.liveMu.Unlock()
	if ok && seen.epoch == epoch && asked.Before(seen.until) {
		return true, seen.until.Sub(asked), nil
	}
	key := s.prefix + ":h:" + id
	res := s.c.DoMulti(ctx, s.c.B().Get().Key(key).Build(), s.c.B().Pttl().Key(key).Build())
	v, err := res[0].ToString()
	if rueidis.IsRedisNil(err) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, mapErr(err)
	}
	ms, err := res[1].AsInt64()
	if err != nil {
		return false, 0, mapErr(err)
	}
	if v != epoch || ms <= 0 {
		return false, 0, nil
	}
	left := time.Duration(ms) * time.Millisecond
	s.liveMu.Lock()
	if len(s.live) >= maxLiveSeen {
		for p, l := range s.live {
			if !asked.Before(l.until) {
				delete(s.live, p)
			}
		}
	}
	if len(s.live) < maxLiveSeen {
		s.live[id] = liveSeen{epoch: epoch, until: asked.Add(left)}
	}
	s.liveMu.Unlock()
	return true, left, nil
}

// maxLiveSeen bounds the heartbeats a Store remembers seeing live: one per
// replica process.
const maxLiveSeen = 1024

// liveSeen is an owner's heartbeat as last seen live.
type liveSeen struct {
	epoch string
	until time.Time // it lives at least until then
}

// ReleaseLease gives up l, so that another owner can acquire the session
// at once; this Store stops writing to the session (its writes are fenced
// once the session has a fencing counter). Releasing a lease that lapsed
// is not an error; releasing one that another owner holds since returns
// ErrLeaseLost.
func (s *Store) ReleaseLease(ctx context.Context, session string, l Lease) error {
	lk, err := s.leaseArgs(ctx, session, time.Millisecond)
	if err != nil {
		return err
	}
	s.tokMu.Lock()
	if s.tokens[session].tok == l.Token {
		delete(s.tokens, session)
	}
	s.tokMu.Unlock()
	return mapErr(s.exec(ctx, luaRelease, lk, strconv.FormatUint(l.Token, 10), l.Owner).Error())
}

// LeaseHeld reports whether anybody holds a live lease on the session: a
// GET of the lease and, for a lease of a heartbeat not seen live lately,
// a read of the heartbeat. A reader waiting on a session another replica
// owns asks it now and then.
func (s *Store) LeaseHeld(ctx context.Context, session string) (bool, error) {
	lk, err := s.leaseArgs(ctx, session, time.Millisecond)
	if err != nil {
		return false, err
	}
	val, err := s.c.Do(ctx, s.c.B().Get().Key(lk).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return false, nil
	}
	if err != nil {
		return false, mapErr(err)
	}
	_, stamp, ok := parseLease(val)
	switch {
	case !ok:
		return false, ErrCorrupt
	case stamp == "": // an earlier version's lease: its key's TTL says
		return true, nil
	}
	live, _, err := s.stampLive(ctx, stamp)
	return live, err
}

// Holder returns the session's current live lease and how long it lasts
// unless renewed (its owner's heartbeat, or an earlier version's TTL);
// ErrNoLease if nobody holds one.
func (s *Store) Holder(ctx context.Context, session string) (Lease, time.Duration, error) {
	lk, err := s.leaseArgs(ctx, session, time.Millisecond)
	if err != nil {
		return Lease{}, 0, err
	}
	v, err := s.exec(ctx, luaHolder, lk).ToArray()
	if rueidis.IsRedisNil(err) {
		return Lease{}, 0, ErrNoLease
	}
	if err != nil {
		return Lease{}, 0, mapErr(err)
	}
	if len(v) != 2 {
		return Lease{}, 0, ErrCorrupt
	}
	val, err1 := v[0].ToString()
	ms, err2 := v[1].AsInt64()
	if err1 != nil || err2 != nil {
		return Lease{}, 0, ErrCorrupt
	}
	l, stamp, ok := parseLease(val)
	if !ok {
		return Lease{}, 0, ErrCorrupt
	}
	if stamp == "" {
		return l, time.Duration(max(ms, 0)) * time.Millisecond, nil
	}
	live, left, err := s.stampLive(ctx, stamp)
	switch {
	case err != nil:
		return Lease{}, 0, err
	case !live:
		return Lease{}, 0, ErrNoLease
	}
	return l, left, nil
}

// parseLease reads a lease's value: "<token> @<stamp> <owner>", or an
// earlier version's "<token> <owner>" (stamp "").
func parseLease(val string) (l Lease, stamp string, ok bool) {
	tok, rest, ok := strings.Cut(val, " ")
	if !ok {
		return Lease{}, "", false
	}
	n, err := strconv.ParseUint(tok, 10, 64)
	if err != nil {
		return Lease{}, "", false
	}
	if st, own, ok := strings.Cut(rest, " "); ok && strings.HasPrefix(st, "@") && strings.Contains(st, ".") {
		return Lease{Owner: own, Token: n}, st[1:], true
	}
	return Lease{Owner: rest, Token: n}, "", true
}
