package redisstore_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
)

// pair opens two stores (two replicas) on one server and prefix.
func pair(t *testing.T, srv *redistest.Server) (a, b *redisstore.Store) {
	a, b, _ = pairAt(t, srv)
	return a, b
}

// pairAt is pair, also returning the prefix, for tests that look at keys.
func pairAt(t *testing.T, srv *redistest.Server) (a, b *redisstore.Store, prefix string) {
	prefix = freshPrefix()
	return open(t, srv, redisstore.Options{Prefix: prefix}), open(t, srv, redisstore.Options{Prefix: prefix}), prefix
}

func mustCreate(t *testing.T, st *redisstore.Store, sid, key string) {
	t.Helper()
	if err := st.CreateSession(t.Context(), &eventlog.Session{ID: sid, Incarnation: 1}); err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	if err := st.CreateStream(t.Context(), &eventlog.Stream{Key: key, Session: sid, Generation: 1}); err != nil {
		t.Fatalf("CreateStream: %v", err)
	}
}

func TestLeaseHeld(t *testing.T) {
	srv := redistest.Start(t)
	a, b := pair(t, srv)
	ctx := t.Context()
	la, err := a.AcquireLease(ctx, "s1", "http://a", time.Minute)
	if err != nil || la.Owner != "http://a" || la.Token == 0 {
		t.Fatalf("AcquireLease(a) = %+v, %v", la, err)
	}
	_, err = b.AcquireLease(ctx, "s1", "http://b", time.Minute)
	var held *redisstore.HeldError
	if !errors.Is(err, redisstore.ErrLeaseHeld) || !errors.As(err, &held) {
		t.Fatalf("AcquireLease(b) = %v, want a *HeldError wrapping ErrLeaseHeld", err)
	}
	if held.Holder != la || held.TTL <= 0 || held.TTL > time.Minute {
		t.Errorf("HeldError = %+v, want holder %+v with a TTL in (0, 1m]", held, la)
	}
	again, err := b.AcquireLease(ctx, "s1", "http://a", time.Minute) // the same owner, e.g. after a restart
	if err != nil || again != la {
		t.Errorf("AcquireLease by the holder = %+v, %v; want %+v", again, err, la)
	}
	h, ttl, err := b.Holder(ctx, "s1")
	if err != nil || h != la || ttl <= 0 {
		t.Errorf("Holder = %+v, %v, %v; want %+v", h, ttl, err, la)
	}
	if _, _, err := b.Holder(ctx, "s2"); !errors.Is(err, redisstore.ErrNoLease) {
		t.Errorf("Holder of an unleased session: %v, want ErrNoLease", err)
	}
	if held, err := b.LeaseHeld(ctx, "s1"); !held || err != nil {
		t.Errorf("LeaseHeld of a leased session = %v, %v; want true", held, err)
	}
	if held, err := b.LeaseHeld(ctx, "s2"); held || err != nil {
		t.Errorf("LeaseHeld of an unleased session = %v, %v; want false", held, err)
	}
	if err := b.ReleaseLease(ctx, "s1", redisstore.Lease{Owner: "http://b", Token: la.Token}); !errors.Is(err, redisstore.ErrLeaseLost) {
		t.Errorf("ReleaseLease by a non-holder: %v, want ErrLeaseLost", err)
	}
	if err := a.ReleaseLease(ctx, "s1", la); err != nil {
		t.Fatalf("ReleaseLease: %v", err)
	}
	if held, err := b.LeaseHeld(ctx, "s1"); held || err != nil {
		t.Errorf("LeaseHeld after the release = %v, %v; want false", held, err)
	}
	if lb, err := b.AcquireLease(ctx, "s1", "http://b", time.Minute); err != nil || lb.Token <= la.Token {
		t.Errorf("AcquireLease after release = %+v, %v; want a token above %d", lb, err, la.Token)
	}
}

