// Package storetest provides the conformance suite that every eventlog.Store
// implementation must pass, in the manner of testing/fstest.TestFS.
//
// A store package runs it from its tests with a constructor that returns a
// fresh, empty store configured with the given retention:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, r eventlog.Retention) eventlog.Store {
//			return eventlog.NewMemory(r)
//		})
//	}
//
// Run closes every store it opens when the subtest that opened it ends. Run
// the suite under -race: several subtests exercise concurrent appenders and
// readers. A store that keeps time with the time package alone runs the
// suite with RunWith and Options.Synctest, which times TerminalGrace exactly.
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
)

// openFunc returns a fresh, empty store configured with r (see Run).
type openFunc = func(t *testing.T, r eventlog.Retention) eventlog.Store

// Run runs the conformance suite against stores produced by open, which must
// return a fresh, empty store configured with the given retention. Subtests
// use t.Run with descriptive names.
func Run(t *testing.T, open func(t *testing.T, r eventlog.Retention) eventlog.Store) {
	t.Helper()
	RunWith(t, open, Options{})
}

// Options says how RunWith may drive a store.
type Options struct {
	// Synctest: the store reads the time from the time package only (no
	// server's clock) and leaves no goroutine running after Close, so the
	// subtests about TerminalGrace open it inside a testing/synctest
	// bubble and check the boundary to the nanosecond: a terminal stream
	// is kept at grace minus 1 ns and gone at grace. Otherwise they wait
	// on the real clock until a 1 ms grace has certainly passed and check
	// only that the stream is gone.
	Synctest bool
}

// RunWith is Run with options.
func RunWith(t *testing.T, open func(t *testing.T, r eventlog.Retention) eventlog.Store, opts Options) {
	t.Helper()
	s := suite{open: open, opts: opts}
	t.Run("Sessions", func(t *testing.T) {
		t.Run("RoundTrip", s.sessionRoundTrip)
		t.Run("Errors", s.sessionErrors)
		t.Run("Update", s.sessionUpdate)
		t.Run("CopiesInAndOut", s.sessionCopies)
		t.Run("DeleteThenRecreate", s.sessionRecreate)
		t.Run("List", s.sessionList)
		t.Run("Idle", s.sessionIdle)
		t.Run("Touch", s.sessionTouch)
	})
	t.Run("Streams", func(t *testing.T) {
		t.Run("Create", s.streamCreate)
		t.Run("UnknownKey", s.streamUnknown)
		t.Run("List", s.streamList)
		t.Run("DeleteSessionDropsStreams", s.deleteDropsStreams)
	})
	t.Run("Append", func(t *testing.T) {
		t.Run("ConsecutiveSeqs", s.appendSeqs)
		t.Run("RoundTrip", s.appendRoundTrip)
	})
	t.Run("Read", func(t *testing.T) {
		t.Run("Cursor", s.readCursor)
		t.Run("ReusesBuf", s.readReusesBuf)
	})
	t.Run("Terminal", func(t *testing.T) {
		t.Run("Marker", s.terminalMarker)
		t.Run("KeptDuringGrace", s.terminalKept)
		t.Run("DroppedAfterGrace", s.terminalDropped)
		t.Run("ExpiryFreesBudget", s.terminalFreesBudget)
	})
	t.Run("Retention", func(t *testing.T) {
		t.Run("MaxEventsPerSession", s.retentionMaxEvents)
		t.Run("MaxBytesPerSession", s.retentionMaxBytes)
		t.Run("AppendOrderAcrossStreams", s.retentionOrder)
		t.Run("Batch", s.retentionBatch)
		t.Run("OversizeEvent", s.retentionOversize)
	})
	t.Run("Concurrent", func(t *testing.T) {
		t.Run("NoGaps", func(t *testing.T) { s.concurrent(t, false) })
		t.Run("WithEviction", func(t *testing.T) { s.concurrent(t, true) })
	})
	t.Run("CancelledContext", s.cancelled)
	t.Run("Retained", s.retained)
}

type suite struct {
	open openFunc
	opts Options
}

// realGrace is the TerminalGrace of the grace subtests on the real clock.
const realGrace = time.Millisecond

// withGrace runs body on a store opened with r and a TerminalGrace of its
// choosing. body calls pass once its terminal stream key is written: pass
// lets the grace go by, and in a bubble first checks that key is still
// readable 1 ns before the grace ends.
func (s suite) withGrace(t *testing.T, r eventlog.Retention, body func(t *testing.T, st eventlog.Store, pass func(key string))) {
	if !s.opts.Synctest {
		r.TerminalGrace = realGrace
		body(t, s.store(t, r), func(string) { time.Sleep(10 * realGrace) })
		return
	}
	synctest.Test(t, func(t *testing.T) {
		const grace = time.Minute
		r.TerminalGrace = grace
		st := s.store(t, r)
		body(t, st, func(key string) {
			time.Sleep(grace - time.Nanosecond)
			if _, _, err := st.Read(t.Context(), key, 0, 1, nil); err != nil {
				t.Errorf("Read of terminal stream %q 1ns before its grace ends: %v", key, err)
			}
			time.Sleep(time.Nanosecond)
		})
	})
}

// store opens a store and closes it when t ends.
func (s suite) store(t *testing.T, r eventlog.Retention) eventlog.Store {
	t.Helper()
	st := s.open(t, r)
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return st
}

// bigRetention keeps everything the suite appends, except where a subtest
// sets its own budget.
var bigRetention = eventlog.Retention{MaxEvents: 1 << 20, MaxBytes: 1 << 30}

func fullSession(id string) *eventlog.Session {
	return &eventlog.Session{
		ID:               id,
		Principal:        "sha256:" + id,
		ProtocolVersion:  "2025-06-18",
		InitializeParams: json.RawMessage(`{"protocolVersion":"2025-06-18","clientInfo":{"name":"t","version":"1"}}`),
		Incarnation:      1,
		Upstream:         "up-" + id,
		Replay: []json.RawMessage{
			json.RawMessage(`{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"debug"}}`),
			json.RawMessage(`{"jsonrpc":"2.0","id":2,"method":"resources/subscribe","params":{"uri":"test://x"}}`),
		},
		Created:   time.Date(2026, 7, 1, 12, 30, 0, 123456789, time.UTC),
		LastUsed:  time.Date(2026, 7, 2, 8, 0, 0, 987654321, time.UTC),
		Listening: true,
	}
}

func mustSession(t *testing.T, st eventlog.Store, id string) {
	t.Helper()
	if err := st.CreateSession(t.Context(), fullSession(id)); err != nil {
		t.Fatalf("CreateSession(%q): %v", id, err)
	}
}

func mustStream(t *testing.T, st eventlog.Store, session, key string) {
	t.Helper()
	if err := st.CreateStream(t.Context(), &eventlog.Stream{Key: key, Session: session, Generation: 1}); err != nil {
		t.Fatalf("CreateStream(%q, %q): %v", session, key, err)
	}
}

// payload is the Data the suite appends as event seq of stream key, padded to size.
func payload(key string, seq uint64, size int) []byte {
	b := fmt.Appendf(nil, "%s#%d;", key, seq)
	for len(b) < size {
		b = append(b, '.')
	}
	return b
}

