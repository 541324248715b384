package redisreplicas_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
	"github.com/mcprelay/mcprelay/relay"
)

// link is a replica's link to Redis that can go silent, as in a
// partition: while cut, every call through it waits for its context.
type link struct {
	mu     sync.Mutex
	silent chan struct{} // while cut; closed by heal
	ids    []string      // sessions whose creation went through the link
}

func (l *link) cutOff() {
	l.mu.Lock()
	if l.silent == nil {
		l.silent = make(chan struct{})
	}
	l.mu.Unlock()
}

func (l *link) heal() {
	l.mu.Lock()
	if l.silent != nil {
		close(l.silent)
		l.silent = nil
	}
	l.mu.Unlock()
}

func (l *link) wait(ctx context.Context) error {
	l.mu.Lock()
	silent := l.silent
	l.mu.Unlock()
	if silent == nil {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-silent:
		return nil
	}
}

// silentStore is a Redis store behind a link. With cutAfterCreate, the
// link goes silent right after Redis has recorded a new session: the write
// is done, the answer never comes.
type silentStore struct {
	*redisstore.Store
	link           *link
	cutAfterCreate bool
}

func (s silentStore) Size(ctx context.Context) (int64, error) {
	if err := s.link.wait(ctx); err != nil {
		return 0, err
	}
	return s.Store.Size(ctx)
}

func (s silentStore) CreateSession(ctx context.Context, sess *eventlog.Session) error {
	if err := s.link.wait(ctx); err != nil {
		return err
	}
	s.link.mu.Lock()
	s.link.ids = append(s.link.ids, sess.ID)
	s.link.mu.Unlock()
	if err := s.Store.CreateSession(ctx, sess); err != nil || !s.cutAfterCreate {
		return err
	}
	s.link.cutOff()
	return s.link.wait(ctx)
}

func (s silentStore) DeleteSession(ctx context.Context, id string) error {
	if err := s.link.wait(ctx); err != nil {
		return err
	}
	return s.Store.DeleteSession(ctx, id)
}

// silentLease is a Cluster whose link goes silent right after Redis has
// granted a lease.
type silentLease struct {
	relay.Cluster
	link *link
}

func (c silentLease) Acquire(ctx context.Context, session string, ttl time.Duration) (relay.Lease, error) {
	l, err := c.Cluster.Acquire(ctx, session, ttl)
	if err != nil {
		return relay.Lease{}, err
	}
	c.link.cutOff()
	if err := c.link.wait(ctx); err != nil {
		return relay.Lease{}, err
	}
	return l, nil
}

// TestNewSessionOnSilentStore: an initialize on a replica whose link to
// Redis goes silent is a 503 within a lease TTL wherever the silence
// begins (the store-size check, right after the session's record is
// written, right after its lease is granted), and a record the store may
// have kept is removed once the link is back: no session the client never
// learned of stays in the store. Regressions: the size check and the
// removal after a failed lease waited for the store without bound, and a
// record written before the answer was lost stayed.
func TestNewSessionOnSilentStore(t *testing.T) {
	rds := redistest.Start(t)
	for _, tc := range []struct {
		name      string
		cutBefore bool // the link is silent from the start
		afterSize bool // set MaxStoreBytes (the size check asks Redis)
		create    bool // silent right after the record is written
		lease     bool // silent right after the lease is granted
	}{
		{name: "size check", cutBefore: true, afterSize: true},
		{name: "after the record", create: true},
		{name: "after the lease", lease: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &link{}
			if tc.cutBefore {
				l.cutOff()
			}
			defer l.heal() // a handler still waiting returns
			var st *redisstore.Store
			_, srv := replicaWith(t, rds, fmt.Sprintf("silent%d", time.Now().UnixNano()), func(c relay.Cluster) relay.Cluster {
				if tc.lease {
					return silentLease{c, l}
				}
				return c
			}, func(o *relay.Options) {
				st = o.Store.(*redisstore.Store)
				o.Store = silentStore{Store: st, link: l, cutAfterCreate: tc.create}
				if tc.afterSize {
					o.Limits.MaxStoreBytes = 1 << 40
				}
			})
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			start := time.Now()
			resp := doMCP(t, ctx, http.MethodPost, srv.URL, nil, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
			resp.Body.Close()
			took := time.Since(start)
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || took > time.Second+500*time.Millisecond {
				t.Fatalf("initialize on a silent store: %s (Retry-After %q) after %v, want 503 with Retry-After within the lease TTL (1 s)",
					resp.Status, resp.Header.Get("Retry-After"), took.Round(time.Millisecond))
			}
			time.Sleep(500 * time.Millisecond) // the relay tries to remove the record while the link is silent
			l.heal()
			l.mu.Lock()
			ids := append([]string(nil), l.ids...)
			l.mu.Unlock()
			if tc.create || tc.lease {
				if len(ids) != 1 {
					t.Fatalf("%d sessions created through the link, want 1", len(ids))
				}
			}
			for _, id := range ids {
				deadline := time.Now().Add(5 * time.Second)
				for {
					_, err := st.Session(t.Context(), id)
					if errors.Is(err, eventlog.ErrNotFound) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the record of the session whose creation failed is still in the store 5 s after the link came back (err %v)", err)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
}
