package redisreplicas_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/sse"
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
	resp := openGET(t, ctx, srvB.URL, sid)
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

// TestListeningFollowsTheSession: with replicas, a session's backend GET
// stream opens with its client's first GET, whichever replica serves that
// GET, and a replica that takes the session over listens at once, without
// a new GET of the client's (the record says the session listens).
// Regressions: every session listened from initialize on (a backend GET
// per idle session); and a lazy rule without the record would leave the
// new owner deaf while the client's GET stays open on another replica.
func TestListeningFollowsTheSession(t *testing.T) {
	rds := redistest.Start(t)
	prefix := fmt.Sprintf("follow%d", time.Now().UnixNano())
	srv := exampleserver.New(nil)
	var getsA, getsB atomic.Int32
	counting := func(gets *atomic.Int32) func(*relay.Options) {
		sdk := backend.SDKHandler(srv, nil)
		return func(o *relay.Options) {
			o.Backend = backend.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet {
					gets.Add(1)
				}
				sdk.ServeHTTP(w, r)
			}))
		}
	}
	same := func(c relay.Cluster) relay.Cluster { return c }
	hA, srvA := replicaWith(t, rds, prefix, same, counting(&getsA))
	_, srvB := replicaWith(t, rds, prefix, same, counting(&getsB))
	waitGETs := func(gets *atomic.Int32, what string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); gets.Load() == 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: its backend saw no GET in 5s", what)
			}
		}
	}

	sid := initialize(t, srvA.URL)
	r := postMCP(t, srvA.URL, sid, `{"jsonrpc":"2.0","id":2,"method":"resources/subscribe","params":{"uri":"test://watched-resource"}}`)
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("subscribe: %s", r.Status)
	}
	time.Sleep(300 * time.Millisecond)
	if a, b := getsA.Load(), getsB.Load(); a+b != 0 {
		t.Fatalf("the backends saw %d and %d GETs before the client opened one, want none", a, b)
	}

	// The client listens on B, which does not own the session: the owner
	// opens the backend's GET, and a resource update reaches the client.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp := openGET(t, ctx, srvB.URL, sid)
	waitGETs(&getsA, "the owner A, after the client's GET on B")
	if n := getsB.Load(); n != 0 {
		t.Fatalf("B, which does not own the session, opened %d backend GETs", n)
	}
	got := make(chan error, 1)
	go func() {
		sc := sse.NewScanner(resp.Body)
		for {
			ev, err := sc.Next()
			if err != nil {
				got <- err
				return
			}
			if strings.Contains(string(ev.Data), "notifications/resources/updated") {
				got <- nil
				return
			}
		}
	}()
	if err := srv.ResourceUpdated(t.Context(), &mcp.ResourceUpdatedNotificationParams{URI: "test://watched-resource"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the GET on B ended before the resource update: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the resource update did not reach the client listening on B")
	}

	// A goes away; a request on B makes B the owner, whose new backend
	// session listens at once: the client's GET was not reopened.
	hA.Close()
	r = postMCP(t, srvB.URL, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("tools/list on B after A left: %s", r.Status)
	}
	waitGETs(&getsB, "B, the new owner")
}

// TestListenSignalToEarlierVersion: during a rolling upgrade the owner may
// be a replica of the version before the listen signal, which refuses its
// MAC (403) and listened to every session from initialize: the GET on the
// other replica is served, not refused until the owner is upgraded.
func TestListenSignalToEarlierVersion(t *testing.T) {
	rds := redistest.Start(t)
	prefix := fmt.Sprintf("upgrade%d", time.Now().UnixNano())
	same := func(c relay.Cluster) relay.Cluster { return c }
	_, srvA := replicaOn(t, rds, prefix, same)
	_, srvB := replicaOn(t, rds, prefix, same)
	relayA := srvA.Config.Handler
	srvA.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcprelay-Listen") != "" {
			http.Error(w, "Forbidden: relay: forwarded request with an invalid MAC", http.StatusForbidden)
			return
		}
		relayA.ServeHTTP(w, r)
	})
	sid := initialize(t, srvA.URL)
	resp := doMCP(t, t.Context(), "GET", srvB.URL, map[string]string{"Mcp-Session-Id": sid}, "")
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET on B for a session of an earlier-version owner: %s, want 200", resp.Status)
	}
}

// openGET opens the standalone GET stream of session sid on url, and fails
// the test unless it is answered 200; the body is closed at the test's end.
func openGET(t *testing.T, ctx context.Context, url, sid string) *http.Response {
	t.Helper()
	resp := doMCP(t, ctx, "GET", url, map[string]string{"Mcp-Session-Id": sid}, "")
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET on %s: %s", url, resp.Status)
	}
	return resp
}
