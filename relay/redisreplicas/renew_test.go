package redisreplicas_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/relay/redisreplicas"
)

// slowRenew is a cluster whose renewals each take d: a Redis busy with the
// appends of many streams, as mcpbench's relay-redis target saw it. It
// renews one lease per call (relay.Cluster hides the cluster's RenewAll).
type slowRenew struct {
	relay.Cluster
	d time.Duration
}

func (c slowRenew) Renew(ctx context.Context, session string, l relay.Lease, ttl time.Duration) error {
	if err := wait(ctx, c.d); err != nil {
		return err
	}
	return c.Cluster.Renew(ctx, session, l, ttl)
}

func wait(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// batcher is the RenewAll the relay looks for.
type batcher interface {
	RenewAll(ctx context.Context, sessions []string, leases []relay.Lease, ttl time.Duration) []error
}

// slowBatch is slowRenew with the cluster's RenewAll, each call of which
// takes d too.
type slowBatch struct {
	slowRenew
	b     batcher
	calls *atomic.Int64
}

func (c slowBatch) RenewAll(ctx context.Context, sessions []string, leases []relay.Lease, ttl time.Duration) []error {
	c.calls.Add(1)
	if err := wait(ctx, c.d); err != nil {
		errs := make([]error, len(sessions))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	return c.b.RenewAll(ctx, sessions, leases, ttl)
}

// TestLeasesKeptWhenRenewalsAreSlow: a replica owning many sessions keeps
// all their leases when each renewal takes a while. Regression: the
// leases were renewed one after another, so with 40 sessions and 40 ms
// per renewal a round took 1.6 s of a 1 s lease, and the replica dropped
// its own sessions (and their calls in flight) every round.
func TestLeasesKeptWhenRenewalsAreSlow(t *testing.T) {
	rds := redistest.Start(t)
	t.Run("one by one", func(t *testing.T) {
		leasesKept(t, rds, func(c relay.Cluster) relay.Cluster { return slowRenew{c, 40 * time.Millisecond} })
	})
	t.Run("batched", func(t *testing.T) {
		var calls atomic.Int64
		leasesKept(t, rds, func(c relay.Cluster) relay.Cluster {
			return slowBatch{slowRenew{c, 40 * time.Millisecond}, c.(batcher), &calls}
		})
		if calls.Load() == 0 {
			t.Error("the relay never renewed in a batch")
		}
	})
}

func leasesKept(t *testing.T, rds *redistest.Server, wrap func(relay.Cluster) relay.Cluster) {
	st, err := redisstore.Open(t.Context(), redisstore.Options{URL: rds.URL(), Prefix: fmt.Sprintf("renew%d", time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	secret, err := st.LoadOrCreateSecret(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(nil)
	self := "http://" + srv.Listener.Addr().String() + "/mcp"
	h, err := relay.New(relay.Options{
		Backend: backend.SDK(exampleserver.New(nil), nil), Store: st, Secret: secret, LeaseTTL: time.Second,
		Cluster: wrap(redisreplicas.New(st, self)),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = h
	srv.Start()
	t.Cleanup(func() { h.Close(); srv.CloseClientConnections(); srv.Close() })

	const sessions = 40
	for range sessions {
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("initialize: %s", resp.Status)
		}
	}
	time.Sleep(4 * time.Second) // four lease lifetimes
	if n := h.Counts()["dropped"]; n != 0 {
		t.Fatalf("%d of %d sessions dropped by the replica that owns them", n, sessions)
	}
}
