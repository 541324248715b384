package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
)

// TestBackendRestartMidStream restarts the in-process backend while a call
// streams: the in-flight request gets the reset signal and a JSON-RPC error
// with its id (never a hang: never-event 5 of docs/design.md); the session goes on under a
// new generation; an old-generation cursor replays to the seal, then
// resets; no event ID ever repeats (never-event 4).
func TestBackendRestartMidStream(t *testing.T) {
	e := newEnv(t, relay.Options{Secret: testSecret})
	c := codec(t)
	s := e.initialize("2025-11-25", "")
	seen := map[string]bool{}
	note := func(evs []sse.Event) {
		t.Helper()
		for _, ev := range evs {
			if ev.ID == "" {
				continue
			}
			if seen[ev.ID] && (ev.Data == nil || len(ev.Data) > 0) {
				t.Fatalf("event ID %s delivered twice as new", ev.ID)
			}
			seen[ev.ID] = true
		}
	}

	id, resp := s.call(1000, 20, true)
	first, _ := events(t, resp, 2, 5*time.Second)
	note(first)
	e.backend.Restart()

	rest, ended := events(t, resp, 0, 10*time.Second)
	if !ended {
		t.Fatal("in-flight call hung after the backend restart")
	}
	if r := resets(t, rest); len(r) != 1 || r[0] != resume.ReasonBackendLost {
		t.Fatalf("resets %v, want [backend_lost]", r)
	}
	last := mcptest.Decode(t, dataEvents(rest)[len(dataEvents(rest))-1].Data)
	if last.Error == nil || last.Error.Code != resume.CodeRequestLost || string(last.ID) != fmt.Sprint(id) {
		t.Fatalf("want a request-lost error for id %d, got %s", id, dataEvents(rest)[len(dataEvents(rest))-1].Data)
	}
	note(rest)

	// The session survives: a new call works, under generation 2.
	evs := completedCall(t, s, 3)
	note(evs)
	cur, err := c.Parse(evs[0].ID)
	if err != nil || cur.Generation != 2 {
		t.Fatalf("new call's generation: %+v %v", cur, err)
	}

	// An old-generation cursor: what the log holds to the seal, then a
	// generation_changed reset, then the end.
	resp = s.get(first[1].ID)
	if resp.StatusCode != 200 {
		t.Fatalf("old-generation resume: %s", resp.Status)
	}
	old, ended := events(t, resp, 0, 5*time.Second)
	if !ended {
		t.Fatal("old-generation resume did not end")
	}
	// Exactly what the client had after its cursor (the second progress
	// notification on, the backend_lost reset, the lost error), then the
	// generation_changed reset.
	d := dataEvents(old)
	if len(d) == 0 || d[len(d)-1].Type != resume.EventReset || resets(t, d[len(d)-1:])[0] != resume.ReasonGenerationChanged {
		t.Fatalf("old-generation resume does not end with a generation_changed reset: %+v", old)
	}
	checkReplay(t, "old-generation resume", d[:len(d)-1], append(dataEvents(first)[1:], rest...))
	if n := e.relay.Counts()["reincarnation"]; n != 1 {
		t.Fatalf("reincarnations %d, want 1", n)
	}
}

// TestBackendRestartWhileIdle: the backend forgets the session while the
// client is away; the client's next request still works (re-created
// transparently, nothing was in flight).
func TestBackendRestartWhileIdle(t *testing.T) {
	e := newEnv(t, relay.Options{})
	s := e.initialize("2025-06-18", "")
	completedCall(t, s, 1)
	e.backend.Restart()
	completedCall(t, s, 2)
}
