package redisstore_test

import (
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
)

// TestIdleIndexDropsVanishedSessions: a session whose record is gone but
// whose entry in the index of last uses stayed (its process died between
// the two deletions) is not listed idle, and its entry is dropped.
func TestIdleIndexDropsVanishedSessions(t *testing.T) {
	srv := redistest.Start(t)
	prefix := freshPrefix()
	st := open(t, srv, redisstore.Options{Prefix: prefix})
	ctx := t.Context()
	old := time.Now().Add(-time.Hour)
	for _, id := range []string{"kept", "vanished"} {
		if err := st.CreateSession(ctx, &eventlog.Session{ID: id, Incarnation: 1, Created: old}); err != nil {
			t.Fatal(err)
		}
	}
	a := admin(t, srv)
	if err := a.Do(ctx, a.B().Del().Key(prefix+":{vanished}:s").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	ids, err := st.IdleSessions(ctx, time.Now(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != "kept" {
		t.Errorf("IdleSessions = %q, want [kept]", ids)
	}
	members, err := a.Do(ctx, a.B().Zrange().Key(prefix+":used").Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 1 || members[0] != "kept" {
		t.Errorf("the index holds %q after the listing, want [kept]", members)
	}
}
