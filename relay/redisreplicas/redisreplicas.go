// Package redisreplicas makes relay replicas of one Redis: it provides the
// relay.Cluster of a replica whose Store is an eventlog/redisstore.Store.
// Every replica opens its own Store on the same Redis and advertises the
// URL at which the others reach its MCP endpoint:
//
//	st, err := redisstore.Open(ctx, redisstore.Options{URL: "redis://10.0.0.9:6379/0"})
//	secret, err := st.LoadOrCreateSecret(ctx)
//	h, err := relay.New(relay.Options{
//		Backend: backend.Remote("http://127.0.0.1:3001/mcp"),
//		Store:   st,
//		Secret:  secret,
//		Cluster: redisreplicas.New(st, "http://10.0.0.5:8080/mcp"),
//	})
//
// Leases and their fencing tokens live in Redis next to the session's
// keys; the Store refuses the writes of a replica that lost a session's
// lease. Appends are announced on Redis pub/sub, one connection per
// replica, fanned out to the replica's waiting readers.
package redisreplicas

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/relay"
)

type cluster struct {
	st    *redisstore.Store
	self  string
	owner string // self#nonce: the lease owner, unique to this process
}

// New returns the relay.Cluster of the replica reachable at self (its MCP
// endpoint's URL), sharing st's Redis with the other replicas.
//
// Leases are taken in the name of self plus a nonce of this process: a
// replica restarted under the same URL while its old process still lives
// (paused) gets a new fencing token, so the old one is fenced. The nonce
// is a URL fragment, which HTTP clients never send: the lease's owner is
// still the address to forward to.
func New(st *redisstore.Store, self string) relay.Cluster {
	var nonce [8]byte
	rand.Read(nonce[:])
	return &cluster{st: st, self: self, owner: self + "#" + hex.EncodeToString(nonce[:])}
}

func (c *cluster) Self() string { return c.self }

func (c *cluster) Acquire(ctx context.Context, session string, ttl time.Duration) (relay.Lease, error) {
	l, err := c.st.AcquireLease(ctx, session, c.owner, ttl)
	var held *redisstore.HeldError
	if errors.As(err, &held) {
		return relay.Lease{}, &relay.LeaseHeldError{Holder: relay.Lease(held.Holder)}
	}
	return relay.Lease(l), err
}

func (c *cluster) Renew(ctx context.Context, session string, l relay.Lease, ttl time.Duration) error {
	err := c.st.RenewLease(ctx, session, redisstore.Lease(l), ttl)
	if errors.Is(err, redisstore.ErrLeaseLost) {
		return errors.Join(relay.ErrLeaseLost, err)
	}
	return err
}

// RenewAll renews many leases in one round trip (the relay uses it when a
// Cluster has it): errs[i] is Renew's error for sessions[i].
func (c *cluster) RenewAll(ctx context.Context, sessions []string, leases []relay.Lease, ttl time.Duration) []error {
	ls := make([]redisstore.Lease, len(leases))
	for i, l := range leases {
		ls[i] = redisstore.Lease(l)
	}
	errs := c.st.RenewLeases(ctx, sessions, ls, ttl)
	for i, err := range errs {
		if errors.Is(err, redisstore.ErrLeaseLost) {
			errs[i] = errors.Join(relay.ErrLeaseLost, err)
		}
	}
	return errs
}

// Held reports whether anybody holds the session's lease (the relay asks
// it, when a Cluster has it, before an idle reader looks up a session
// another replica owns): one GET while the owner's heartbeat is known to
// live, where a lookup runs three scripts
// (the session record, a lease acquisition, the list of its streams).
func (c *cluster) Held(ctx context.Context, session string) (bool, error) {
	return c.st.LeaseHeld(ctx, session)
}

func (c *cluster) Release(ctx context.Context, session string, l relay.Lease) error {
	err := c.st.ReleaseLease(ctx, session, redisstore.Lease(l))
	if errors.Is(err, redisstore.ErrLeaseLost) {
		return nil // another replica holds it already: nothing to give up
	}
	return err
}

func (c *cluster) Watch(key string) (<-chan struct{}, func()) {
	return c.st.Watch(key)
}

// WatchEpoch tells an idle reader whether the watch may have missed an
// append (the relay asks it, when a Cluster has it, before re-reading the
// log of a stream that had no news): see redisstore.Store.WatchEpoch.
func (c *cluster) WatchEpoch() (uint64, bool) { return c.st.WatchEpoch() }
