package relay_test

import (
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/sse"
)

// TestAbandonedSessionsAreSwept: sessions left in the disk store by a
// relay that stopped without ending them (a kill -9, a restart) and whose
// clients never come back are removed from the store once idle past the
// timeout, with their streams; sessions the new relay serves are not, even
// with no request for longer than the timeout (a stream open). Regression:
// nothing removed them (a request naming them did, and none came), so the
// store grew restart after restart.
func TestAbandonedSessionsAreSwept(t *testing.T) {
	store, err := pebblestore.Open(filepath.Join(t.TempDir(), "log"), pebblestore.Options{Sync: pebblestore.SyncNone})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	const timeout = 600 * time.Millisecond
	idle := time.Hour // the first relay's: it stops before anything expires
	start := func() *relay.Handler {
		h, err := relay.New(relay.Options{Backend: backend.SDK(testServer(nil), nil), Store: store, Secret: testSecret, SessionIdleTimeout: idle})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	rr := serveRestartable(t, start)
	e := &env{t: t, client: http.DefaultClient, url: rr.url}

	var abandoned []string
	for range 3 {
		s := e.initialize("2025-11-25", "")
		_, resp := s.call(2, 0, false)
		events(t, resp, 0, 5*time.Second)
		abandoned = append(abandoned, s.id)
	}
	used := e.initialize("2025-11-25", "")
	busy := e.initialize("2025-11-25", "")

	idle = timeout
	rr.restart() // the old relay stops without ending its sessions

	// One session is used again, and the other has a call under way for
	// longer than the timeout, with no other request: the new relay
	// serves both.
	if _, resp := used.call(1, 0, false); resp.StatusCode != 200 {
		t.Fatalf("call after the restart: %s", resp.Status)
	}
	_, long := busy.call(40, 75, true) // 3 s, five timeouts
	callDone := make(chan []sse.Event)
	go func() {
		evs, ended := events(t, long, 0, 10*time.Second)
		if !ended {
			t.Errorf("the long call did not end")
		}
		callDone <- evs
	}()

	stored := func() []string {
		t.Helper()
		list, err := store.ListSessions(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range list {
			ids = append(ids, s.ID)
		}
		slices.Sort(ids)
		return ids
	}
	// The used session is used every quarter timeout; the abandoned ones
	// go within a few sweeps, the served ones stay through more.
	swept := time.Time{}
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		if _, resp := used.call(1, 0, false); resp.StatusCode != 200 {
			t.Fatalf("call: %s", resp.Status)
		} else {
			events(t, resp, 0, 5*time.Second)
		}
		if swept.IsZero() && len(stored()) == 2 {
			swept = time.Now()
			end = swept.Add(2 * timeout)
		}
		time.Sleep(timeout / 4)
	}
	want := []string{used.id, busy.id}
	slices.Sort(want)
	if got := stored(); !slices.Equal(got, want) {
		t.Fatalf("the store holds sessions %q 5 s after the restart, want only the two served (%q); abandoned: %q", got, want, abandoned)
	}
	for _, id := range abandoned {
		if streams, err := store.Streams(t.Context(), id); err != nil || len(streams) != 0 {
			t.Errorf("swept session %s still has %d streams (%v)", id, len(streams), err)
		}
	}
	if n := rr.current().Counts()["swept"]; n != int64(len(abandoned)) {
		t.Errorf("swept counter %d, want %d", n, len(abandoned))
	}
	// The long call ends with its result, and both sessions still work.
	if evs := dataEvents(<-callDone); len(evs) == 0 || mcptest.Decode(t, evs[len(evs)-1].Data).Result == nil {
		t.Errorf("the long call did not end with its result: %d events", len(evs))
	}
	if _, resp := busy.call(1, 0, false); resp.StatusCode != 200 {
		t.Errorf("call on the busy session: %s", resp.Status)
	}
	if r := (&rawSession{e: e, id: abandoned[0], version: "2025-11-25"}).post(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`); r.StatusCode != http.StatusNotFound {
		t.Errorf("a request for a swept session: %s, want 404", r.Status)
	}
}
