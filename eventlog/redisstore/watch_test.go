package redisstore_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
)

// awaitWake fails t unless wake fires within d.
func awaitWake(t *testing.T, wake <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-wake:
	case <-time.After(d):
		t.Fatalf("%s: no wake within %v", what, d)
	}
}

// awaitUp waits until st's watch is up (its subscriptions are acknowledged
// just after their wake) and returns its epoch.
func awaitUp(t *testing.T, st *redisstore.Store, what string) uint64 {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		e, up := st.WatchEpoch()
		if up {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("WatchEpoch %s: not up after 5 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// admin is a plain client for inspecting the server.
func admin(t *testing.T, srv *redistest.Server) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestWatchAcrossStores(t *testing.T) {
	srv := redistest.Start(t)
	a, b := pair(t, srv)
	mustCreate(t, b, "s1", "k")
	mustCreate(t, b, "s2", "other")
	wake, stop := a.Watch("k")
	defer stop()
	quiet, stopQuiet := a.Watch("other-unused")
	defer stopQuiet()
	awaitWake(t, wake, 5*time.Second, "subscription")
	awaitWake(t, quiet, 5*time.Second, "subscription of the second watcher")
	for i := range 3 {
		if _, err := b.Append(t.Context(), "k", false, eventlog.Event{Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		awaitWake(t, wake, 5*time.Second, fmt.Sprint("append ", i, " by the other store"))
	}
	if _, err := b.Append(t.Context(), "other", false, eventlog.Event{Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-quiet:
		t.Errorf("a watcher of another stream was woken")
	case <-time.After(200 * time.Millisecond):
	}
	if err := b.DeleteSession(t.Context(), "s1"); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, wake, 5*time.Second, "deletion of the session by the other store")
}

// TestWatchSharesOneConnection: 100 watchers of a store cost one pub/sub
// connection; stopped watchers are unsubscribed.
func TestWatchSharesOneConnection(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	clients := func() int {
		s, err := adm.Do(t.Context(), adm.B().ClientList().Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(s, "\n")
	}
	a, b := pair(t, srv)
	const n = 100
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		mustCreate(t, b, fmt.Sprint("s", i), keys[i])
	}
	before := clients()
	wakes := make([]<-chan struct{}, n)
	stops := make([]func(), n)
	for i, k := range keys {
		wakes[i], stops[i] = a.Watch(k)
		awaitWake(t, wakes[i], 5*time.Second, "subscription of "+k)
	}
	if got := clients() - before; got != 1 {
		t.Errorf("%d watchers opened %d connections, want 1", n, got)
	}
	for _, k := range keys {
		if _, err := b.Append(t.Context(), k, false, eventlog.Event{Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range wakes {
		awaitWake(t, wakes[i], 5*time.Second, "append to "+keys[i])
	}
	for _, stop := range stops {
		stop()
	}
	channels, err := adm.Do(t.Context(), adm.B().PubsubChannels().Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(channels) != 0 {
		t.Errorf("after every watcher stopped, still subscribed to %d channels (%q...)", len(channels), channels[0])
	}
}

// TestWatchResubscribesAfterRestart: after Redis restarts, watchers are
// woken once resubscribed (they may have missed appends) and then by new
// appends. WatchEpoch says the watch was up and steady before the restart,
// and is up again in another epoch after it, so an idle reader that
// compares epochs re-reads the log.
func TestWatchResubscribesAfterRestart(t *testing.T) {
	srv := redistest.StartWith(t, redistest.Options{AppendOnly: true, AppendFsync: "always"})
	a, b := pair(t, srv)
	mustCreate(t, b, "s1", "k")
	if _, up := a.WatchEpoch(); up {
		t.Errorf("WatchEpoch: up before any watch")
	}
	wake, stop := a.Watch("k")
	defer stop()
	awaitWake(t, wake, 5*time.Second, "subscription")
	before := awaitUp(t, a, "after the subscription")
	if _, err := b.Append(t.Context(), "k", false, eventlog.Event{Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, wake, 5*time.Second, "append before the restart")
	if e, up := a.WatchEpoch(); e != before || !up {
		t.Errorf("WatchEpoch changed without a break: %d %v, then %d %v", before, true, e, up)
	}
	srv.Restart(t)
	awaitWake(t, wake, 10*time.Second, "resubscription after the restart")
	if e := awaitUp(t, a, "after the restart"); e == before {
		t.Errorf("WatchEpoch after the restart and resubscription: %d, as before it", e)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := b.Append(t.Context(), "k", false, eventlog.Event{Data: []byte("x")})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Append after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	awaitWake(t, wake, 5*time.Second, "append after the restart")
}

// TestWatchAfterClose: Close ends the pub/sub connection; stopping a
// watcher after Close, and watching after Close, return at once, and the
// latter's channel never fires.
func TestWatchAfterClose(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	subscribers := func() int64 {
		v, err := adm.Do(t.Context(), adm.B().PubsubNumsub().Channel("wac:w:k").Build()).AsIntMap()
		if err != nil {
			t.Fatal(err)
		}
		return v["wac:w:k"]
	}
	st, err := redisstore.Open(t.Context(), redisstore.Options{URL: srv.URL(), Prefix: "wac"})
	if err != nil {
		t.Fatal(err)
	}
	wake, stop := st.Watch("k")
	awaitWake(t, wake, 5*time.Second, "subscription")
	if n := subscribers(); n != 1 {
		t.Fatalf("%d subscribers before Close, want 1", n)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var late <-chan struct{}
	go func() {
		defer close(done)
		stop()
		var stop2 func()
		late, stop2 = st.Watch("k")
		stop2()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("stop or Watch after Close did not return")
	}
	deadline := time.Now().Add(5 * time.Second)
	for subscribers() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("still subscribed after Close")
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-late:
		t.Error("a watcher made after Close was woken")
	case <-time.After(100 * time.Millisecond):
	}
}
