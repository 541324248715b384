package redisreplicas_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
	"github.com/mcprelay/mcprelay/relay"
)

// holder is the optional Cluster method an idle reader asks.
type holder interface {
	Held(ctx context.Context, session string) (bool, error)
}

// counting counts a replica's lease acquisitions; it keeps the cluster's
// Held and RenewAll.
type counting struct {
	relay.Cluster
	acquires *atomic.Int64
}

func (c counting) Acquire(ctx context.Context, session string, ttl time.Duration) (relay.Lease, error) {
	c.acquires.Add(1)
	return c.Cluster.Acquire(ctx, session, ttl)
}

func (c counting) Held(ctx context.Context, session string) (bool, error) {
	return c.Cluster.(holder).Held(ctx, session)
}

func (c counting) RenewAll(ctx context.Context, sessions []string, leases []relay.Lease, ttl time.Duration) []error {
	return c.Cluster.(batcher).RenewAll(ctx, sessions, leases, ttl)
}

// TestIdleReaderOnOtherReplica: a client's GET stream on replica B, for a
// session A owns, waits idle. Every second without news B checks whether
// A's lease lapsed, and only then looks the session up to take it over.
// Regression: B looked the session up every second regardless (the
// session record, a lease acquisition that failed, the list of its
// streams): with 10,000 such streams, Redis was busy enough that a
// resume's first event took 119 ms at p99, against 9 ms without the idle
// streams (mcpbench relay-redis3; with this check, Redis runs about a
// fifth fewer commands a second, and that p99 moves inside the noise).
// When A goes away, B still takes the session over.
func TestIdleReaderOnOtherReplica(t *testing.T) {
	rds := redistest.Start(t)
	prefix := fmt.Sprintf("idle%d", time.Now().UnixNano())
	a, srvA := replicaOn(t, rds, prefix, func(c relay.Cluster) relay.Cluster { return c })
	var acquires atomic.Int64
	_, srvB := replicaOn(t, rds, prefix, func(c relay.Cluster) relay.Cluster { return counting{c, &acquires} })
	sid := initialize(t, srvA.URL)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srvB.URL, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET on the other replica: %s", resp.Status)
	}
	acquires.Store(0)
	time.Sleep(3500 * time.Millisecond) // three idle checks
	if n := acquires.Load(); n != 0 {
		t.Errorf("the idle reader on the other replica tried to acquire the lease %d times while its owner held it", n)
	}

	// A goes away: B's idle reader takes the session over.
	a.Close()
	srvA.CloseClientConnections()
	srvA.Close()
	st, err := redisstore.Open(t.Context(), redisstore.Options{URL: rds.URL(), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, _, err := st.Holder(t.Context(), sid)
		if err == nil && strings.HasPrefix(h.Owner, srvB.URL) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after its owner went away, the session's lease is %+v (%v), want B's", h, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