// appendN appends n events to key one Append call each, with payloads of size bytes.
func appendN(t *testing.T, st eventlog.Store, key string, n, size int) uint64 {
	t.Helper()
	var last uint64
	for range n {
		rec, _ := mustRead(t, st, key, 0, 0)
		l, err := st.Append(t.Context(), key, false, eventlog.Event{Data: payload(key, rec.LastSeq+1, size)})
		if err != nil {
			t.Fatalf("Append(%q): %v", key, err)
		}
		last = l
	}
	return last
}

func mustRead(t *testing.T, st eventlog.Store, key string, after uint64, max int) (eventlog.Stream, []eventlog.Event) {
	t.Helper()
	rec, evs, err := st.Read(t.Context(), key, after, max, nil)
	if err != nil {
		t.Fatalf("Read(%q, after=%d): %v", key, after, err)
	}
	return rec, evs
}

// checkEvents reports whether evs are exactly the seqs from..to of key with suite payloads.
func checkEvents(t *testing.T, key string, evs []eventlog.Event, from, to uint64) {
	t.Helper()
	if got, want := len(evs), int(to-from+1); from > to && len(evs) != 0 || from <= to && got != want {
		t.Fatalf("stream %q: got %d events %v, want seqs %d..%d", key, len(evs), seqs(evs), from, to)
	}
	for i, e := range evs {
		want := from + uint64(i)
		if e.Seq != want {
			t.Fatalf("stream %q: event %d has seq %d, want %d (all: %v)", key, i, e.Seq, want, seqs(evs))
		}
		if p := payload(key, want, 0); !bytes.HasPrefix(e.Data, p) {
			t.Fatalf("stream %q: event seq %d has data %.40q, want prefix %q", key, want, e.Data, p)
		}
	}
}

func seqs(evs []eventlog.Event) []uint64 {
	out := make([]uint64, len(evs))
	for i, e := range evs {
		out[i] = e.Seq
	}
	return out
}

func checkRecord(t *testing.T, got eventlog.Stream, first, last uint64, terminal bool) {
	t.Helper()
	if got.FirstSeq != first || got.LastSeq != last || got.Terminal != terminal {
		t.Fatalf("stream %q: FirstSeq=%d LastSeq=%d Terminal=%v, want %d, %d, %v",
			got.Key, got.FirstSeq, got.LastSeq, got.Terminal, first, last, terminal)
	}
}

func sessionDiff(got, want *eventlog.Session) string {
	switch {
	case got.ID != want.ID:
		return fmt.Sprintf("ID %q, want %q", got.ID, want.ID)
	case got.Principal != want.Principal:
		return fmt.Sprintf("Principal %q, want %q", got.Principal, want.Principal)
	case got.ProtocolVersion != want.ProtocolVersion:
		return fmt.Sprintf("ProtocolVersion %q, want %q", got.ProtocolVersion, want.ProtocolVersion)
	case !bytes.Equal(got.InitializeParams, want.InitializeParams):
		return fmt.Sprintf("InitializeParams %s, want %s", got.InitializeParams, want.InitializeParams)
	case got.Incarnation != want.Incarnation:
		return fmt.Sprintf("Incarnation %d, want %d", got.Incarnation, want.Incarnation)
	case got.Upstream != want.Upstream:
		return fmt.Sprintf("Upstream %q, want %q", got.Upstream, want.Upstream)
	case !slices.EqualFunc(got.Replay, want.Replay, func(a, b json.RawMessage) bool { return bytes.Equal(a, b) }):
		return fmt.Sprintf("Replay %q, want %q", got.Replay, want.Replay)
	case !got.Created.Equal(want.Created):
		return fmt.Sprintf("Created %v, want %v", got.Created, want.Created)
	case !got.LastUsed.Equal(want.LastUsed):
		return fmt.Sprintf("LastUsed %v, want %v", got.LastUsed, want.LastUsed)
	case got.Listening != want.Listening:
		return fmt.Sprintf("Listening %v, want %v", got.Listening, want.Listening)
	}
	return ""
}

// sessionLister is implemented by stores that can list their sessions.
type sessionLister interface {
	ListSessions(ctx context.Context) ([]eventlog.SessionSummary, error)
}

// IdleLister is implemented by stores that list the sessions their records
// say are idle (see eventlog.Store).
type IdleLister interface {
	IdleSessions(ctx context.Context, before time.Time, limit int) ([]string, error)
}

// sessionIdle checks IdleSessions, for stores that have it: a session is
// listed when its LastUsed (or, if zero, Created) is strictly before the
// bound, not after it is used again or deleted, never when its record
// has no time; limit bounds the list.
func (s suite) sessionIdle(t *testing.T) {
	st := s.store(t, eventlog.Retention{})
	l, ok := st.(IdleLister)
	if !ok {
		t.Skipf("%T has no IdleSessions", st)
	}
	ctx := t.Context()
	t0 := time.Date(2026, 7, 2, 8, 0, 0, 0, time.UTC)
	create := func(id string, created, used time.Time) {
		t.Helper()
		if err := st.CreateSession(ctx, &eventlog.Session{ID: id, Incarnation: 1, Created: created, LastUsed: used}); err != nil {
			t.Fatalf("CreateSession(%q): %v", id, err)
		}
	}
	create("used-2h-ago", t0.Add(-3*time.Hour), t0.Add(-2*time.Hour))
	create("created-2h-ago", t0.Add(-2*time.Hour), time.Time{})
	create("used-now", t0.Add(-3*time.Hour), t0)
	create("no-time", time.Time{}, time.Time{})
	create("deleted", t0.Add(-3*time.Hour), time.Time{})
	create("used-again", t0.Add(-3*time.Hour), time.Time{})
	if err := st.DeleteSession(ctx, "deleted"); err != nil {
		t.Fatal(err)
	}
	if err := st.UpdateSession(ctx, &eventlog.Session{ID: "used-again", Incarnation: 1, Created: t0.Add(-3 * time.Hour), LastUsed: t0}); err != nil {
		t.Fatal(err)
	}
	list := func(before time.Time, limit int) []string {
		t.Helper()
		ids, err := l.IdleSessions(ctx, before, limit)
		if err != nil {
			t.Fatalf("IdleSessions: %v", err)
		}
		slices.Sort(ids)
		return ids
	}
	if got, want := list(t0.Add(-time.Hour), 100), []string{"created-2h-ago", "used-2h-ago"}; !slices.Equal(got, want) {
		t.Errorf("IdleSessions(1 h before) = %q, want %q", got, want)
	}
	if got := list(t0.Add(-2*time.Hour), 100); len(got) != 0 {
		t.Errorf("IdleSessions(2 h before) = %q, want none: a session last used at the bound is not idle before it", got)
	}
	if got := list(t0.Add(-time.Hour), 1); len(got) != 1 || !slices.Contains([]string{"created-2h-ago", "used-2h-ago"}, got[0]) {
		t.Errorf("IdleSessions(1 h before, limit 1) = %q, want one of the two idle sessions", got)
	}
	if got, want := list(t0.Add(time.Hour), 100), []string{"created-2h-ago", "used-2h-ago", "used-again", "used-now"}; !slices.Equal(got, want) {
		t.Errorf("IdleSessions(1 h after) = %q, want %q", got, want)
	}
}

