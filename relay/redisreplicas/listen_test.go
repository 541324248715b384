package redisreplicas_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
	"github.com/mcprelay/mcprelay/relay"
)

// TestListenerOnOtherReplicaKeepsSession: a client that only listens (a
// GET open, no request) on a replica that does not own its session keeps
// the session alive, as a GET open on the owner does: the reading replica
// records the uses in the store, and the owner reads them before expiring
// the session. Regression: the owner saw no request for the idle timeout
// and ended the session under the listening client (404 afterwards).
func TestListenerOnOtherReplicaKeepsSession(t *testing.T) {
	rds := redistest.Start(t)
	prefix := fmt.Sprintf("listen%d", time.Now().UnixNano())
	const timeout = 2 * time.Second
	short := func(o *relay.Options) { o.SessionIdleTimeout = timeout }
	same := func(c relay.Cluster) relay.Cluster { return c }
	_, srvA := replicaWith(t, rds, prefix, same, short)
	_, srvB := replicaWith(t, rds, prefix, same, short)
	sid := initialize(t, srvA.URL)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp := doMCP(t, ctx, "GET", srvB.URL, map[string]string{"Mcp-Session-Id": sid}, "")
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET on the other replica: %s", resp.Status)
	}
	time.Sleep(3 * timeout)
	r := postMCP(t, srvA.URL, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	r.Body.Close()
	if r.StatusCode != 200 {
		t.Fatalf("the session with a client listening on the other replica, after %v: %s", 3*timeout, r.Status)
	}
	// Once nobody listens or asks, it expires as any session does.
	cancel()
	resp.Body.Close()
	time.Sleep(timeout + timeout/8 + 2*timeout) // its last use, the lag of the record, the owner's checks
	r = postMCP(t, srvA.URL, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	r.Body.Close()
	if r.StatusCode != http.StatusNotFound {
		t.Fatalf("the session %v after its listener left: %s, want 404 (expired)", 3*timeout+timeout/8, r.Status)
	}
}
