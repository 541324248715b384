package redisreplicas_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/mcprelay/mcprelay/internal/mcptest"
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
	return replicaWith(t, rds, prefix, wrap, nil)
}

// replicaWith is replicaOn with options set changes, if not nil.
func replicaWith(t *testing.T, rds *redistest.Server, prefix string, wrap func(relay.Cluster) relay.Cluster, set func(*relay.Options)) (*relay.Handler, *httptest.Server) {
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
	opts := relay.Options{
		Backend: backend.SDK(exampleserver.New(nil), nil), Store: st, Secret: secret, LeaseTTL: time.Second,
		Cluster: wrap(redisreplicas.New(st, self)),
	}
	if set != nil {
		set(&opts)
	}
	h, err := relay.New(opts)
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
	return doMCP(t, t.Context(), "POST", url, map[string]string{"Mcp-Session-Id": sid, "Authorization": authorization}, body)
}

// doMCP sends a request to an MCP endpoint with the headers in hdr whose
// value is not "" (and the protocol version, with a session).
func doMCP(t *testing.T, ctx context.Context, method, url string, hdr map[string]string, body string) *http.Response {
	t.Helper()
	if hdr["Mcp-Session-Id"] != "" {
		hdr["Mcp-Protocol-Version"] = "2025-06-18"
	}
	req, err := mcptest.NewRequest(ctx, method, url, hdr, body)
	if err != nil {
		t.Fatal(err)
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

// unreachable is a cluster whose renewals fail at once while cut is set:
// a replica cut off from Redis (connection refused), another replica
// perhaps taking its sessions over meanwhile.
type unreachable struct {
	relay.Cluster
	cut *atomic.Bool
}

var errUnreachable = errors.New("dial tcp: connection refused")

func (c unreachable) Renew(ctx context.Context, session string, l relay.Lease, ttl time.Duration) error {
	if c.cut.Load() {
		return errUnreachable
	}
	return c.Cluster.Renew(ctx, session, l, ttl)
}

// TestReplicaLetsGoAfterPatience: a replica that cannot renew a session's
// lease for LeasePatience (Redis out of reach, not another replica holding
// the lease) lets the session go: its call in flight stops there, and its
// client's stream ends, so that a replica cut off from the store does not
// go on running tools for a session another replica may have re-created.
// Until then it keeps the session (a short outage costs nothing). Once the
// store is back, the next request restores the session on a new
// generation. Regression: the replica kept such a session, its backend
// side and its calls running for as long as the store was out of reach.
func TestReplicaLetsGoAfterPatience(t *testing.T) {
	var cut atomic.Bool
	const patience = 3 * time.Second
	var logs syncBuffer
	h, srv := replicaWith(t, redistest.Start(t), fmt.Sprintf("patience%d", time.Now().UnixNano()),
		func(c relay.Cluster) relay.Cluster { return unreachable{c, &cut} },
		func(o *relay.Options) {
			o.LeasePatience = patience
			o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		})
	sid := initialize(t, srv.URL)
	for range 4 { // idle ones: their renewals fail too
		initialize(t, srv.URL)
	}
	// A call that outlasts the patience: 100 notifications 100 ms apart.
	call := postMCP(t, srv.URL, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"stream_progress","arguments":{"count":100,"interval_ms":100},"_meta":{"progressToken":"p"}}}`)
	defer call.Body.Close()
	if call.StatusCode != 200 {
		t.Fatalf("tools/call: %s", call.Status)
	}
	ended := make(chan time.Time, 1)
	go func() {
		io.Copy(io.Discard, call.Body)
		ended <- time.Now()
	}()

	cut.Store(true)
	cutAt := time.Now()
	time.Sleep(patience / 2)
	if n := h.Counts()["dropped"]; n != 0 {
		t.Errorf("the session was let go %v into a %v patience", time.Since(cutAt).Round(time.Millisecond), patience)
	}
	select {
	case at := <-ended:
		t.Fatalf("the call's stream ended %v into a %v patience", at.Sub(cutAt).Round(time.Millisecond), patience)
	default:
	}
	select {
	case at := <-ended:
		if took := at.Sub(cutAt); took < patience {
			t.Errorf("the call's stream ended %v into a %v patience", took.Round(time.Millisecond), patience)
		}
	case <-time.After(patience/2 + 2*time.Second): // the rest of the patience, and a keeper round or two
		t.Fatalf("the call's stream still runs %v after renewals began to fail (patience %v); dropped: %d",
			time.Since(cutAt).Round(time.Millisecond), patience, h.Counts()["dropped"])
	}
	// The sessions whose renewals began to fail a round later go a
	// round later; then three rounds with nothing to renew.
	time.Sleep(time.Second)
	if n := h.Counts()["dropped"]; n != 5 {
		t.Errorf("sessions let go: %d, want 5", n)
	}
	// The outage is one warning, not one per session and round (5
	// sessions, 4 rounds or more); and with every session let go, no
	// round says renewals succeed again while the store is still out of
	// reach.
	if n := strings.Count(logs.String(), "renewing session leases failed"); n != 1 {
		t.Errorf("%d warnings about failing renewals, want 1:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "succeed again") {
		t.Errorf("renewals said to succeed again while the store was out of reach:\n%s", logs.String())
	}

	cut.Store(false)
	resp := postMCP(t, srv.URL, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"stream_progress","arguments":{"count":1,"interval_ms":0},"_meta":{"progressToken":"q"}}}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"result"`) {
		t.Errorf("the session once the store is back: %s %s", resp.Status, body)
	}
	if n := h.Counts()["restore"]; n != 1 {
		t.Errorf("sessions restored: %d, want 1", n)
	}
	// The restored session's lease is renewed by the next round: the
	// recovery is said then, not at the next warning's time.
	time.Sleep(time.Second)
	if !strings.Contains(logs.String(), "succeed again") {
		t.Errorf("renewals work again, but the log does not say so:\n%s", logs.String())
	}
}

// syncBuffer is a bytes.Buffer for a logger written from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestIdleRenewalsAreHeartbeats: a replica keeping 50 idle sessions for 4 s
// (2 s leases, renewed every third of that: six rounds) runs a handful of
// scripts on Redis, its heartbeats, not a renewal per session and round
// (300 with per-session leases). The leases are long enough that a busy
// machine does not let the heartbeat lapse, which would re-stamp them all.
func TestIdleRenewalsAreHeartbeats(t *testing.T) {
	rds := redistest.Start(t)
	h, srv := replicaWith(t, rds, fmt.Sprintf("renew%d", time.Now().UnixNano()),
		func(c relay.Cluster) relay.Cluster { return c }, func(o *relay.Options) { o.LeaseTTL = 2 * time.Second })
	const sessions = 50
	for range sessions {
		initialize(t, srv.URL)
	}
	before := rds.ScriptCalls(t)
	time.Sleep(4 * time.Second)
	if n := rds.ScriptCalls(t) - before; n >= sessions {
		t.Errorf("%d idle sessions kept for 4 s ran %d scripts on Redis, want fewer than one per session", sessions, n)
	} else {
		t.Logf("%d scripts in 4 s", n)
	}
	if n := h.Counts()["dropped"]; n != 0 {
		t.Errorf("%d of %d sessions dropped", n, sessions)
	}
}