// Toucher is implemented by stores that record a session's use without a
// read-modify-write of its record (see eventlog.Store).
type Toucher interface {
	TouchSession(ctx context.Context, id string, at time.Time) error
}

// sessionTouch checks TouchSession, for stores that have it: LastUsed
// becomes the later of the two, to the nanosecond, and nothing else of the
// record changes; an update written afterwards from the record as read
// keeps it; IdleSessions follows it; unknown and deleted sessions are
// ErrNotFound.
func (s suite) sessionTouch(t *testing.T) {
	st := s.store(t, eventlog.Retention{})
	tc, ok := st.(Toucher)
	if !ok {
		t.Skipf("%T has no TouchSession", st)
	}
	ctx := t.Context()
	want := fullSession("touched")
	if err := st.CreateSession(ctx, want); err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		got, err := st.Session(ctx, "touched")
		if err != nil {
			t.Fatalf("%s: Session: %v", what, err)
		}
		if d := sessionDiff(got, want); d != "" {
			t.Errorf("%s: %s", what, d)
		}
	}
	if err := tc.TouchSession(ctx, "touched", want.LastUsed.Add(-time.Hour)); err != nil {
		t.Fatalf("TouchSession earlier: %v", err)
	}
	check("after a touch earlier than LastUsed")
	later := want.LastUsed.Add(90*time.Minute + 123*time.Nanosecond)
	if err := tc.TouchSession(ctx, "touched", later); err != nil {
		t.Fatalf("TouchSession later: %v", err)
	}
	want.LastUsed = later
	check("after a touch later than LastUsed")
	rec, err := st.Session(ctx, "touched")
	if err != nil {
		t.Fatal(err)
	}
	rec.Incarnation++
	want.Incarnation++
	if err := st.UpdateSession(ctx, rec); err != nil {
		t.Fatal(err)
	}
	check("after an update of the record as read")
	if l, ok := st.(IdleLister); ok {
		ids, err := l.IdleSessions(ctx, later.Add(-time.Millisecond), 10)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(ids, "touched") {
			t.Errorf("IdleSessions lists a session touched after the bound")
		}
	}
	if err := tc.TouchSession(ctx, "unknown", later); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("TouchSession of an unknown session: %v, want ErrNotFound", err)
	}
	if err := st.DeleteSession(ctx, "touched"); err != nil {
		t.Fatal(err)
	}
	if err := tc.TouchSession(ctx, "touched", later); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("TouchSession of a deleted session: %v, want ErrNotFound", err)
	}
	if _, err := st.Session(ctx, "touched"); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("Session after a touch of the deleted session: %v, want ErrNotFound", err)
	}
}

// sessionList checks ListSessions, for stores that have it: every session
// once, with its record, its streams and what it retains after eviction;
// a deleted session is not listed.
func (s suite) sessionList(t *testing.T) {
	st := s.store(t, eventlog.Retention{MaxEvents: 1 << 20, MaxBytes: 1000})
	l, ok := st.(sessionLister)
	if !ok {
		t.Skipf("%T has no ListSessions", st)
	}
	for _, id := range []string{"A", "B", "C", "D"} {
		mustSession(t, st, id)
	}
	mustStream(t, st, "A", "a1")
	mustStream(t, st, "A", "a2")
	appendN(t, st, "a1", 4, 100)
	appendN(t, st, "a2", 2, 50)
	mustStream(t, st, "B", "b")
	appendN(t, st, "b", 25, 100) // evicted down to 10 events, 1000 bytes
	mustStream(t, st, "D", "d")
	if err := st.DeleteSession(t.Context(), "D"); err != nil {
		t.Fatal(err)
	}
	list, err := l.ListSessions(t.Context())
	if err != nil {
		t.Fatalf("ListSessions: %v", err)
	}
	slices.SortFunc(list, func(a, b eventlog.SessionSummary) int { return strings.Compare(a.ID, b.ID) })
	want := []struct {
		id              string
		streams, events int
		bytes           int64
	}{{"A", 2, 6, 500}, {"B", 1, 10, 1000}, {"C", 0, 0, 0}}
	if len(list) != len(want) {
		t.Fatalf("ListSessions listed %d sessions, want %d: %+v", len(list), len(want), list)
	}
	for i, w := range want {
		got := list[i]
		if got.ID != w.id || got.Streams != w.streams || got.Events != w.events || got.Bytes != w.bytes {
			t.Errorf("session %d: %s with %d streams, %d events, %d bytes; want %s with %d, %d, %d",
				i, got.ID, got.Streams, got.Events, got.Bytes, w.id, w.streams, w.events, w.bytes)
		}
		if d := sessionDiff(&got.Session, fullSession(w.id)); d != "" {
			t.Errorf("session %s: %s", w.id, d)
		}
	}
}

func (s suite) sessionRoundTrip(t *testing.T) {
	st := s.store(t, eventlog.Retention{})
	cases := []struct {
		name string
		sess *eventlog.Session
	}{
		{"all fields", fullSession("s-full")},
		{"anonymous minimal", &eventlog.Session{ID: "s-min", Incarnation: 1}},
		{"long id", &eventlog.Session{ID: string(bytes.Repeat([]byte{'k'}, 200)), Incarnation: 7}},
		{"listening, never used", &eventlog.Session{ID: "s-listen", Incarnation: 1, Created: time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC), Listening: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := st.CreateSession(t.Context(), tc.sess); err != nil {
				t.Fatalf("CreateSession: %v", err)
			}
			got, err := st.Session(t.Context(), tc.sess.ID)
			if err != nil {
				t.Fatalf("Session: %v", err)
			}
			if d := sessionDiff(got, tc.sess); d != "" {
				t.Error(d)
			}
		})
	}
}

func (s suite) sessionErrors(t *testing.T) {
	cases := []struct {
		name string
		op   func(ctx context.Context, st eventlog.Store) error
		want error
	}{
		{"create taken id", func(ctx context.Context, st eventlog.Store) error {
			return st.CreateSession(ctx, fullSession("s1"))
		}, eventlog.ErrExists},
		{"get unknown", func(ctx context.Context, st eventlog.Store) error {
			_, err := st.Session(ctx, "nope")
			return err
		}, eventlog.ErrNotFound},
		{"update unknown", func(ctx context.Context, st eventlog.Store) error {
			return st.UpdateSession(ctx, fullSession("nope"))
		}, eventlog.ErrNotFound},
		{"delete unknown", func(ctx context.Context, st eventlog.Store) error {
			return st.DeleteSession(ctx, "nope")
		}, eventlog.ErrNotFound},
		{"delete twice", func(ctx context.Context, st eventlog.Store) error {
			if err := st.DeleteSession(ctx, "s1"); err != nil {
				return fmt.Errorf("first delete: %v", err)
			}
			return st.DeleteSession(ctx, "s1")
		}, eventlog.ErrNotFound},
		{"get deleted", func(ctx context.Context, st eventlog.Store) error {
			if err := st.DeleteSession(ctx, "s1"); err != nil {
				return fmt.Errorf("delete: %v", err)
			}
			_, err := st.Session(ctx, "s1")
			return err
		}, eventlog.ErrNotFound},
		{"update deleted", func(ctx context.Context, st eventlog.Store) error {
			if err := st.DeleteSession(ctx, "s1"); err != nil {
				return fmt.Errorf("delete: %v", err)
			}
			return st.UpdateSession(ctx, fullSession("s1"))
		}, eventlog.ErrNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := s.store(t, eventlog.Retention{})
			mustSession(t, st, "s1")
			if err := tc.op(t.Context(), st); !errors.Is(err, tc.want) {
				t.Fatalf("got error %v, want %v", err, tc.want)
			}
		})
	}
}

