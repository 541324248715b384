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
		return each(len(sessions), err)
	}
	return c.b.RenewAll(ctx, sessions, leases, ttl)
}

// each is err for each of n leases.
func each(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
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

// replica runs one relay replica on rds, in front of the example server,
// with 1 s leases and the Cluster wrap makes of its own.
func replica(t *testing.T, rds *redistest.Server, wrap func(relay.Cluster) relay.Cluster) (*relay.Handler, *httptest.Server) {
	return replicaOn(t, rds, fmt.Sprintf("renew%d", time.Now().UnixNano()), wrap)
}

// replicaOn is replica with the store's key prefix: replicas of one relay
// share it.
func replicaOn(t *testing.T, rds *redistest.Server, prefix string, wrap func(relay.Cluster) relay.Cluster) (*relay.Handler, *httptest.Server) {
	st, err := redisstore.Open(t.Context(), redisstore.Options{URL: rds.URL(), Prefix: prefix})
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
	return h, srv
}

// postMCP POSTs a JSON-RPC body to url, in session sid if not empty.
func postMCP(t *testing.T, url, sid, body string) *http.Response {
	t.Helper()
	return postAs(t, url, sid, "", body)
}

// postAs is postMCP with an Authorization header, if not empty.
func postAs(t *testing.T, url, sid, authorization, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// initialize opens a session on url.
func initialize(t *testing.T, url string) string {
	t.Helper()
	resp := postMCP(t, url, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("initialize: %s", resp.Status)
	}
	sid := resp.Header.Get("Mcp-Session-Id")
	postMCP(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`).Body.Close()
	return sid
}

func leasesKept(t *testing.T, rds *redistest.Server, wrap func(relay.Cluster) relay.Cluster) {
	h, srv := replica(t, rds, wrap)
	const sessions = 40
	for range sessions {
		initialize(t, srv.URL)
	}
	time.Sleep(4 * time.Second) // four lease lifetimes
	if n := h.Counts()["dropped"]; n != 0 {
		t.Fatalf("%d of %d sessions dropped by the replica that owns them", n, sessions)
	}
}

// stalled is a cluster whose renewals hang while stall is set: a replica
// starved of CPU, or a Redis that stopped answering for a moment.
type stalled struct {
	relay.Cluster
	b     batcher
	stall *atomic.Bool
}

func (c stalled) hang(ctx context.Context) error {
	for c.stall.Load() {
		if err := wait(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

func (c stalled) Renew(ctx context.Context, session string, l relay.Lease, ttl time.Duration) error {
	if err := c.hang(ctx); err != nil {
		return err
	}
	return c.Cluster.Renew(ctx, session, l, ttl)
}

func (c stalled) RenewAll(ctx context.Context, sessions []string, leases []relay.Lease, ttl time.Duration) []error {
	if err := c.hang(ctx); err != nil {
		return each(len(sessions), err)
	}
	return c.b.RenewAll(ctx, sessions, leases, ttl)
}

// TestStalledReplicaKeepsItsSessions: a replica whose renewals stall past
// its lease, while no other replica takes its sessions, keeps them and the
// call it was running once renewals go through again: the store renews a
// lapsed lease nobody acquired since, and its fencing token still says no
// one else wrote. Regression: the replica dropped every session whose lease
// had lapsed locally without asking the store, and answered the call in
// flight lost (mcpbench's relay-redis, one replica on a starved machine:
// 64 of 64 streams lost).
func TestStalledReplicaKeepsItsSessions(t *testing.T) {
	var stall atomic.Bool
	h, srv := replica(t, redistest.Start(t), func(c relay.Cluster) relay.Cluster { return stalled{c, c.(batcher), &stall} })
	var sids []string
	for range 5 {
		sids = append(sids, initialize(t, srv.URL))
	}
	// A call that runs through the stall: 30 notifications 100 ms apart.
	call := postMCP(t, srv.URL, sids[0], `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"stream_progress","arguments":{"count":30,"interval_ms":100},"_meta":{"progressToken":"p"}}}`)
	defer call.Body.Close()
	if call.StatusCode != 200 {
		t.Fatalf("tools/call: %s", call.Status)
	}

	stall.Store(true)
	time.Sleep(1800 * time.Millisecond) // past the lease, in Redis too
	stall.Store(false)

	body, err := io.ReadAll(call.Body)
	if err != nil {
		t.Fatalf("reading the call's stream: %v", err)
	}
	if !strings.Contains(string(body), `"result"`) || strings.Contains(string(body), `"error"`) {
		t.Errorf("the call in flight during the stall did not end with its result:\n%s", body)
	}
	time.Sleep(time.Second)
	if n := h.Counts()["dropped"]; n != 0 {
		t.Errorf("%d of %d sessions dropped by the replica that owns them, though nobody took them", n, len(sids))
	}
	for _, sid := range sids {
		resp := postMCP(t, srv.URL, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("session %s after the stall: %s", sid, resp.Status)
		}
	}
}
