package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
)

// retry runs op until it succeeds or 10s pass: the client reconnects
// after a Redis restart on its own, in its own time.
func retry(t *testing.T, what string, op func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := op()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func appendData(t *testing.T, st *redisstore.Store, key string, data ...string) uint64 {
	t.Helper()
	var last uint64
	for _, d := range data {
		l, err := st.Append(t.Context(), key, false, eventlog.Event{Data: []byte(d)})
		if err != nil {
			t.Fatalf("Append(%q): %v", d, err)
		}
		last = l
	}
	return last
}

// TestRestartWithAOF: with the append-only file fsynced before each reply
// (appendfsync always) a killed and restarted Redis has every acknowledged
// append, and the same Store carries on where it was. (With everysec, a
// killed Redis can lose acknowledged appends too: it may postpone the
// write while a background fsync runs.)
func TestRestartWithAOF(t *testing.T) {
	srv := redistest.StartWith(t, redistest.Options{AppendOnly: true, AppendFsync: "always"})
	st := open(t, srv, redisstore.Options{})
	mustCreate(t, st, "s1", "k")
	appendData(t, st, "k", "1", "2", "3", "4", "5")
	srv.Restart(t)
	var rec eventlog.Stream
	var evs []eventlog.Event
	retry(t, "Read after restart", func() (err error) {
		rec, evs, err = st.Read(t.Context(), "k", 0, 10, nil)
		return err
	})
	if rec.FirstSeq != 1 || rec.LastSeq != 5 || len(evs) != 5 || string(evs[4].Data) != "5" {
		t.Fatalf("after restart: record %+v, %d events; want seqs 1..5", rec, len(evs))
	}
	if last := appendData(t, st, "k", "6"); last != 6 {
		t.Errorf("Append after restart = %d, want 6", last)
	}
}

// TestRestartLostTailSkips: when Redis comes back without its last
// acknowledged appends (here: its append-only file is rolled back to an
// earlier copy), a Store that saw the lost seqs never hands them out
// again: the stream skips past them and readers behind see a hole.
func TestRestartLostTailSkips(t *testing.T) {
	srv := redistest.StartWith(t, redistest.Options{AppendOnly: true, AppendFsync: "always"})
	st := open(t, srv, redisstore.Options{Retention: eventlog.Retention{MaxEvents: 10}})
	mustCreate(t, st, "s1", "k")
	appendData(t, st, "k", "1", "2", "3")
	aof := filepath.Join(srv.Dir(), "appendonlydir")
	saved := filepath.Join(t.TempDir(), "aof")
	if out, err := exec.Command("cp", "-a", aof, saved).CombinedOutput(); err != nil {
		t.Fatalf("saving the AOF: %v %s", err, out)
	}
	appendData(t, st, "k", "4", "5") // acknowledged, then lost
	srv.Kill()
	if err := os.RemoveAll(aof); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", saved, aof).CombinedOutput(); err != nil {
		t.Fatalf("restoring the AOF: %v %s", err, out)
	}
	srv.Restart(t)
	var rec eventlog.Stream
	retry(t, "Read after restart", func() (err error) {
		rec, _, err = st.Read(t.Context(), "k", 0, 10, nil)
		return err
	})
	if rec.LastSeq != 3 {
		t.Fatalf("after the rollback LastSeq = %d, want 3 (the test did not lose the tail)", rec.LastSeq)
	}
	ev := eventlog.Event{Data: []byte("new")}
	last, err := st.Append(t.Context(), "k", false, ev)
	if err != nil || last != 6 {
		t.Fatalf("Append after losing seqs 4 and 5 = %d, %v; want 6 (seqs a client may hold are never reused)", last, err)
	}
	rec, evs, err := st.Read(t.Context(), "k", 3, 10, nil)
	if err != nil || rec.FirstSeq != 6 || rec.LastSeq != 6 || len(evs) != 1 || evs[0].Seq != 6 || !bytes.Equal(evs[0].Data, ev.Data) {
		t.Fatalf("Read after 3 = %+v, %v, %v; want FirstSeq 6 (a hole for readers behind) and event 6", rec, evs, err)
	}
	// The skipped events no longer count against the session's budget,
	// and retention still works across the skip.
	for i := range 20 {
		if _, err := st.Append(t.Context(), "k", false, eventlog.Event{Data: []byte{byte('a' + i)}}); err != nil {
			t.Fatalf("Append: %v", err)
		}
	}
	rec, evs, err = st.Read(t.Context(), "k", 0, 100, nil)
	if err != nil || rec.FirstSeq != 17 || rec.LastSeq != 26 || len(evs) != 10 {
		t.Fatalf("Read after more appends = %+v, %d events, %v; want the last 10: seqs 17..26", rec, len(evs), err)
	}
	if err := st.CreateStream(t.Context(), &eventlog.Stream{Key: "k2", Session: "s1", Generation: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 15 {
		if _, err := st.Append(t.Context(), "k2", false, eventlog.Event{Data: []byte{byte('a' + i)}}); err != nil {
			t.Fatalf("Append: %v", err)
		}
	}
	rec, _, err = st.Read(t.Context(), "k", 0, 100, nil)
	rec2, _, err2 := st.Read(t.Context(), "k2", 0, 100, nil)
	if err != nil || err2 != nil || rec.FirstSeq != 27 || rec.LastSeq != 26 || rec2.FirstSeq != 6 || rec2.LastSeq != 15 {
		t.Fatalf("after 15 appends to another stream: k %+v (%v), k2 %+v (%v); want k empty at 26, k2 seqs 6..15",
			rec, err, rec2, err2)
	}
}

// TestRestartWithoutPersistence: without persistence a restart loses
// everything, including the relay secret, which is created anew: event
// IDs minted before no longer verify.
func TestRestartWithoutPersistence(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv, redisstore.Options{})
	secret, err := st.LoadOrCreateSecret(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, st, "s1", "k")
	appendData(t, st, "k", "1")
	srv.Restart(t)
	var after []byte
	retry(t, "LoadOrCreateSecret after restart", func() (err error) {
		after, err = st.LoadOrCreateSecret(t.Context())
		return err
	})
	if bytes.Equal(after, secret) {
		t.Errorf("the secret survived a restart without persistence")
	}
	if _, _, err := st.Read(t.Context(), "k", 0, 10, nil); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("Read after losing everything: %v, want ErrNotFound", err)
	}
}

// TestDownIsUnavailable: while Redis is down, writes fail with an error
// wrapping eventlog.ErrUnavailable (the relay answers 503 and retries),
// not a bare network error (which it would take for a failed store: 500).
func TestDownIsUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv, redisstore.Options{})
	mustCreate(t, st, "s1", "k")
	srv.Kill()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for name, err := range map[string]error{
		"CreateStream": st.CreateStream(ctx, &eventlog.Stream{Key: "k2", Session: "s1", Generation: 1}),
		"Append": func() error {
			_, err := st.Append(ctx, "k", false, eventlog.Event{Data: []byte("x")})
			return err
		}(),
		"CreateSession": st.CreateSession(ctx, &eventlog.Session{ID: "s2"}),
	} {
		if !errors.Is(err, eventlog.ErrUnavailable) {
			t.Errorf("%s with Redis down: %v, want an error wrapping eventlog.ErrUnavailable", name, err)
		}
	}
}