func (s suite) sessionUpdate(t *testing.T) {
	st := s.store(t, eventlog.Retention{})
	mustSession(t, st, "s1")
	mustSession(t, st, "s2")
	upd := fullSession("s1")
	upd.Incarnation = 2
	upd.Upstream = ""
	upd.ProtocolVersion = "2025-11-25"
	upd.Replay = append(upd.Replay, json.RawMessage(`{"jsonrpc":"2.0","id":3,"method":"resources/subscribe","params":{"uri":"test://y"}}`))
	upd.Listening = false
	if err := st.UpdateSession(t.Context(), upd); err != nil {
		t.Fatalf("UpdateSession: %v", err)
	}
	got, err := st.Session(t.Context(), "s1")
	if err != nil {
		t.Fatalf("Session: %v", err)
	}
	if d := sessionDiff(got, upd); d != "" {
		t.Errorf("after update: %s", d)
	}
	other, err := st.Session(t.Context(), "s2")
	if err != nil {
		t.Fatalf("Session(s2): %v", err)
	}
	if d := sessionDiff(other, fullSession("s2")); d != "" {
		t.Errorf("other session changed: %s", d)
	}
}

func (s suite) sessionCopies(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(t *testing.T, st eventlog.Store, in *eventlog.Session)
	}{
		{"returned copy", func(t *testing.T, st eventlog.Store, _ *eventlog.Session) {
			got, err := st.Session(t.Context(), "s1")
			if err != nil {
				t.Fatalf("Session: %v", err)
			}
			scribble(got)
		}},
		{"input after create", func(t *testing.T, _ eventlog.Store, in *eventlog.Session) {
			scribble(in)
		}},
		{"input after update", func(t *testing.T, st eventlog.Store, in *eventlog.Session) {
			if err := st.UpdateSession(t.Context(), in); err != nil {
				t.Fatalf("UpdateSession: %v", err)
			}
			scribble(in)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := s.store(t, eventlog.Retention{})
			in := fullSession("s1")
			if err := st.CreateSession(t.Context(), in); err != nil {
				t.Fatalf("CreateSession: %v", err)
			}
			tc.mutate(t, st, in)
			got, err := st.Session(t.Context(), "s1")
			if err != nil {
				t.Fatalf("Session: %v", err)
			}
			if d := sessionDiff(got, fullSession("s1")); d != "" {
				t.Errorf("stored record changed: %s", d)
			}
		})
	}
}

// scribble mutates every field of s in place, including shared byte slices.
func scribble(s *eventlog.Session) {
	s.Principal = "mallory"
	s.Incarnation = 99
	s.InitializeParams[0] = 'X'
	s.Replay[0][0] = 'X'
	s.Replay[1] = json.RawMessage(`null`)
}

func (s suite) sessionRecreate(t *testing.T) {
	st := s.store(t, bigRetention)
	mustSession(t, st, "s1")
	mustStream(t, st, "s1", "k1")
	appendN(t, st, "k1", 3, 10)
	if err := st.DeleteSession(t.Context(), "s1"); err != nil {
		t.Fatalf("DeleteSession: %v", err)
	}
	mustSession(t, st, "s1")
	if got, err := st.Streams(t.Context(), "s1"); err != nil || len(got) != 0 {
		t.Fatalf("Streams of recreated session = %v, %v; want none", got, err)
	}
	if _, _, err := st.Read(t.Context(), "k1", 0, 10, nil); !errors.Is(err, eventlog.ErrNotFound) {
		t.Fatalf("Read of old stream: %v, want ErrNotFound", err)
	}
	mustStream(t, st, "s1", "k1")
	rec, evs := mustRead(t, st, "k1", 0, 10)
	checkRecord(t, rec, 1, 0, false)
	checkEvents(t, "k1", evs, 1, 0)
}

func (s suite) streamCreate(t *testing.T) {
	cases := []struct {
		name   string
		stream eventlog.Stream
		want   error
	}{
		{"standalone", eventlog.Stream{Key: "k-get", Session: "s1", Generation: 1}, nil},
		{"request stream", eventlog.Stream{Key: "k-post", Session: "s1", Generation: 3, RequestID: json.RawMessage(`"req-7"`)}, nil},
		{"store-maintained fields ignored", eventlog.Stream{Key: "k-x", Session: "s1", Generation: 1, FirstSeq: 9, LastSeq: 8, Terminal: true}, nil},
		{"unknown session", eventlog.Stream{Key: "k-new", Session: "nope", Generation: 1}, eventlog.ErrNotFound},
		{"key taken in same session", eventlog.Stream{Key: "k-taken", Session: "s1", Generation: 1}, eventlog.ErrExists},
		{"key taken by other session", eventlog.Stream{Key: "k-taken", Session: "s2", Generation: 1}, eventlog.ErrExists},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := s.store(t, eventlog.Retention{})
			mustSession(t, st, "s1")
			mustSession(t, st, "s2")
			mustStream(t, st, "s1", "k-taken")
			in := tc.stream
			in.RequestID = slices.Clone(tc.stream.RequestID)
			err := st.CreateStream(t.Context(), &in)
			if !errors.Is(err, tc.want) {
				t.Fatalf("CreateStream: %v, want %v", err, tc.want)
			}
			if tc.want != nil {
				if tc.stream.Key != "k-taken" {
					if _, _, err := st.Read(t.Context(), tc.stream.Key, 0, 1, nil); !errors.Is(err, eventlog.ErrNotFound) {
						t.Errorf("Read after failed create: %v, want ErrNotFound", err)
					}
				}
				return
			}
			if len(in.RequestID) > 0 {
				in.RequestID[0] = 'X' // the store must have copied it
			}
			rec, evs := mustRead(t, st, tc.stream.Key, 0, 10)
			checkRecord(t, rec, 1, 0, false)
			if len(evs) != 0 {
				t.Errorf("new stream has events %v", seqs(evs))
			}
			if rec.Key != tc.stream.Key || rec.Session != tc.stream.Session || rec.Generation != tc.stream.Generation ||
				!bytes.Equal(rec.RequestID, tc.stream.RequestID) {
				t.Errorf("record %+v, want key %q session %q generation %d request id %s",
					rec, tc.stream.Key, tc.stream.Session, tc.stream.Generation, tc.stream.RequestID)
			}
		})
	}
}

