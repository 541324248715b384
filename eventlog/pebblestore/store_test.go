package pebblestore_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
	"github.com/mcprelay/mcprelay/eventlog/storetest"
)

func TestConformance(t *testing.T) {
	for _, p := range []pebblestore.SyncPolicy{pebblestore.SyncAlways, pebblestore.SyncInterval, pebblestore.SyncNone} {
		t.Run(p.String(), func(t *testing.T) {
			storetest.RunWith(t, func(t *testing.T, r eventlog.Retention) eventlog.Store {
				st, err := pebblestore.Open(filepath.Join(t.TempDir(), "log"), pebblestore.Options{Retention: r, Sync: p})
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				return st
			}, storetest.Options{Synctest: true})
		})
	}
}

func TestParseSyncPolicy(t *testing.T) {
	cases := []struct {
		in      string
		want    pebblestore.SyncPolicy
		wantErr bool
	}{
		{"always", pebblestore.SyncAlways, false},
		{"interval", pebblestore.SyncInterval, false},
		{"none", pebblestore.SyncNone, false},
		{"", 0, true},
		{"Always", 0, true},
		{"sometimes", 0, true},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			got, err := pebblestore.ParseSyncPolicy(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("ParseSyncPolicy(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
			}
			if err == nil && got.String() != tc.in {
				t.Errorf("String() = %q, want %q", got.String(), tc.in)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	held, err := pebblestore.Open(filepath.Join(dir, "held.db"), pebblestore.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer held.Close()
	cases := []struct {
		name string
		path string
		opts pebblestore.Options
	}{
		{"unknown sync policy", filepath.Join(dir, "a.db"), pebblestore.Options{Sync: 7}},
		{"negative sync policy", filepath.Join(dir, "b.db"), pebblestore.Options{Sync: -1}},
		{"directory under a file", filepath.Join(dir, "file", "log"), pebblestore.Options{}},
		{"file held by another store", filepath.Join(dir, "held.db"), pebblestore.Options{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, err := pebblestore.Open(tc.path, tc.opts)
			if err == nil {
				st.Close()
				t.Fatalf("Open succeeded, want an error")
			}
		})
	}
}

// TestDirMode checks that a directory Open creates is private: the events
// are other tenants' messages.
func TestDirMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	st, err := pebblestore.Open(path, pebblestore.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer st.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o700 {
		t.Errorf("directory mode %v, want 0700", mode)
	}
}

func TestClose(t *testing.T) {
	ctx := t.Context()
	st, err := pebblestore.Open(filepath.Join(t.TempDir(), "log"), pebblestore.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := st.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := st.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	cases := []struct {
		name string
		op   func() error
	}{
		{"CreateSession", func() error { return st.CreateSession(ctx, &eventlog.Session{ID: "t"}) }},
		{"Session", func() error { _, err := st.Session(ctx, "s"); return err }},
		{"UpdateSession", func() error { return st.UpdateSession(ctx, &eventlog.Session{ID: "s"}) }},
		{"DeleteSession", func() error { return st.DeleteSession(ctx, "s") }},
		{"CreateStream", func() error { return st.CreateStream(ctx, &eventlog.Stream{Key: "k", Session: "s"}) }},
		{"Append", func() error { _, err := st.Append(ctx, "k", false, eventlog.Event{}); return err }},
		{"Read", func() error { _, _, err := st.Read(ctx, "k", 0, 1, nil); return err }},
		{"Streams", func() error { _, err := st.Streams(ctx, "s"); return err }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.op(); !errors.Is(err, pebblestore.ErrClosed) {
				t.Errorf("%s after Close: %v, want ErrClosed", tc.name, err)
			}
		})
	}
}

// TestCloseFlushesPending races appenders against Close: every Append that
// reported success must be readable after reopening, and every other one
// must have failed with ErrClosed.
func TestCloseFlushesPending(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "log")
	st, err := pebblestore.Open(path, pebblestore.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	const writers = 16
	for i := range writers {
		id := fmt.Sprint("s", i)
		if err := st.CreateSession(ctx, &eventlog.Session{ID: id, Incarnation: 1}); err != nil {
			t.Fatal(err)
		}
		if err := st.CreateStream(ctx, &eventlog.Stream{Key: id, Session: id, Generation: 1}); err != nil {
			t.Fatal(err)
		}
	}
	acked := make([]uint64, writers)
	started := make(chan struct{}, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			key := fmt.Sprint("s", i)
			for n := 0; ; n++ {
				if n == 1 {
					started <- struct{}{}
				}
				last, err := st.Append(ctx, key, false, eventlog.Event{Data: fmt.Appendf(nil, "%s#%d", key, acked[i]+1)})
				if errors.Is(err, pebblestore.ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Append(%s): %v", key, err)
					return
				}
				acked[i] = last
			}
		})
	}
	for range writers {
		<-started
	}
	if err := st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wg.Wait()
	st, err = pebblestore.Open(path, pebblestore.Options{})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer st.Close()
	for i := range writers {
		key := fmt.Sprint("s", i)
		rec, evs, err := st.Read(ctx, key, 0, 1<<20, nil)
		if err != nil {
			t.Fatalf("Read(%s): %v", key, err)
		}
		if acked[i] == 0 || rec.LastSeq != acked[i] || len(evs) != int(acked[i]) {
			t.Errorf("stream %s: LastSeq %d with %d events after reopen, acknowledged %d", key, rec.LastSeq, len(evs), acked[i])
		}
	}
}

// snapshot is everything a store returns for some sessions.
type snapshot struct {
	Sessions map[string]*eventlog.Session
	Streams  map[string][]eventlog.Stream
	Events   map[string][]eventlog.Event
	Missing  []string
}

func takeSnapshot(t *testing.T, st eventlog.Store, ids []string) snapshot {
	t.Helper()
	snap := snapshot{Sessions: map[string]*eventlog.Session{}, Streams: map[string][]eventlog.Stream{}, Events: map[string][]eventlog.Event{}}
	for _, id := range ids {
		s, err := st.Session(t.Context(), id)
		if errors.Is(err, eventlog.ErrNotFound) {
			snap.Missing = append(snap.Missing, id)
			continue
		}
		if err != nil {
			t.Fatalf("Session(%q): %v", id, err)
		}
		snap.Sessions[id] = s
		list, err := st.Streams(t.Context(), id)
		if err != nil {
			t.Fatalf("Streams(%q): %v", id, err)
		}
		slices.SortFunc(list, func(a, b eventlog.Stream) int { return strings.Compare(a.Key, b.Key) })
		snap.Streams[id] = list
		for _, rec := range list {
			got, evs, err := st.Read(t.Context(), rec.Key, 0, 1<<20, nil)
			if err != nil {
				t.Fatalf("Read(%q): %v", rec.Key, err)
			}
			if !reflect.DeepEqual(got, rec) {
				t.Fatalf("Read(%q) record %+v, Streams said %+v", rec.Key, got, rec)
			}
			snap.Events[rec.Key] = evs
		}
	}
	return snap
}

func mustAppend(t *testing.T, st eventlog.Store, key string, terminal bool, data ...string) uint64 {
	t.Helper()
	evs := make([]eventlog.Event, len(data))
	for i, d := range data {
		evs[i].Data = []byte(d)
		if strings.HasPrefix(d, "reset:") {
			evs[i].Type = "reset"
		}
	}
	last, err := st.Append(t.Context(), key, terminal, evs...)
	if err != nil {
		t.Fatalf("Append(%q): %v", key, err)
	}
	return last
}

// testSession has every field set, with whitespace in JSON and nil and
// empty Replay entries that must come back as they went in.
func testSession(id string) *eventlog.Session {
	return &eventlog.Session{
		ID: id, Principal: "p-" + id, ProtocolVersion: "2025-11-25", Incarnation: 3, Upstream: "u",
		InitializeParams: json.RawMessage(`{ "spaced" : true }`),
		Replay:           []json.RawMessage{json.RawMessage(`{"method":"logging/setLevel"}`), nil, {}},
		Created:          time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("X", 3600)),
	}
}

func mustCreate(t *testing.T, st eventlog.Store, sessions map[string][]string) {
	t.Helper()
	for id, keys := range sessions {
		if err := st.CreateSession(t.Context(), testSession(id)); err != nil {
			t.Fatalf("CreateSession(%q): %v", id, err)
		}
		for i, k := range keys {
			var reqID []byte
			if i > 0 {
				reqID = fmt.Appendf(nil, "%d", i)
			}
			if err := st.CreateStream(t.Context(), &eventlog.Stream{Key: k, Session: id, Generation: uint64(i + 1), RequestID: reqID}); err != nil {
				t.Fatalf("CreateStream(%q): %v", k, err)
			}
		}
	}
}

// checkRange reads key and checks its record's FirstSeq..LastSeq and Terminal.
func checkRange(t *testing.T, st eventlog.Store, key string, first, last uint64, terminal bool) {
	t.Helper()
	rec, evs, err := st.Read(t.Context(), key, 0, 1<<20, nil)
	if err != nil {
		t.Fatalf("Read(%q): %v", key, err)
	}
	if rec.FirstSeq != first || rec.LastSeq != last || rec.Terminal != terminal || len(evs) != int(last+1-first) {
		t.Fatalf("stream %q: [%d,%d] terminal=%v with %d events, want [%d,%d] terminal=%v",
			key, rec.FirstSeq, rec.LastSeq, rec.Terminal, len(evs), first, last, terminal)
	}
}

func TestReopen(t *testing.T) {
	cases := []struct {
		name  string
		ret   eventlog.Retention
		ids   []string
		build func(t *testing.T, st eventlog.Store)
		after func(t *testing.T, st eventlog.Store) // runs on the reopened store
	}{
		{
			name: "records and events read back identically",
			ret:  eventlog.Retention{MaxEvents: 5},
			ids:  []string{"A", "B", "C", "gone"},
			build: func(t *testing.T, st eventlog.Store) {
				mustCreate(t, st, map[string][]string{"A": {"a-get", "a-post", "a-done"}, "B": {"b-get"}, "C": nil, "gone": {"g"}})
				mustAppend(t, st, "a-get", false, "1", "2", "reset:3")
				mustAppend(t, st, "a-post", false, "1", "", "3")
				mustAppend(t, st, "a-done", true, "1")
				mustAppend(t, st, "b-get", false, string(make([]byte, 70000)), "\x00\xff\n")
				mustAppend(t, st, "g", false, "x")
				if err := st.DeleteSession(t.Context(), "gone"); err != nil {
					t.Fatal(err)
				}
				upd, _ := st.Session(t.Context(), "B")
				upd.Incarnation, upd.Replay = 9, nil
				if err := st.UpdateSession(t.Context(), upd); err != nil {
					t.Fatal(err)
				}
			},
			after: func(t *testing.T, st eventlog.Store) {
				got, err := st.Session(t.Context(), "A")
				if err != nil {
					t.Fatal(err)
				}
				want := testSession("A")
				if !got.Created.Equal(want.Created) {
					t.Errorf("Created %v, want %v", got.Created, want.Created)
				}
				got.Created = want.Created
				if !reflect.DeepEqual(got, want) {
					t.Errorf("session after reopen %+v, want %+v", got, want)
				}
				checkRange(t, st, "a-get", 3, 3, false) // two evicted by a-post and a-done
				checkRange(t, st, "a-done", 1, 1, true)
				if _, _, err := st.Read(t.Context(), "g", 0, 1, nil); !errors.Is(err, eventlog.ErrNotFound) {
					t.Errorf("stream of deleted session after reopen: %v, want ErrNotFound", err)
				}
			},
		},
		{
			name: "eviction order across streams continues",
			ret:  eventlog.Retention{MaxEvents: 4},
			ids:  []string{"A"},
			build: func(t *testing.T, st eventlog.Store) {
				mustCreate(t, st, map[string][]string{"A": {"x", "y"}})
				mustAppend(t, st, "x", false, "x1")
				mustAppend(t, st, "y", false, "y1")
				mustAppend(t, st, "x", false, "x2")
				mustAppend(t, st, "y", false, "y2")
			},
			after: func(t *testing.T, st eventlog.Store) {
				mustAppend(t, st, "x", false, "x3") // evicts x1
				checkRange(t, st, "x", 2, 3, false)
				checkRange(t, st, "y", 1, 2, false)
				mustAppend(t, st, "x", false, "x4") // evicts y1
				checkRange(t, st, "y", 2, 2, false)
				mustAppend(t, st, "y", false, "y3", "y4") // evicts x2, y2
				checkRange(t, st, "x", 3, 4, false)
				checkRange(t, st, "y", 3, 4, false)
			},
		},
		{
			name: "byte budget continues",
			ret:  eventlog.Retention{MaxBytes: 1000},
			ids:  []string{"A"},
			build: func(t *testing.T, st eventlog.Store) {
				mustCreate(t, st, map[string][]string{"A": {"a"}})
				for range 9 {
					mustAppend(t, st, "a", false, strings.Repeat("b", 100))
				}
			},
			after: func(t *testing.T, st eventlog.Store) {
				mustAppend(t, st, "a", false, strings.Repeat("b", 100))
				checkRange(t, st, "a", 1, 10, false)
				mustAppend(t, st, "a", false, strings.Repeat("b", 150))
				checkRange(t, st, "a", 3, 11, false)
			},
		},
		{
			name: "seqs continue and terminal stays terminal",
			ids:  []string{"A"},
			build: func(t *testing.T, st eventlog.Store) {
				mustCreate(t, st, map[string][]string{"A": {"open", "done"}})
				mustAppend(t, st, "open", false, "1", "2")
				mustAppend(t, st, "done", true, "1")
			},
			after: func(t *testing.T, st eventlog.Store) {
				if last := mustAppend(t, st, "open", false, "3"); last != 3 {
					t.Errorf("Append after reopen returned LastSeq %d, want 3", last)
				}
				if _, err := st.Append(t.Context(), "done", false, eventlog.Event{}); !errors.Is(err, eventlog.ErrTerminal) {
					t.Errorf("Append to terminal stream after reopen: %v, want ErrTerminal", err)
				}
				if err := st.CreateStream(t.Context(), &eventlog.Stream{Key: "done", Session: "A"}); !errors.Is(err, eventlog.ErrExists) {
					t.Errorf("CreateStream of kept terminal key after reopen: %v, want ErrExists", err)
				}
				mustCreate(t, st, map[string][]string{"B": {"new"}})
				mustAppend(t, st, "new", false, "n1")
				checkRange(t, st, "new", 1, 1, false)
				checkRange(t, st, "open", 1, 3, false)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			opts := pebblestore.Options{Retention: tc.ret}
			st, err := pebblestore.Open(path, opts)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			tc.build(t, st)
			before := takeSnapshot(t, st, tc.ids)
			if err := st.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			st, err = pebblestore.Open(path, opts)
			if err != nil {
				t.Fatalf("reopen: %v", err)
			}
			defer st.Close()
			if after := takeSnapshot(t, st, tc.ids); !reflect.DeepEqual(before, after) {
				t.Fatalf("after reopen:\n%+v\nbefore:\n%+v", after, before)
			}
			tc.after(t, st)
		})
	}
}

// TestOneStreamManyAppenders breaks the relay's one-appender-per-stream
// rule on purpose: seqs must stay consecutive and each appender's events
// must keep their order, for every sync policy.
func TestOneStreamManyAppenders(t *testing.T) {
	const appenders, each = 8, 50
	for _, p := range []pebblestore.SyncPolicy{pebblestore.SyncAlways, pebblestore.SyncInterval, pebblestore.SyncNone} {
		t.Run(p.String(), func(t *testing.T) {
			st, err := pebblestore.Open(filepath.Join(t.TempDir(), "log"), pebblestore.Options{Sync: p})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			mustCreate(t, st, map[string][]string{"A": {"k"}})
			var wg sync.WaitGroup
			for g := range appenders {
				wg.Go(func() {
					for i := range each {
						if _, err := st.Append(t.Context(), "k", false,
							eventlog.Event{Data: fmt.Appendf(nil, "%d:%d:a", g, i)},
							eventlog.Event{Data: fmt.Appendf(nil, "%d:%d:b", g, i)}); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			rec, evs, err := st.Read(t.Context(), "k", 0, 1<<20, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rec.LastSeq != 2*appenders*each || len(evs) != 2*appenders*each {
				t.Fatalf("LastSeq %d with %d events, want %d", rec.LastSeq, len(evs), 2*appenders*each)
			}
			next := make([]int, appenders)
			for i := 0; i < len(evs); i += 2 {
				var g, n int
				if _, err := fmt.Sscanf(string(evs[i].Data), "%d:%d:a", &g, &n); err != nil || n != next[g] {
					t.Fatalf("event %d = %q (%v), want appender %d's #%d", evs[i].Seq, evs[i].Data, err, g, next[g])
				}
				if want := fmt.Sprintf("%d:%d:b", g, n); string(evs[i+1].Data) != want || evs[i+1].Seq != evs[i].Seq+1 || evs[i].Seq != uint64(i+1) {
					t.Fatalf("events %d,%d = %q,%q; batch split or seqs not consecutive", evs[i].Seq, evs[i+1].Seq, evs[i].Data, evs[i+1].Data)
				}
				next[g]++
			}
		})
	}
}

// dirState lists every file under dir with its size and modification
// time, but for Pebble's LOCK (which taking the lock truncates).
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "LOCK" {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		m[p] = fmt.Sprint(fi.Size(), fi.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestReadOnly: a store opened read-only lists and reads what a crashed
// writer left (its log replayed in memory), refuses writes with
// ErrReadOnly, and leaves the directory as it was; it cannot be opened
// while a writer holds the directory, nor where no store is.
func TestReadOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	w, err := pebblestore.Open(dir, pebblestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := w.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 2}); err != nil {
		t.Fatal(err)
	}
	if err := w.CreateStream(ctx, &eventlog.Stream{Key: "k", Session: "s", Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, "k", false, eventlog.Event{Data: []byte("hello")}, eventlog.Event{Data: []byte("world!")}); err != nil {
		t.Fatal(err)
	}
	if _, err := pebblestore.Open(dir, pebblestore.Options{ReadOnly: true}); err == nil {
		t.Fatal("opened read-only while a writer holds the directory")
	}
	// A writer that never closes: what it wrote is in its WAL only.
	crashed := filepath.Join(t.TempDir(), "crashed")
	if err := os.CopyFS(crashed, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	before := dirState(t, crashed)

	r, err := pebblestore.Open(crashed, pebblestore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	list, err := r.ListSessions(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "s" || list[0].Incarnation != 2 || list[0].Streams != 1 || list[0].Events != 2 || list[0].Bytes != 11 {
		t.Fatalf("ListSessions = %+v, %v", list, err)
	}
	if _, evs, err := r.Read(ctx, "k", 0, 10, nil); err != nil || len(evs) != 2 || string(evs[1].Data) != "world!" {
		t.Fatalf("Read = %v, %v", evs, err)
	}
	if err := r.CreateSession(ctx, &eventlog.Session{ID: "t", Incarnation: 1}); !errors.Is(err, pebblestore.ErrReadOnly) {
		t.Errorf("CreateSession: %v, want ErrReadOnly", err)
	}
	if _, err := r.Append(ctx, "k", false, eventlog.Event{Data: []byte("x")}); !errors.Is(err, pebblestore.ErrReadOnly) {
		t.Errorf("Append: %v, want ErrReadOnly", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if after := dirState(t, crashed); !maps.Equal(before, after) {
		t.Errorf("the directory changed:\nbefore %v\nafter  %v", before, after)
	}
	if _, err := pebblestore.Open(filepath.Join(t.TempDir(), "none"), pebblestore.Options{ReadOnly: true}); err == nil {
		t.Error("opened read-only where no store is")
	}
}

// TestSize: the disk usage Size reports follows what is written (32 MiB,
// more than the 8 MiB memtable and the preallocated WAL).
func TestSize(t *testing.T) {
	st, err := pebblestore.Open(filepath.Join(t.TempDir(), "log"), pebblestore.Options{Sync: pebblestore.SyncNone})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	storetest.SizeGrows(t, st, 32<<20)
}
