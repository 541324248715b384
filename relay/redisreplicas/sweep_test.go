package redisreplicas_test

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
	"github.com/mcprelay/mcprelay/relay"
)

// TestSweepSparesLeasedSessions: replicas on one Redis. Sessions whose
// replica went away and that nobody uses are removed from Redis by
// another replica once idle past its timeout; a session another replica
// leases (serves) is not, however old its record's last use. (The
// replicas' timeouts differ here so that the serving one does not expire
// its session itself first.)
func TestSweepSparesLeasedSessions(t *testing.T) {
	rds := redistest.Start(t)
	prefix := fmt.Sprintf("sweep%d", time.Now().UnixNano())
	long := func(o *relay.Options) { o.SessionIdleTimeout = time.Hour }
	var st *redisstore.Store
	keep := func(o *relay.Options) { st = o.Store.(*redisstore.Store); long(o) }

	gone, goneSrv := replicaWith(t, rds, prefix, func(c relay.Cluster) relay.Cluster { return c }, long)
	var abandoned []string
	for range 3 {
		abandoned = append(abandoned, initialize(t, goneSrv.URL))
	}
	gone.Close() // its leases are released: nobody serves these sessions now

	_, servingSrv := replicaWith(t, rds, prefix, func(c relay.Cluster) relay.Cluster { return c }, keep)
	served := initialize(t, servingSrv.URL)

	const timeout = 500 * time.Millisecond
	sweeper, _ := replicaWith(t, rds, prefix, func(c relay.Cluster) relay.Cluster { return c }, func(o *relay.Options) { o.SessionIdleTimeout = timeout })

	exists := func(id string) bool {
		t.Helper()
		_, err := st.Session(t.Context(), id)
		if err != nil && !errors.Is(err, eventlog.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for left := len(abandoned); left > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d abandoned sessions still in Redis 10 s on", left, len(abandoned))
		}
		time.Sleep(100 * time.Millisecond)
		left = 0
		for _, id := range abandoned {
			if exists(id) {
				left++
			}
		}
	}
	time.Sleep(2 * timeout) // more sweeps with the served session idle by its record
	if !exists(served) {
		t.Fatal("the session another replica leases was swept")
	}
	if n := sweeper.Counts()["swept"]; n != int64(len(abandoned)) {
		t.Errorf("swept counter %d, want %d", n, len(abandoned))
	}
	resp := postMCP(t, servingSrv.URL, served, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("the served session after the sweeps: %s", resp.Status)
	}
	ids, err := st.IdleSessions(t.Context(), time.Now(), 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != served {
		t.Errorf("Redis's index of last uses lists %q, want only the served session", ids)
	}
}
