package redisstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
)

// hashTag is the part of key Redis Cluster hashes: between the first '{'
// and the next '}', if not empty; else the whole key.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}

func keysUnder(t *testing.T, adm rueidis.Client, pattern string) []string {
	t.Helper()
	keys, err := adm.Do(t.Context(), adm.B().Keys().Pattern(pattern).Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestKeyLayout: every key of a session is in the session's hash slot but
// the stream index; a terminal stream's index entry expires by itself; the
// lease has no TTL of its own, the Store's one heartbeat key has one;
// DeleteSession leaves no key of the session behind.
func TestKeyLayout(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	const prefix = "lay"
	st := open(t, srv, redisstore.Options{Prefix: prefix, Retention: eventlog.Retention{MaxEvents: 3}})
	ctx := t.Context()
	sid := "sess}{odd"
	if _, err := st.AcquireLease(ctx, sid, "http://a", time.Minute); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, st, sid, "open")
	if err := st.CreateStream(ctx, &eventlog.Stream{Key: "done", Session: sid, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	appendData(t, st, "open", "1", "2", "3", "4")
	if _, err := st.Append(ctx, "done", true, eventlog.Event{Data: []byte("end")}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, st, "other", "o")
	wantTag := hashTag(prefix + ":{" + sid + "}:s")
	var inSlot int
	var beats []string
	for _, k := range keysUnder(t, adm, prefix+":*") {
		switch {
		case strings.HasPrefix(k, prefix+":x:"):
			continue
		case strings.HasPrefix(k, prefix+":h:"):
			beats = append(beats, k)
			continue
		case strings.Contains(k, "{other}"):
			if hashTag(k) != "other" {
				t.Errorf("key %q of session other hashes on %q", k, hashTag(k))
			}
		default:
			inSlot++
			if hashTag(k) != wantTag {
				t.Errorf("key %q hashes on %q, want the session's %q", k, hashTag(k), wantTag)
			}
		}
	}
	// s, k, o, x, f, l, and m: and e: for each of the two streams.
	if inSlot != 10 {
		t.Errorf("session %q has %d keys, want 10", sid, inSlot)
	}
	if len(beats) != 1 {
		t.Fatalf("heartbeat keys %q, want the Store's one", beats)
	}
	if ttl, err := adm.Do(ctx, adm.B().Pttl().Key(beats[0]).Build()).AsInt64(); err != nil || ttl <= 0 {
		t.Errorf("heartbeat %s: PTTL %d, %v; want a TTL", beats[0], ttl, err)
	}
	lk := prefix + ":{" + sid + "}:l"
	if ttl, err := adm.Do(ctx, adm.B().Pttl().Key(lk).Build()).AsInt64(); err != nil || ttl != -1 {
		t.Errorf("lease: PTTL %d, %v; want none (-1): it lives while its owner's heartbeat does", ttl, err)
	}
	ttl, err := adm.Do(ctx, adm.B().Pttl().Key(prefix+":x:done").Build()).AsInt64()
	if err != nil || ttl <= 0 {
		t.Errorf("index entry of the terminal stream: PTTL %d, %v; want a TTL", ttl, err)
	}
	ttl, err = adm.Do(ctx, adm.B().Pttl().Key(prefix+":x:open").Build()).AsInt64()
	if err != nil || ttl != -1 {
		t.Errorf("index entry of the open stream: PTTL %d, %v; want none (-1)", ttl, err)
	}
	if err := st.DeleteSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, k := range keysUnder(t, adm, prefix+":*") {
		if !strings.Contains(k, "{other}") && k != prefix+":x:o" && k != beats[0] {
			left = append(left, k)
		}
	}
	if len(left) != 0 {
		t.Errorf("DeleteSession left %q", left)
	}
	if _, _, err := st.Read(ctx, "o", 0, 1, nil); err != nil {
		t.Errorf("the other session's stream: %v", err)
	}
}

// TestIndexRepairAndStaleCache: an index entry left without its stream
// (a crash between a deletion and its index cleanup) does not block the
// key; a Store whose cached session of a key went stale finds the key's
// new session.
func TestIndexRepairAndStaleCache(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	a, b := pair(t, srv)
	ctx := t.Context()
	mustCreate(t, a, "s1", "k")
	appendData(t, a, "k", "old")
	prefix := ""
	for _, k := range keysUnder(t, adm, "*:x:k") {
		prefix = strings.TrimSuffix(k, ":x:k")
	}
	if prefix == "" {
		t.Fatal("no index entry for k")
	}
	if err := adm.Do(ctx, adm.B().Set().Key(prefix+":x:ghost").Value("gone-session").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateStream(ctx, &eventlog.Stream{Key: "ghost", Session: "s1", Generation: 1}); err != nil {
		t.Errorf("CreateStream over a stale index entry: %v", err)
	}
	// b deletes s1 and creates k again in s2; a has s1 cached for k.
	if err := b.DeleteSession(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateSession(ctx, &eventlog.Session{ID: "s2", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateStream(ctx, &eventlog.Stream{Key: "k", Session: "s2", Generation: 1}); err != nil {
		t.Fatal(err)
	}
	appendData(t, b, "k", "new")
	rec, evs, err := a.Read(ctx, "k", 0, 10, nil)
	if err != nil || rec.Session != "s2" || len(evs) != 1 || string(evs[0].Data) != "new" {
		t.Fatalf("Read through a stale cache = %+v, %v, %v; want s2's event", rec, evs, err)
	}
	if last, err := a.Append(ctx, "k", false, eventlog.Event{Data: []byte("more")}); err != nil || last != 2 {
		t.Errorf("Append through the refreshed cache = %d, %v; want 2", last, err)
	}
}

// TestListeningBesideTheRecord: eventlog.Session.Listening is kept in the
// session hash's field L, not in the encoded record r, so that r keeps the
// format replicas of an earlier version decode (theirs refuses bytes it
// does not know): during a rolling upgrade they still read every session.
func TestListeningBesideTheRecord(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	const prefix = "listen"
	st := open(t, srv, redisstore.Options{Prefix: prefix})
	ctx := t.Context()
	at := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	deaf := &eventlog.Session{ID: "deaf", Principal: "p", ProtocolVersion: "2025-06-18", Incarnation: 1, Created: at, LastUsed: at}
	listening := *deaf
	listening.ID, listening.Listening = "listening", true
	for _, s := range []*eventlog.Session{deaf, &listening} {
		if err := st.CreateSession(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	field := func(id, f string) (string, bool) {
		v, err := adm.Do(ctx, adm.B().Hget().Key(prefix+":{"+id+"}:s").Field(f).Build()).ToString()
		if rueidis.IsRedisNil(err) {
			return "", false
		}
		if err != nil {
			t.Fatal(err)
		}
		return v, true
	}
	r1, _ := field("deaf", "r")
	r2, _ := field("listening", "r")
	if r1 != r2 {
		t.Errorf("the record of a listening session differs from the same session's that does not listen:\n%x\n%x", r2, r1)
	}
	if _, ok := field("deaf", "L"); ok {
		t.Error("a session that does not listen has field L")
	}
	if v, ok := field("listening", "L"); v != "1" || !ok {
		t.Errorf("field L of a listening session: %q, %v; want \"1\"", v, ok)
	}
	for _, s := range []*eventlog.Session{deaf, &listening} {
		got, err := st.Session(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Listening != s.Listening {
			t.Errorf("session %s: Listening %v, want %v", s.ID, got.Listening, s.Listening)
		}
	}
}