func (s suite) streamUnknown(t *testing.T) {
	st := s.store(t, eventlog.Retention{})
	mustSession(t, st, "s1")
	if _, err := st.Append(t.Context(), "nope", false, eventlog.Event{Data: []byte("x")}); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("Append unknown stream: %v, want ErrNotFound", err)
	}
	if _, err := st.Append(t.Context(), "nope", true, eventlog.Event{Data: []byte("x")}); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("terminal Append unknown stream: %v, want ErrNotFound", err)
	}
	if _, _, err := st.Read(t.Context(), "nope", 0, 10, nil); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("Read unknown stream: %v, want ErrNotFound", err)
	}
	if got, err := st.Streams(t.Context(), "nope"); err != nil || len(got) != 0 {
		t.Errorf("Streams of unknown session = %v, %v; want none, nil", got, err)
	}
}

func (s suite) streamList(t *testing.T) {
	st := s.store(t, bigRetention)
	mustSession(t, st, "A")
	mustSession(t, st, "B")
	mustSession(t, st, "C")
	want := map[string]eventlog.Stream{
		"a-get":  {Key: "a-get", Session: "A", Generation: 1, FirstSeq: 1, LastSeq: 2},
		"a-post": {Key: "a-post", Session: "A", Generation: 2, RequestID: json.RawMessage(`7`), FirstSeq: 1, LastSeq: 3, Terminal: true},
		"a-new":  {Key: "a-new", Session: "A", Generation: 2, RequestID: json.RawMessage(`"x"`), FirstSeq: 1, LastSeq: 0},
		"b-get":  {Key: "b-get", Session: "B", Generation: 1, FirstSeq: 1, LastSeq: 1},
	}
	for _, w := range want {
		if err := st.CreateStream(t.Context(), &eventlog.Stream{Key: w.Key, Session: w.Session, Generation: w.Generation, RequestID: w.RequestID}); err != nil {
			t.Fatalf("CreateStream(%q): %v", w.Key, err)
		}
		for i := range w.LastSeq {
			last := i+1 == w.LastSeq
			if _, err := st.Append(t.Context(), w.Key, last && w.Terminal, eventlog.Event{Data: payload(w.Key, i+1, 0)}); err != nil {
				t.Fatalf("Append(%q): %v", w.Key, err)
			}
		}
	}
	cases := []struct {
		session string
		keys    []string
	}{
		{"A", []string{"a-get", "a-new", "a-post"}},
		{"B", []string{"b-get"}},
		{"C", nil},
		{"unknown", nil},
	}
	for _, tc := range cases {
		t.Run("session "+tc.session, func(t *testing.T) {
			got, err := st.Streams(t.Context(), tc.session)
			if err != nil {
				t.Fatalf("Streams: %v", err)
			}
			var keys []string
			for _, g := range got {
				keys = append(keys, g.Key)
				w := want[g.Key]
				if g.Session != w.Session || g.Generation != w.Generation || !bytes.Equal(g.RequestID, w.RequestID) ||
					g.FirstSeq != w.FirstSeq || g.LastSeq != w.LastSeq || g.Terminal != w.Terminal {
					t.Errorf("stream %q: got %+v, want %+v", g.Key, g, w)
				}
			}
			slices.Sort(keys)
			if !slices.Equal(keys, tc.keys) {
				t.Errorf("Streams(%q) keys = %q, want %q", tc.session, keys, tc.keys)
			}
		})
	}
}

func (s suite) deleteDropsStreams(t *testing.T) {
	st := s.store(t, bigRetention)
	mustSession(t, st, "A")
	mustSession(t, st, "B")
	for _, k := range []string{"a1", "a2"} {
		mustStream(t, st, "A", k)
		appendN(t, st, k, 4, 20)
	}
	mustStream(t, st, "B", "b1")
	appendN(t, st, "b1", 4, 20)
	if err := st.DeleteSession(t.Context(), "A"); err != nil {
		t.Fatalf("DeleteSession: %v", err)
	}
	for _, k := range []string{"a1", "a2"} {
		if _, _, err := st.Read(t.Context(), k, 0, 10, nil); !errors.Is(err, eventlog.ErrNotFound) {
			t.Errorf("Read(%q) after delete: %v, want ErrNotFound", k, err)
		}
		if _, err := st.Append(t.Context(), k, false, eventlog.Event{Data: []byte("x")}); !errors.Is(err, eventlog.ErrNotFound) {
			t.Errorf("Append(%q) after delete: %v, want ErrNotFound", k, err)
		}
	}
	if got, err := st.Streams(t.Context(), "A"); err != nil || len(got) != 0 {
		t.Errorf("Streams(A) after delete = %v, %v; want none", got, err)
	}
	if err := st.CreateStream(t.Context(), &eventlog.Stream{Key: "a3", Session: "A", Generation: 1}); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("CreateStream in deleted session: %v, want ErrNotFound", err)
	}
	rec, evs := mustRead(t, st, "b1", 0, 10)
	checkRecord(t, rec, 1, 4, false)
	checkEvents(t, "b1", evs, 1, 4)
}

func (s suite) appendSeqs(t *testing.T) {
	st := s.store(t, bigRetention)
	mustSession(t, st, "s1")
	mustStream(t, st, "s1", "k")
	mustStream(t, st, "s1", "other")
	var next uint64 = 1
	for i, n := range []int{1, 3, 2, 5, 1} {
		evs := make([]eventlog.Event, n)
		for j := range evs {
			evs[j].Data = payload("k", next+uint64(j), 0)
		}
		last, err := st.Append(t.Context(), "k", false, evs...)
		if err != nil {
			t.Fatalf("Append #%d: %v", i, err)
		}
		if want := next + uint64(n) - 1; last != want {
			t.Fatalf("Append #%d of %d events returned LastSeq %d, want %d", i, n, last, want)
		}
		for j, e := range evs {
			if e.Seq != next+uint64(j) {
				t.Fatalf("Append #%d set events[%d].Seq = %d, want %d", i, j, e.Seq, next+uint64(j))
			}
		}
		next += uint64(n)
		// Another stream of the session has its own sequence.
		if l, err := st.Append(t.Context(), "other", false, eventlog.Event{Data: payload("other", uint64(i+1), 0)}); err != nil || l != uint64(i+1) {
			t.Fatalf("Append(other) = %d, %v; want %d", l, err, i+1)
		}
	}
	rec, evs := mustRead(t, st, "k", 0, 100)
	checkRecord(t, rec, 1, 12, false)
	checkEvents(t, "k", evs, 1, 12)
}

