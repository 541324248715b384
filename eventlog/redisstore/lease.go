package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// AcquireLease makes owner the session's writer for ttl. It succeeds if
// nobody holds an unexpired lease, with a new token from the session's
// fencing counter (INCR), or if owner already holds it, with the same
// token and the TTL reset. Otherwise it returns a *HeldError.
//
// From then on this Store's writes to the session carry the token, and
// every Store's writes to it are refused with eventlog.ErrFenced unless
// they carry the session's latest token. The session need not exist yet.
// Its fencing counter lives until DeleteSession.
func (s *Store) AcquireLease(ctx context.Context, session, owner string, ttl time.Duration) (Lease, error) {
	lk, err := s.leaseArgs(ctx, session, ttl)
	if err != nil {
		return Lease{}, err
	}
	if owner == "" {
		return Lease{}, errEmptyOwner
	}
	v, err := s.exec(ctx, luaAcquire, lk, s.base(session), owner, strconv.FormatInt(timeMs(ttl), 10)).ToArray()
	if err != nil {
		return Lease{}, mapErr(err)
	}
	if len(v) != 4 {
		return Lease{}, ErrCorrupt
	}
	ok, err1 := v[0].AsInt64()
	tok, err2 := v[1].AsUint64()
	own, err3 := v[2].ToString()
	ms, err4 := v[3].AsInt64()
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return Lease{}, ErrCorrupt
	}
	l := Lease{Owner: own, Token: tok}
	if ok != 1 {
		return Lease{}, &HeldError{Holder: l, TTL: time.Duration(max(ms, 0)) * time.Millisecond}
	}
	s.holdToken(session, tok)
	return l, nil
}

// holdToken records that this Store writes to session with token tok.
func (s *Store) holdToken(session string, tok uint64) {
	s.tokMu.Lock()
	s.tokens[session] = tok
	s.tokMu.Unlock()
}

// RenewLease extends l by ttl. It returns ErrLeaseLost if l is no longer
// the session's lease. A lease that expired is renewed as long as nobody
// acquired the session since.
func (s *Store) RenewLease(ctx context.Context, session string, l Lease, ttl time.Duration) error {
	lk, err := s.leaseArgs(ctx, session, ttl)
	if err != nil {
		return err
	}
	e := s.renewExec(lk, session, l, strconv.FormatInt(timeMs(ttl), 10))
	if err := luaRenew.Exec(ctx, s.c, e.Keys, e.Args).Error(); err != nil {
		return mapErr(err)
	}
	s.holdToken(session, l.Token)
	return nil
}

// RenewLeases renews many leases at once, pipelined in one round trip:
// errs[i] is what RenewLease would have returned for sessions[i] and
// leases[i]. A replica that owns thousands of sessions renews them all
// every third of a lease's life; one at a time, that is a round trip and
// a goroutine each.
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
	ms := strconv.FormatInt(timeMs(ttl), 10)
	execs := make([]rueidis.LuaExec, 0, len(sessions))
	at := make([]int, 0, len(sessions))
	for i, session := range sessions {
		if session == "" {
			errs[i] = errEmptyID
			continue
		}
		execs = append(execs, s.renewExec(s.base(session)+"l", session, leases[i], ms))
		at = append(at, i)
	}
	if len(execs) == 0 {
		return errs
	}
	for j, res := range luaRenew.ExecMulti(ctx, s.c, execs...) {
		i := at[j]
		if errs[i] = mapErr(res.Error()); errs[i] == nil {
			s.holdToken(sessions[i], leases[i].Token)
		}
	}
	return errs
}

// renewExec is one run of the renewal script: l's session's lease key lk
// extended to ms milliseconds.
func (s *Store) renewExec(lk, session string, l Lease, ms string) rueidis.LuaExec {
	return rueidis.LuaExec{Keys: []string{lk}, Args: []string{s.base(session), strconv.FormatUint(l.Token, 10), l.Owner, ms}}
}

// ReleaseLease gives up l, so that another owner can acquire the session
// at once; this Store stops writing to the session (its writes are fenced
// once the session has a fencing counter). Releasing a lease that expired
// is not an error; releasing one that another owner holds since returns
// ErrLeaseLost.
func (s *Store) ReleaseLease(ctx context.Context, session string, l Lease) error {
	lk, err := s.leaseArgs(ctx, session, time.Millisecond)
	if err != nil {
		return err
	}
	s.tokMu.Lock()
	if s.tokens[session] == l.Token {
		delete(s.tokens, session)
	}
	s.tokMu.Unlock()
	return mapErr(s.exec(ctx, luaRelease, lk, strconv.FormatUint(l.Token, 10), l.Owner).Error())
}

// LeaseHeld reports whether anybody holds the session's lease: one EXISTS,
// where Holder runs a script. A reader waiting on a session another
// replica owns asks it every second, so at 10,000 such readers this is
// 10,000 commands a second.
func (s *Store) LeaseHeld(ctx context.Context, session string) (bool, error) {
	lk, err := s.leaseArgs(ctx, session, time.Millisecond)
	if err != nil {
		return false, err
	}
	n, err := s.c.Do(ctx, s.c.B().Exists().Key(lk).Build()).AsInt64()
	if err != nil {
		return false, mapErr(err)
	}
	return n > 0, nil
}

// Holder returns the session's current lease and how long it runs unless
// renewed; ErrNoLease if nobody holds one.
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
	tok, own, ok := strings.Cut(val, " ")
	n, err3 := strconv.ParseUint(tok, 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || !ok {
		return Lease{}, 0, ErrCorrupt
	}
	return Lease{Owner: own, Token: n}, time.Duration(max(ms, 0)) * time.Millisecond, nil
}