// TestLeaseZombieFenced: a store whose lease expired and was taken over
// cannot write to the session any more, even though its lease simply ran
// out; the new holder can.
func TestLeaseZombieFenced(t *testing.T) {
	srv := redistest.Start(t)
	a, b := pair(t, srv)
	ctx := t.Context()
	la, err := a.AcquireLease(ctx, "s1", "http://a", 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, a, "s1", "k")
	if _, err := a.Append(ctx, "k", false, eventlog.Event{Data: []byte("1")}); err != nil {
		t.Fatalf("Append by the holder: %v", err)
	}
	// Without the token, b is fenced already.
	if _, err := b.Append(ctx, "k", false, eventlog.Event{Data: []byte("b")}); !errors.Is(err, eventlog.ErrFenced) {
		t.Fatalf("Append without the token: %v, want ErrFenced", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, _, err := b.Holder(ctx, "s1")
		if errors.Is(err, redisstore.ErrNoLease) {
			if held, err := b.LeaseHeld(ctx, "s1"); held || err != nil {
				t.Fatalf("LeaseHeld of an expired lease = %v, %v; want false", held, err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease did not expire: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	lb, err := b.AcquireLease(ctx, "s1", "http://b", time.Minute)
	if err != nil || lb.Token <= la.Token {
		t.Fatalf("takeover = %+v, %v; want a token above %d", lb, err, la.Token)
	}
	zombie := []struct {
		name string
		op   func() error
	}{
		{"Append", func() error { _, err := a.Append(ctx, "k", false, eventlog.Event{Data: []byte("z")}); return err }},
		{"terminal Append", func() error { _, err := a.Append(ctx, "k", true, eventlog.Event{Data: []byte("z")}); return err }},
		{"UpdateSession", func() error { return a.UpdateSession(ctx, &eventlog.Session{ID: "s1", Incarnation: 9}) }},
		{"CreateStream", func() error {
			return a.CreateStream(ctx, &eventlog.Stream{Key: "k2", Session: "s1", Generation: 1})
		}},
	}
	for _, z := range zombie {
		if err := z.op(); !errors.Is(err, eventlog.ErrFenced) {
			t.Errorf("zombie %s: %v, want ErrFenced", z.name, err)
		}
	}
	if err := a.RenewLease(ctx, "s1", la, time.Minute); !errors.Is(err, redisstore.ErrLeaseLost) {
		t.Errorf("RenewLease after expiry and takeover: %v, want ErrLeaseLost", err)
	}
	if _, err := a.Append(ctx, "k", false, eventlog.Event{Data: []byte("z")}); !errors.Is(err, eventlog.ErrFenced) {
		t.Errorf("zombie Append after its failed renewal: %v, want ErrFenced", err)
	}
	if last, err := b.Append(ctx, "k", false, eventlog.Event{Data: []byte("2")}); err != nil || last != 2 {
		t.Errorf("Append by the new holder = %d, %v; want 2", last, err)
	}
	// A session leased before it exists is created by its holder only.
	if _, err := b.AcquireLease(ctx, "s9", "http://b", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateSession(ctx, &eventlog.Session{ID: "s9", Incarnation: 1}); !errors.Is(err, eventlog.ErrFenced) {
		t.Errorf("CreateSession of a session leased by another: %v, want ErrFenced", err)
	}
	if err := b.CreateSession(ctx, &eventlog.Session{ID: "s9", Incarnation: 1}); err != nil {
		t.Errorf("CreateSession by the holder: %v", err)
	}
	if _, _, err := a.Read(ctx, "k2", 0, 10, nil); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("the fenced CreateStream left a stream behind: %v", err)
	}
	sess, err := b.Session(ctx, "s1")
	if err != nil || sess.Incarnation != 1 {
		t.Errorf("Session after the fenced update = %+v, %v; want incarnation 1", sess, err)
	}
	_, evs, err := b.Read(ctx, "k", 0, 10, nil)
	if err != nil || len(evs) != 2 || string(evs[0].Data) != "1" || string(evs[1].Data) != "2" {
		t.Errorf("Read = %v, %v; want the holders' events 1 and 2 only", evs, err)
	}
}

func TestLeaseConcurrentAcquire(t *testing.T) {
	srv := redistest.Start(t)
	const n = 8
	p := freshPrefix()
	stores := make([]*redisstore.Store, n)
	for i := range stores {
		stores[i] = open(t, srv, redisstore.Options{Prefix: p})
	}
	for round := range 5 {
		sid := fmt.Sprint("s", round)
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []redisstore.Lease
			holders []redisstore.Lease
		)
		start := make(chan struct{})
		for i, st := range stores {
			wg.Go(func() {
				<-start
				l, err := st.AcquireLease(t.Context(), sid, fmt.Sprint("http://r", i), time.Minute)
				mu.Lock()
				defer mu.Unlock()
				var held *redisstore.HeldError
				switch {
				case err == nil:
					winners = append(winners, l)
				case errors.As(err, &held):
					holders = append(holders, held.Holder)
				default:
					t.Errorf("AcquireLease: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("round %d: %d winners %v, want exactly 1", round, len(winners), winners)
		}
		for _, h := range holders {
			if h != winners[0] {
				t.Errorf("round %d: a loser was told the holder is %+v, the winner is %+v", round, h, winners[0])
			}
		}
	}
}

func TestLeaseTokensGrow(t *testing.T) {
	srv := redistest.Start(t)
	a, b := pair(t, srv)
	ctx := t.Context()
	var last uint64
	for i := range 10 {
		st, owner := a, "http://a"
		if i%2 == 1 {
			st, owner = b, "http://b"
		}
		l, err := st.AcquireLease(ctx, "s1", owner, time.Minute)
		if err != nil {
			t.Fatalf("cycle %d: AcquireLease: %v", i, err)
		}
		if l.Token <= last {
			t.Fatalf("cycle %d: token %d after %d, want strictly growing", i, l.Token, last)
		}
		last = l.Token
		if err := st.RenewLease(ctx, "s1", l, time.Minute); err != nil {
			t.Fatalf("cycle %d: RenewLease: %v", i, err)
		}
		if err := st.ReleaseLease(ctx, "s1", l); err != nil {
			t.Fatalf("cycle %d: ReleaseLease: %v", i, err)
		}
		if _, _, err := st.Holder(ctx, "s1"); !errors.Is(err, redisstore.ErrNoLease) {
			t.Fatalf("cycle %d: Holder after release: %v, want ErrNoLease", i, err)
		}
	}
}

// TestLeaseRenewAfterExpiry: a lease that ran out but that nobody took
// over is renewed, and its holder keeps writing.
func TestLeaseRenewAfterExpiry(t *testing.T) {
	srv := redistest.Start(t)
	a, _ := pair(t, srv)
	ctx := t.Context()
	l, err := a.AcquireLease(ctx, "s1", "http://a", 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, a, "s1", "k")
	time.Sleep(100 * time.Millisecond)
	if _, _, err := a.Holder(ctx, "s1"); !errors.Is(err, redisstore.ErrNoLease) {
		t.Fatalf("Holder after expiry: %v, want ErrNoLease", err)
	}
	if err := a.RenewLease(ctx, "s1", l, time.Minute); err != nil {
		t.Fatalf("RenewLease after expiry without takeover: %v", err)
	}
	if h, _, err := a.Holder(ctx, "s1"); err != nil || h != l {
		t.Errorf("Holder after renewal = %+v, %v; want %+v", h, err, l)
	}
	if _, err := a.Append(ctx, "k", false, eventlog.Event{Data: []byte("x")}); err != nil {
		t.Errorf("Append after renewal: %v", err)
	}
}

// TestDeleteSessionUnfenced: any store may delete a leased session, and
// the session's lease goes with it.
func TestDeleteSessionUnfenced(t *testing.T) {
	srv := redistest.Start(t)
	a, b := pair(t, srv)
	ctx := t.Context()
	if _, err := a.AcquireLease(ctx, "s1", "http://a", time.Minute); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, a, "s1", "k")
	if err := b.DeleteSession(ctx, "s1"); err != nil {
		t.Fatalf("DeleteSession by a non-holder: %v", err)
	}
	if _, _, err := b.Holder(ctx, "s1"); !errors.Is(err, redisstore.ErrNoLease) {
		t.Errorf("Holder after DeleteSession: %v, want ErrNoLease", err)
	}
	if _, _, err := a.Read(ctx, "k", 0, 1, nil); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("Read after DeleteSession: %v, want ErrNotFound", err)
	}
}

// acquireMany acquires sessions r0 to r<n-1> for http://a on st.
func acquireMany(t *testing.T, st *redisstore.Store, n int, ttl time.Duration) (sessions []string, leases []redisstore.Lease) {
	t.Helper()
	for i := range n {
		sid := fmt.Sprintf("r%d", i)
		l, err := st.AcquireLease(t.Context(), sid, "http://a", ttl)
		if err != nil {
			t.Fatal(err)
		}
		sessions, leases = append(sessions, sid), append(leases, l)
	}
	return sessions, leases
}

// TestRenewLeases: many leases renewed in one call, each with the outcome
// RenewLease would give it: held ones extended, one taken by another owner
// since its expiry lost, an empty session id refused.
func TestRenewLeases(t *testing.T) {
	srv := redistest.Start(t)
	a, b := pair(t, srv)
	ctx := t.Context()
	// More than one batch of any size a caller picks.
	sessions, leases := acquireMany(t, a, 300, 200*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // all expired; r7 is taken by b
	if _, err := b.AcquireLease(ctx, "r7", "http://b", time.Minute); err != nil {
		t.Fatal(err)
	}
	errs := a.RenewLeases(ctx, append(sessions, ""), append(leases, redisstore.Lease{}), time.Minute)
	if len(errs) != len(sessions)+1 {
		t.Fatalf("%d errors for %d sessions", len(errs), len(sessions)+1)
	}
	for i, err := range errs[:len(sessions)] {
		switch {
		case sessions[i] == "r7" && !errors.Is(err, redisstore.ErrLeaseLost):
			t.Errorf("r7, taken by another owner: %v, want ErrLeaseLost", err)
		case sessions[i] != "r7" && err != nil:
			t.Errorf("%s: %v", sessions[i], err)
		}
	}
	if errs[len(sessions)] == nil {
		t.Error("an empty session id was renewed")
	}
	h, ttl, err := b.Holder(ctx, "r9")
	if err != nil || h != leases[9] || ttl < 30*time.Second {
		t.Errorf("r9 after RenewLeases: %+v, %v, %v; want %+v with about a minute", h, ttl, err, leases[9])
	}
}

// waitNoLease waits until nobody holds a live lease on sid: its owner's
// heartbeat has run out.
func waitNoLease(t *testing.T, st *redisstore.Store, sid string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, _, err := st.Holder(t.Context(), sid)
		if errors.Is(err, redisstore.ErrNoLease) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease on %s did not lapse: %v", sid, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRenewalIsOneHeartbeat: a Store whose heartbeat has not lapsed renews
// all its leases with the heartbeat alone, one script however many leases
// it holds, and they stay held.
func TestRenewalIsOneHeartbeat(t *testing.T) {
	srv := redistest.Start(t)
	a, b := pair(t, srv)
	ctx := t.Context()
	sessions, leases := acquireMany(t, a, 300, time.Minute)
	before := srv.ScriptCalls(t)
	for i, err := range a.RenewLeases(ctx, sessions, leases, time.Minute) {
		if err != nil {
			t.Fatalf("%s: %v", sessions[i], err)
		}
	}
	if n := srv.ScriptCalls(t) - before; n > 1 {
		t.Errorf("renewing %d leases ran %d scripts, want 1 (the heartbeat)", len(sessions), n)
	}
	if err := a.RenewLease(ctx, "r3", leases[3], time.Minute); err != nil {
		t.Errorf("RenewLease: %v", err)
	}
	for _, i := range []int{0, 150, 299} {
		if h, ttl, err := b.Holder(ctx, sessions[i]); err != nil || h != leases[i] || ttl < 30*time.Second {
			t.Errorf("%s after the renewal: %+v, %v, %v; want %+v with about a minute", sessions[i], h, ttl, err, leases[i])
		}
		if _, err := b.AcquireLease(ctx, sessions[i], "http://b", time.Minute); !errors.Is(err, redisstore.ErrLeaseHeld) {
			t.Errorf("%s acquired by another owner: %v, want ErrLeaseHeld", sessions[i], err)
		}
	}
}

// TestLeaseRestampRace: an owner whose heartbeat lapsed and an acquirer
// that found it gone race for the lease; exactly one wins, in either
// order. The owner re-stamps its lease before it acts again, so an
// acquirer that read the lease before then cannot take it; an acquirer
// that took it first makes the owner's renewal fail.
func TestLeaseRestampRace(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	a, b, prefix := pairAt(t, srv)
	ctx := t.Context()
	lease := func(sid string) string {
		t.Helper()
		v, err := adm.Do(ctx, adm.B().Get().Key(sid).Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	key := func(sid string) string { return prefix + ":{" + sid + "}:l" }

	// The owner comes back first.
	la, err := a.AcquireLease(ctx, "s1", "http://a", 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	read := lease(key("s1"))
	waitNoLease(t, b, "s1")
	if err := a.RenewLease(ctx, "s1", la, time.Minute); err != nil {
		t.Fatalf("the owner's renewal after its lapse: %v", err)
	}
	if _, err := redisstore.AcquireAfterRead(b, ctx, "s1", "http://b", time.Minute, read); !errors.Is(err, redisstore.ErrLeaseHeld) {
		t.Errorf("an acquirer that read the lease before the owner came back took it: %v", err)
	}
	if h, _, err := b.Holder(ctx, "s1"); err != nil || h != la {
		t.Errorf("Holder = %+v, %v; want the owner's %+v", h, err, la)
	}

	// The acquirer takes it first. (Another owner: http://a's heartbeat now
	// lasts a minute, for all its leases.)
	la, err = a.AcquireLease(ctx, "s2", "http://c", 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	read = lease(key("s2"))
	waitNoLease(t, b, "s2")
	lb, err := redisstore.AcquireAfterRead(b, ctx, "s2", "http://b", time.Minute, read)
	if err != nil || lb.Token <= la.Token {
		t.Fatalf("takeover = %+v, %v; want a token above %d", lb, err, la.Token)
	}
	if err := a.RenewLease(ctx, "s2", la, time.Minute); !errors.Is(err, redisstore.ErrLeaseLost) {
		t.Errorf("the owner's renewal after the takeover: %v, want ErrLeaseLost", err)
	}
}

// TestLeaseOfEarlierVersion: a lease written by an earlier version,
// "<token> <owner>" with a TTL of its own, is honoured until it expires;
// its owner, upgraded, keeps it under its heartbeat with the same token.
func TestLeaseOfEarlierVersion(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	a, b, prefix := pairAt(t, srv)
	ctx := t.Context()
	old := func(sid, value string, ttl time.Duration) {
		t.Helper()
		tok, _, _ := strings.Cut(value, " ")
		for _, c := range []rueidis.Completed{
			adm.B().Set().Key(prefix + ":{" + sid + "}:f").Value(tok).Build(),
			adm.B().Set().Key(prefix + ":{" + sid + "}:l").Value(value).Px(ttl).Build(),
		} {
			if err := adm.Do(ctx, c).Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	old("s1", "7 http://old", 300*time.Millisecond)
	var held *redisstore.HeldError
	if _, err := b.AcquireLease(ctx, "s1", "http://b", time.Minute); !errors.As(err, &held) ||
		held.Holder != (redisstore.Lease{Owner: "http://old", Token: 7}) || held.TTL <= 0 || held.TTL > 300*time.Millisecond {
		t.Fatalf("AcquireLease over an earlier version's lease: %v (%+v); want it held by http://old, token 7, for up to 300ms", err, held)
	}
	if ok, err := b.LeaseHeld(ctx, "s1"); !ok || err != nil {
		t.Errorf("LeaseHeld = %v, %v; want true", ok, err)
	}
	waitNoLease(t, b, "s1")
	if l, err := b.AcquireLease(ctx, "s1", "http://b", time.Minute); err != nil || l.Token != 8 {
		t.Errorf("AcquireLease after it expired = %+v, %v; want token 8", l, err)
	}

	old("s2", "9 http://a", time.Minute)
	if l, err := a.AcquireLease(ctx, "s2", "http://a", time.Minute); err != nil || l != (redisstore.Lease{Owner: "http://a", Token: 9}) {
		t.Fatalf("AcquireLease by the earlier lease's owner = %+v, %v; want token 9 kept", l, err)
	}
	if ttl, err := adm.Do(ctx, adm.B().Pttl().Key(prefix+":{s2}:l").Build()).AsInt64(); err != nil || ttl != -1 {
		t.Errorf("the kept lease: PTTL %d, %v; want none: it lives by the heartbeat now", ttl, err)
	}
}

// TestHeartbeatPerOwner: an owner that stops renewing loses its leases
// when its heartbeat runs out, even while another owner on the same Store
// keeps renewing its own (two relays on one Store, one of them closed);
// the renewed lease outlives its TTL several times over.
func TestHeartbeatPerOwner(t *testing.T) {
	srv := redistest.Start(t)
	a, b := pair(t, srv)
	ctx := t.Context()
	if _, err := a.AcquireLease(ctx, "gone", "http://a#1", 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	const keptTTL = 150 * time.Millisecond
	kept, err := a.AcquireLease(ctx, "kept", "http://a#2", keptTTL)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if err := a.RenewLease(ctx, "kept", kept, keptTTL); err != nil {
				t.Errorf("RenewLease: %v", err)
				return
			}
		}
	})
	waitNoLease(t, b, "gone")
	time.Sleep(4 * keptTTL)
	close(done)
	wg.Wait()
	if _, err := b.AcquireLease(ctx, "gone", "http://b", time.Minute); err != nil {
		t.Errorf("the lease of the owner that stopped renewing: %v, want it free", err)
	}
	if _, err := b.AcquireLease(ctx, "kept", "http://b", time.Minute); !errors.Is(err, redisstore.ErrLeaseHeld) {
		t.Errorf("the lease still renewed: %v, want ErrLeaseHeld", err)
	}
}