func (s suite) appendRoundTrip(t *testing.T) {
	st := s.store(t, bigRetention)
	mustSession(t, st, "s1")
	mustStream(t, st, "s1", "k")
	in := []eventlog.Event{
		{Data: []byte(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}`)},
		{Type: "reset", Data: []byte(`{"reason":"gap","stream":"k","generation":1,"lost":3}`)},
		{Data: []byte{}},
		{Type: "custom", Data: []byte{0, 1, 2, 0xff, '\n', '\r'}},
		{Data: bytes.Repeat([]byte("y"), 64<<10)},
	}
	want := make([]eventlog.Event, len(in))
	for i, e := range in {
		want[i] = eventlog.Event{Seq: uint64(i + 1), Type: e.Type, Data: slices.Clone(e.Data)}
	}
	if _, err := st.Append(t.Context(), "k", false, in...); err != nil {
		t.Fatalf("Append: %v", err)
	}
	_, got := mustRead(t, st, "k", 0, 100)
	if len(got) != len(want) {
		t.Fatalf("read %d events, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Seq != want[i].Seq || got[i].Type != want[i].Type || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Errorf("event %d: got {%d %q %.40q}, want {%d %q %.40q}", i,
				got[i].Seq, got[i].Type, got[i].Data, want[i].Seq, want[i].Type, want[i].Data)
		}
	}
}

func (s suite) readCursor(t *testing.T) {
	st := s.store(t, bigRetention)
	mustSession(t, st, "s1")
	mustStream(t, st, "s1", "k")
	appendN(t, st, "k", 10, 30)
	cases := []struct {
		name     string
		after    uint64
		max      int
		from, to uint64 // want seqs from..to; from > to means none
	}{
		{"after 0", 0, 100, 1, 10},
		{"after middle", 4, 100, 5, 10},
		{"after last", 10, 100, 11, 10},
		{"beyond last", 15, 100, 16, 10},
		{"far beyond", 1<<64 - 1, 100, 1, 0},
		{"max limits from start", 0, 3, 1, 3},
		{"max limits from middle", 5, 2, 6, 7},
		{"max larger than rest", 8, 3, 9, 10},
		{"max exactly rest", 7, 3, 8, 10},
		{"max one", 9, 1, 10, 10},
		{"max zero returns record only", 0, 0, 1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec, evs := mustRead(t, st, "k", tc.after, tc.max)
			checkRecord(t, rec, 1, 10, false)
			checkEvents(t, "k", evs, tc.from, tc.to)
		})
	}
}

func (s suite) readReusesBuf(t *testing.T) {
	st := s.store(t, bigRetention)
	mustSession(t, st, "s1")
	mustStream(t, st, "s1", "k")
	appendN(t, st, "k", 6, 10)
	buf := make([]eventlog.Event, 4, 16)
	for i := range buf {
		buf[i] = eventlog.Event{Seq: 999, Data: []byte("junk")}
	}
	_, evs, err := st.Read(t.Context(), "k", 2, 3, buf)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	checkEvents(t, "k", evs, 3, 5)
	if &evs[0] != &buf[:1][0] {
		t.Errorf("Read did not append to buf[:0] although it had room")
	}
	_, evs, err = st.Read(t.Context(), "k", 6, 3, evs)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if len(evs) != 0 {
		t.Errorf("Read after last with a non-empty buf returned %v, want none", seqs(evs))
	}
}

func (s suite) terminalMarker(t *testing.T) {
	cases := []struct {
		name    string
		batches []int // events per Append; the last Append is terminal
	}{
		{"single terminal event", []int{1}},
		{"terminal after events", []int{2, 1}},
		{"terminal batch", []int{2, 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := s.store(t, bigRetention)
			mustSession(t, st, "s1")
			mustStream(t, st, "s1", "k")
			var seq uint64
			for i, n := range tc.batches {
				evs := make([]eventlog.Event, n)
				for j := range evs {
					seq++
					evs[j].Data = payload("k", seq, 0)
				}
				terminal := i == len(tc.batches)-1
				last, err := st.Append(t.Context(), "k", terminal, evs...)
				if err != nil || last != seq {
					t.Fatalf("Append #%d = %d, %v; want %d", i, last, err, seq)
				}
				rec, _ := mustRead(t, st, "k", 0, 0)
				checkRecord(t, rec, 1, seq, terminal)
			}
			for _, terminal := range []bool{false, true} {
				if _, err := st.Append(t.Context(), "k", terminal, eventlog.Event{Data: []byte("late")}); !errors.Is(err, eventlog.ErrTerminal) {
					t.Errorf("Append(terminal=%v) after terminal: %v, want ErrTerminal", terminal, err)
				}
			}
			rec, evs := mustRead(t, st, "k", 0, 100)
			checkRecord(t, rec, 1, seq, true)
			checkEvents(t, "k", evs, 1, seq)
			if _, evs := mustRead(t, st, "k", seq, 100); len(evs) != 0 {
				t.Errorf("Read after the terminal event returned %v", seqs(evs))
			}
			list, err := st.Streams(t.Context(), "s1")
			if err != nil || len(list) != 1 || !list[0].Terminal || list[0].LastSeq != seq {
				t.Errorf("Streams = %+v, %v; want one terminal stream with LastSeq %d", list, err, seq)
			}
		})
	}
}

func (s suite) terminalKept(t *testing.T) {
	st := s.store(t, eventlog.Retention{}) // default grace: minutes
	mustSession(t, st, "s1")
	mustStream(t, st, "s1", "k")
	if _, err := st.Append(t.Context(), "k", true, eventlog.Event{Data: payload("k", 1, 0)}); err != nil {
		t.Fatalf("Append: %v", err)
	}
	rec, evs := mustRead(t, st, "k", 0, 10)
	checkRecord(t, rec, 1, 1, true)
	checkEvents(t, "k", evs, 1, 1)
}

// terminalDropped: once its grace has passed a terminal stream is gone, an
// open stream is not (exactly at the grace in a bubble; see Options).
func (s suite) terminalDropped(t *testing.T) {
	s.withGrace(t, eventlog.Retention{MaxEvents: 1000, MaxBytes: 1 << 20}, s.terminalDroppedOn)
}

func (s suite) terminalDroppedOn(t *testing.T, st eventlog.Store, pass func(key string)) {
	mustSession(t, st, "s1")
	mustStream(t, st, "s1", "done")
	mustStream(t, st, "s1", "open")
	appendN(t, st, "open", 3, 10)
	if _, err := st.Append(t.Context(), "done", true, eventlog.Event{Data: payload("done", 1, 0)}); err != nil {
		t.Fatalf("Append: %v", err)
	}
	pass("done")
	if _, _, err := st.Read(t.Context(), "done", 0, 10, nil); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("Read of terminal stream after grace: %v, want ErrNotFound", err)
	}
	if _, err := st.Append(t.Context(), "done", false, eventlog.Event{Data: []byte("x")}); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("Append to terminal stream after grace: %v, want ErrNotFound", err)
	}
	list, err := st.Streams(t.Context(), "s1")
	if err != nil || len(list) != 1 || list[0].Key != "open" {
		t.Errorf("Streams after grace = %+v, %v; want only %q", list, err, "open")
	}
	rec, evs := mustRead(t, st, "open", 0, 10)
	checkRecord(t, rec, 1, 3, false)
	checkEvents(t, "open", evs, 1, 3)
	if last, err := st.Append(t.Context(), "open", false, eventlog.Event{Data: payload("open", 4, 0)}); err != nil || last != 4 {
		t.Errorf("Append to open stream after grace = %d, %v; want 4", last, err)
	}
	if _, err := st.Session(t.Context(), "s1"); err != nil {
		t.Errorf("session lost with its terminal stream: %v", err)
	}
}

// terminalFreesBudget checks that a dropped terminal stream's events no
// longer count against its session's retention.
func (s suite) terminalFreesBudget(t *testing.T) {
	s.withGrace(t, eventlog.Retention{MaxEvents: 4, MaxBytes: 1 << 20}, s.terminalFreesBudgetOn)
}

func (s suite) terminalFreesBudgetOn(t *testing.T, st eventlog.Store, pass func(key string)) {
	mustSession(t, st, "s1")
	mustStream(t, st, "s1", "done")
	mustStream(t, st, "s1", "open")
	appendN(t, st, "done", 3, 10)
	if _, err := st.Append(t.Context(), "done", true, eventlog.Event{Data: payload("done", 4, 0)}); err != nil {
		t.Fatalf("Append: %v", err)
	}
	pass("done")
	if _, _, err := st.Read(t.Context(), "done", 0, 10, nil); !errors.Is(err, eventlog.ErrNotFound) {
		t.Fatalf("Read of terminal stream after grace: %v, want ErrNotFound", err)
	}
	appendN(t, st, "open", 4, 10)
	rec, evs := mustRead(t, st, "open", 0, 10)
	checkRecord(t, rec, 1, 4, false)
	checkEvents(t, "open", evs, 1, 4)
}

func (s suite) retentionMaxEvents(t *testing.T) {
	st := s.store(t, eventlog.Retention{MaxEvents: 10, MaxBytes: 1 << 30})
	mustSession(t, st, "A")
	mustSession(t, st, "B")
	mustStream(t, st, "A", "a")
	mustStream(t, st, "B", "b")
	appendN(t, st, "b", 5, 10)
	// Flood A in batches of mixed sizes to 35 events.
	var seq uint64
	for _, n := range []int{1, 4, 9, 2, 7, 3, 1, 8} {
		evs := make([]eventlog.Event, n)
		for j := range evs {
			seq++
			evs[j].Data = payload("a", seq, 10)
		}
		if _, err := st.Append(t.Context(), "a", false, evs...); err != nil {
			t.Fatalf("Append(a): %v", err)
		}
	}
	if seq != 35 {
		t.Fatalf("suite bug: appended %d", seq)
	}
	cases := []struct {
		name     string
		key      string
		after    uint64
		first    uint64
		last     uint64
		from, to uint64
	}{
		{"flooded session from 0 reads from FirstSeq", "a", 0, 26, 35, 26, 35},
		{"flooded session inside the hole", "a", 20, 26, 35, 26, 35},
		{"flooded session at the edge", "a", 25, 26, 35, 26, 35},
		{"flooded session inside the window", "a", 30, 26, 35, 31, 35},
		{"other session intact", "b", 0, 1, 5, 1, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec, evs := mustRead(t, st, tc.key, tc.after, 100)
			checkRecord(t, rec, tc.first, tc.last, false)
			checkEvents(t, tc.key, evs, tc.from, tc.to)
		})
	}
}

func (s suite) retentionMaxBytes(t *testing.T) {
	st := s.store(t, eventlog.Retention{MaxEvents: 1 << 20, MaxBytes: 1000})
	mustSession(t, st, "A")
	mustSession(t, st, "B")
	mustStream(t, st, "A", "a")
	mustStream(t, st, "B", "b")
	appendN(t, st, "b", 9, 100)
	appendN(t, st, "a", 25, 100)
	rec, evs := mustRead(t, st, "a", 0, 100)
	checkRecord(t, rec, 16, 25, false)
	checkEvents(t, "a", evs, 16, 25)
	rec, evs = mustRead(t, st, "b", 0, 100)
	checkRecord(t, rec, 1, 9, false)
	checkEvents(t, "b", evs, 1, 9)
}

// retentionOrder checks that eviction follows the session's append order
// across its streams, not per stream.
func (s suite) retentionOrder(t *testing.T) {
	st := s.store(t, eventlog.Retention{MaxEvents: 4, MaxBytes: 1 << 30})
	mustSession(t, st, "A")
	mustStream(t, st, "A", "x")
	mustStream(t, st, "A", "y")
	steps := []struct {
		key           string
		xFirst, xLast uint64
		yFirst, yLast uint64
	}{
		{"x", 1, 1, 1, 0},
		{"y", 1, 1, 1, 1},
		{"x", 1, 2, 1, 1},
		{"y", 1, 2, 1, 2}, // budget full: x1 y1 x2 y2
		{"x", 2, 3, 1, 2}, // evicts x1
		{"x", 2, 4, 2, 2}, // evicts y1
		{"x", 3, 5, 2, 2}, // evicts x2
		{"x", 3, 6, 3, 2}, // evicts y2: y retains nothing
		{"y", 4, 6, 3, 3}, // evicts x3
	}
	for i, step := range steps {
		appendN(t, st, step.key, 1, 10)
		xr, _ := mustRead(t, st, "x", 0, 0)
		yr, _ := mustRead(t, st, "y", 0, 0)
		if xr.FirstSeq != step.xFirst || xr.LastSeq != step.xLast || yr.FirstSeq != step.yFirst || yr.LastSeq != step.yLast {
			t.Fatalf("after step %d (append to %s): x=[%d,%d] y=[%d,%d], want x=[%d,%d] y=[%d,%d]", i, step.key,
				xr.FirstSeq, xr.LastSeq, yr.FirstSeq, yr.LastSeq, step.xFirst, step.xLast, step.yFirst, step.yLast)
		}
	}
	_, evs := mustRead(t, st, "x", 0, 10)
	checkEvents(t, "x", evs, 4, 6)
	_, evs = mustRead(t, st, "y", 0, 10)
	checkEvents(t, "y", evs, 3, 3)
}

func (s suite) retentionBatch(t *testing.T) {
	st := s.store(t, eventlog.Retention{MaxEvents: 10, MaxBytes: 1 << 30})
	mustSession(t, st, "A")
	mustStream(t, st, "A", "old")
	mustStream(t, st, "A", "new")
	appendN(t, st, "old", 8, 10)
	batch := make([]eventlog.Event, 6)
	for i := range batch {
		batch[i].Data = payload("new", uint64(i+1), 10)
	}
	if _, err := st.Append(t.Context(), "new", false, batch...); err != nil {
		t.Fatalf("Append batch: %v", err)
	}
	// The batch fits the budget, so it is kept whole and only old events go.
	rec, evs := mustRead(t, st, "new", 0, 100)
	checkRecord(t, rec, 1, 6, false)
	checkEvents(t, "new", evs, 1, 6)
	rec, evs = mustRead(t, st, "old", 0, 100)
	checkRecord(t, rec, 5, 8, false)
	checkEvents(t, "old", evs, 5, 8)
}

func (s suite) retentionOversize(t *testing.T) {
	st := s.store(t, eventlog.Retention{MaxEvents: 100, MaxBytes: 1000})
	mustSession(t, st, "A")
	mustSession(t, st, "B")
	mustStream(t, st, "A", "a")
	mustStream(t, st, "A", "a2")
	mustStream(t, st, "B", "b")
	appendN(t, st, "b", 3, 100)
	appendN(t, st, "a", 3, 100)
	appendN(t, st, "a2", 1, 100)
	// A single event over the whole budget is kept alone.
	if _, err := st.Append(t.Context(), "a", false, eventlog.Event{Data: payload("a", 4, 5000)}); err != nil {
		t.Fatalf("Append oversize: %v", err)
	}
	rec, evs := mustRead(t, st, "a", 0, 100)
	checkRecord(t, rec, 4, 4, false)
	checkEvents(t, "a", evs, 4, 4)
	rec, _ = mustRead(t, st, "a2", 0, 100)
	checkRecord(t, rec, 2, 1, false)
	// The next event pushes it out.
	appendN(t, st, "a", 1, 100)
	rec, evs = mustRead(t, st, "a", 0, 100)
	checkRecord(t, rec, 5, 5, false)
	checkEvents(t, "a", evs, 5, 5)
	rec, evs = mustRead(t, st, "b", 0, 100)
	checkRecord(t, rec, 1, 3, false)
	checkEvents(t, "b", evs, 1, 3)
}

// concurrent runs 8 sessions, each with one appender and two readers on one
// stream. Readers must see strictly increasing, consecutive seqs carrying
// their own stream's data; with eviction they may skip only to FirstSeq.
func (s suite) concurrent(t *testing.T, evict bool) {
	const (
		sessions = 8
		readers  = 2
		events   = 3000
	)
	r := bigRetention
	if evict {
		r = eventlog.Retention{MaxEvents: 64, MaxBytes: 1 << 30}
	}
	st := s.store(t, r)
	ctx := t.Context()
	var wg sync.WaitGroup
	for i := range sessions {
		sid, key := fmt.Sprintf("sess-%d", i), fmt.Sprintf("stream-%d", i)
		mustSession(t, st, sid)
		mustStream(t, st, sid, key)
		kicks := make([]chan struct{}, readers)
		done := make(chan struct{}) // closed when the appender stops
		for j := range kicks {
			kicks[j] = make(chan struct{}, 1)
			wg.Go(func() { readAll(t, st, key, kicks[j], done, evict) })
		}
		wg.Go(func() {
			defer close(done)
			var seq uint64
			for n := 0; seq < events; n++ {
				batch := make([]eventlog.Event, min(n%4+1, events-int(seq)))
				for k := range batch {
					batch[k].Data = payload(key, seq+uint64(k)+1, 16)
				}
				last, err := st.Append(ctx, key, seq+uint64(len(batch)) == events, batch...)
				if err != nil {
					t.Errorf("Append(%q): %v", key, err)
					return
				}
				seq += uint64(len(batch))
				if last != seq {
					t.Errorf("Append(%q) = %d, want %d", key, last, seq)
					return
				}
				for _, k := range kicks {
					select {
					case k <- struct{}{}:
					default:
					}
				}
			}
		})
	}
	wg.Wait()
}

// readAll follows one stream until its terminal event, checking every batch.
func readAll(t *testing.T, st eventlog.Store, key string, kick, done <-chan struct{}, evict bool) {
	var (
		after   uint64
		buf     []eventlog.Event
		stopped bool
	)
	for {
		rec, evs, err := st.Read(t.Context(), key, after, 50, buf)
		if err != nil {
			t.Errorf("Read(%q, %d): %v", key, after, err)
			return
		}
		if len(evs) == 0 {
			if rec.Terminal && after >= rec.LastSeq {
				if after != rec.LastSeq {
					t.Errorf("reader of %q ended at %d, LastSeq %d", key, after, rec.LastSeq)
				}
				return
			}
			if stopped {
				t.Errorf("reader of %q stuck after %d: appender stopped, record %+v", key, after, rec)
				return
			}
			select {
			case <-kick:
			case <-done:
				stopped = true
			}
			continue
		}
		want := max(after+1, rec.FirstSeq)
		if !evict && want != after+1 {
			t.Errorf("Read(%q, %d): FirstSeq %d without eviction", key, after, rec.FirstSeq)
			return
		}
		for i, e := range evs {
			if e.Seq != want+uint64(i) || !bytes.HasPrefix(e.Data, payload(key, e.Seq, 0)) {
				t.Errorf("Read(%q, %d) with FirstSeq %d: event %d has seq %d data %.30q; seqs %v",
					key, after, rec.FirstSeq, i, e.Seq, e.Data, seqs(evs))
				return
			}
		}
		if last := evs[len(evs)-1].Seq; last > rec.LastSeq {
			t.Errorf("Read(%q): event %d beyond record LastSeq %d", key, last, rec.LastSeq)
			return
		}
		after = evs[len(evs)-1].Seq
		buf = evs
	}
}

// cancelled calls every method with a cancelled context: each must fail
// with the context's error (and so do nothing), never succeed as if the
// caller were still waiting.
func (s suite) cancelled(t *testing.T) {
	st := s.store(t, bigRetention)
	mustSession(t, st, "s1")
	mustStream(t, st, "s1", "k")
	appendN(t, st, "k", 2, 10)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	cases := []struct {
		name string
		op   func() error
	}{
		{"CreateSession", func() error { return st.CreateSession(ctx, fullSession("s2")) }},
		{"Session", func() error { _, err := st.Session(ctx, "s1"); return err }},
		{"UpdateSession", func() error { return st.UpdateSession(ctx, fullSession("s1")) }},
		{"CreateStream", func() error {
			return st.CreateStream(ctx, &eventlog.Stream{Key: "k2", Session: "s1", Generation: 1})
		}},
		{"Append", func() error {
			_, err := st.Append(ctx, "k", false, eventlog.Event{Data: payload("k", 3, 0)})
			return err
		}},
		{"Read", func() error { _, _, err := st.Read(ctx, "k", 0, 10, nil); return err }},
		{"Streams", func() error { _, err := st.Streams(ctx, "s1"); return err }},
		{"DeleteSession", func() error { return st.DeleteSession(ctx, "s1") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.op(); !errors.Is(err, context.Canceled) {
				t.Errorf("%s with cancelled context: %v, want context.Canceled", tc.name, err)
			}
		})
	}
}

// retainedReporter is implemented by stores that report what they retain
// across all sessions (for metrics); the Retained check runs for those.
type retainedReporter interface {
	Retained() (events, bytes int64)
}

// retained checks a store's totals of retained events and bytes through
// appends, an eviction and a deletion.
func (s suite) retained(t *testing.T) {
	st := s.store(t, eventlog.Retention{MaxEvents: 4, MaxBytes: 1 << 20})
	rr, ok := st.(retainedReporter)
	if !ok {
		t.Skip("the store does not report what it retains")
	}
	check := func(when string, events, bytes int64) {
		t.Helper()
		if e, b := rr.Retained(); e != events || b != bytes {
			t.Errorf("%s: Retained() = %d events, %d bytes; want %d, %d", when, e, b, events, bytes)
		}
	}
	check("empty", 0, 0)
	mustSession(t, st, "s1")
	mustSession(t, st, "s2")
	mustStream(t, st, "s1", "a")
	mustStream(t, st, "s2", "b")
	appendN(t, st, "a", 3, 10)
	appendN(t, st, "b", 2, 20)
	check("after appends", 5, 70)
	appendN(t, st, "a", 2, 10) // s1 holds 5 > 4: its oldest is evicted
	check("after an eviction", 6, 80)
	if err := st.DeleteSession(t.Context(), "s2"); err != nil {
		t.Fatal(err)
	}
	check("after a deletion", 4, 40)
}
