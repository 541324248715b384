package relay_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

func codec(t *testing.T) *resume.Codec {
	c, err := resume.NewCodec(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// completedCall runs a call of n progress events to its end and returns
// its events (priming first).
func completedCall(t *testing.T, s *rawSession, n int) []sse.Event {
	t.Helper()
	_, resp := s.call(n, 0, true)
	evs, ended := events(t, resp, 0, 10*time.Second)
	if !ended || len(dataEvents(evs)) != n+1 {
		t.Fatalf("call did not complete: ended=%v events=%d", ended, len(evs))
	}
	return evs
}

// checkReplay fails the test unless got are exactly the events of want that
// carry data (ID, type and data alike, in order): a faithful replay.
func checkReplay(t *testing.T, what string, got, want []sse.Event) {
	t.Helper()
	want = dataEvents(want)
	got = dataEvents(got)
	for i := range max(len(got), len(want)) {
		switch {
		case i >= len(got):
			t.Fatalf("%s: %d events, want %d; missing %s %s %s", what, len(got), len(want), want[i].ID, want[i].Type, want[i].Data)
		case i >= len(want):
			t.Fatalf("%s: %d events, want %d; extra %s %s %s", what, len(got), len(want), got[i].ID, got[i].Type, got[i].Data)
		case got[i].ID != want[i].ID || got[i].Type != want[i].Type || string(got[i].Data) != string(want[i].Data):
			t.Fatalf("%s: event %d is %s %s %s, want %s %s %s", what, i, got[i].ID, got[i].Type, got[i].Data, want[i].ID, want[i].Type, want[i].Data)
		}
	}
}

func progressOf(t *testing.T, evs []sse.Event) []float64 {
	var out []float64
	for _, ev := range dataEvents(evs) {
		if ev.Type != "" {
			continue
		}
		if m := mcptest.Decode(t, ev.Data); m.Method == "notifications/progress" {
			out = append(out, m.Params.Progress)
		}
	}
	return out
}

func resets(t *testing.T, evs []sse.Event) []resume.Reason {
	var out []resume.Reason
	for _, ev := range evs {
		if ev.Type == resume.EventReset {
			var d resume.Reset
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatalf("reset data %q: %v", ev.Data, err)
			}
			out = append(out, d.Reason)
		}
	}
	return out
}

// TestResumeTable exercises every row of the decision table (docs/design.md) over HTTP.
func TestResumeTable(t *testing.T) {
	e := newEnv(t, relay.Options{Secret: testSecret})
	c := codec(t)

	t.Run("row1_no_session_header", func(t *testing.T) {
		s := e.initialize("2025-11-25", "")
		evs := completedCall(t, s, 2)
		resp := e.do("GET", map[string]string{"Last-Event-ID": evs[1].ID}, "")
		if resp.StatusCode != 400 {
			t.Fatalf("got %s", resp.Status)
		}
	})
	t.Run("row2_unknown_session", func(t *testing.T) {
		s := e.initialize("2025-11-25", "")
		evs := completedCall(t, s, 2)
		for name, hdr := range map[string]map[string]string{
			"made_up":         {"Mcp-Session-Id": "no-such-session", "Last-Event-ID": evs[1].ID},
			"other_principal": {"Mcp-Session-Id": s.id, "Authorization": "Bearer someone-else", "Last-Event-ID": evs[1].ID},
			"garbage_cursor":  {"Mcp-Session-Id": "no-such-session", "Last-Event-ID": "garbage"},
		} {
			if resp := e.do("GET", hdr, ""); resp.StatusCode != 404 {
				t.Errorf("%s: got %s, want 404", name, resp.Status)
			}
		}
	})
	t.Run("row2_deleted_session", func(t *testing.T) {
		s := e.initialize("2025-11-25", "")
		evs := completedCall(t, s, 2)
		if resp := e.do("DELETE", s.headers(), ""); resp.StatusCode/100 != 2 {
			t.Fatalf("DELETE: %s", resp.Status)
		}
		if resp := s.get(evs[1].ID); resp.StatusCode != 404 {
			t.Fatalf("resume after DELETE: %s, want 404", resp.Status)
		}
		if resp := s.post(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`); resp.StatusCode != 404 {
			t.Fatalf("POST after DELETE: %s, want 404", resp.Status)
		}
	})
	t.Run("row3_malformed_forged_future", func(t *testing.T) {
		s := e.initialize("2025-11-25", "")
		evs := completedCall(t, s, 2)
		cur, err := c.Parse(evs[1].ID)
		if err != nil {
			t.Fatal(err)
		}
		other, _ := resume.NewCodec([]byte("another relay's secret, 32 bytes!"))
		future := cur
		future.Seq += 100
		for name, id := range map[string]string{
			"garbage":    "garbage",
			"bare_int":   "4471",
			"truncated":  evs[1].ID[:len(evs[1].ID)-3],
			"forged":     other.ID(cur),
			"future_gen": c.ID(resume.Cursor{Stream: cur.Stream, Generation: cur.Generation + 1, Seq: 1}),
		} {
			resp := s.get(id)
			if resp.StatusCode != 400 {
				t.Errorf("%s: got %s, want 400", name, resp.Status)
			}
		}
		// A genuine cursor ahead of what the log holds (delivered, then
		// lost in a crash) is never a 400: a gap reset, then the end of
		// the finished stream.
		resp := s.get(c.ID(future))
		if resp.StatusCode != 200 {
			t.Fatalf("ahead of the log: got %s, want 200", resp.Status)
		}
		got, ended := events(t, resp, 0, 5*time.Second)
		if r := resets(t, got); !ended || len(got) != 1 || len(r) != 1 || r[0] != resume.ReasonGap {
			t.Fatalf("ahead of the log: want one gap reset and the end, got %+v (ended %v)", got, ended)
		}
	})
	t.Run("row5_unknown_stream", func(t *testing.T) {
		s := e.initialize("2025-11-25", "")
		id := c.ID(resume.Cursor{Stream: resume.NewStreamKey(), Generation: 1, Seq: 3})
		resp := s.get(id)
		if resp.StatusCode != 200 {
			t.Fatalf("got %s", resp.Status)
		}
		evs, ended := events(t, resp, 0, 5*time.Second)
		if !ended || len(evs) != 1 || resets(t, evs)[0] != resume.ReasonUnknownStream {
			t.Fatalf("want one unknown_stream reset then the end, got ended=%v %+v", ended, evs)
		}
	})
	t.Run("row8_after_terminal_204", func(t *testing.T) {
		s := e.initialize("2025-11-25", "")
		evs := completedCall(t, s, 3)
		if resp := s.get(lastID(evs)); resp.StatusCode != 204 {
			t.Fatalf("got %s, want 204", resp.Status)
		}
	})
	t.Run("row9_before_terminal_replays_to_end", func(t *testing.T) {
		s := e.initialize("2025-11-25", "")
		evs := completedCall(t, s, 5)
		resp := s.get(evs[2].ID) // after progress 2
		got, ended := events(t, resp, 0, 5*time.Second)
		if !ended {
			t.Fatal("replay of a finished stream did not end")
		}
		if p := progressOf(t, got); fmt.Sprint(p) != "[3 4 5]" {
			t.Fatalf("replayed progress %v, want [3 4 5]", p)
		}
		last := mcptest.Decode(t, dataEvents(got)[len(dataEvents(got))-1].Data)
		if last.Result == nil {
			t.Fatal("replay did not end with the response")
		}
		for i, ev := range dataEvents(got) {
			if ev.ID != dataEvents(evs)[i+2].ID {
				t.Fatalf("replayed event %d has ID %s, originally %s", i, ev.ID, dataEvents(evs)[i+2].ID)
			}
		}
	})
	t.Run("row10_live_resume", func(t *testing.T) {
		s := e.initialize("2025-11-25", "")
		_, resp := s.call(10, 30, true)
		first, _ := events(t, resp, 3, 5*time.Second)
		resp.Body.Close()
		if p := progressOf(t, first); fmt.Sprint(p) != "[1 2 3]" {
			t.Fatalf("first part %v", p)
		}
		resp = s.get(lastID(first))
		if resp.StatusCode != 200 {
			t.Fatalf("resume: %s", resp.Status)
		}
		rest, ended := events(t, resp, 0, 10*time.Second)
		if !ended {
			t.Fatal("resumed stream did not end after the response")
		}
		if p := progressOf(t, rest); fmt.Sprint(p) != "[4 5 6 7 8 9 10]" {
			t.Fatalf("resumed progress %v, want exactly [4 5 6 7 8 9 10]", p)
		}
		if len(resets(t, rest)) != 0 {
			t.Fatalf("unexpected reset: %+v", rest)
		}
	})
}

func TestLastEventIDOnPOSTIs400(t *testing.T) {
	e := newEnv(t, relay.Options{})
	s := e.initialize("2025-11-25", "")
	h := s.headers()
	h["Last-Event-ID"] = "x"
	if resp := e.do("POST", h, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); resp.StatusCode != 400 {
		t.Fatalf("got %s", resp.Status)
	}
}

// TestEvictionGivesGapReset: with a tiny per-session retention, a client
// that falls behind gets an explicit gap reset, then what is retained.
func TestEvictionGivesGapReset(t *testing.T) {
	e := newEnv(t, relay.Options{Store: eventlog.NewMemory(eventlog.Retention{MaxEvents: 5})})
	s := e.initialize("2025-11-25", "")
	_, resp := s.call(30, 0, true)
	first, _ := events(t, resp, 2, 5*time.Second)
	resp.Body.Close()
	// Let the call finish in the log.
	time.Sleep(200 * time.Millisecond)
	// Resume from the priming event: whatever this reader saw of the fast
	// call (it may have been outrun already), the events after seq 0 are
	// evicted by now.
	if first[0].ID == "" || len(first[0].Data) != 0 {
		t.Fatalf("first event is not the priming event: %+v", first[0])
	}
	resp = s.get(first[0].ID)
	if resp.StatusCode != 200 {
		t.Fatalf("resume: %s", resp.Status)
	}
	got, ended := events(t, resp, 0, 5*time.Second)
	if !ended {
		t.Fatal("did not end")
	}
	if len(got) == 0 || got[0].Type != "reset" || resets(t, got)[0] != resume.ReasonGap {
		t.Fatalf("want a gap reset first, got %+v", got)
	}
	p := progressOf(t, got)
	if len(p) > 0 && p[0] <= 3 {
		t.Fatalf("retained events start at %v: nothing should have been evicted?", p)
	}
	if m := mcptest.Decode(t, dataEvents(got)[len(dataEvents(got))-1].Data); m.Result == nil {
		t.Fatal("the response did not survive eviction")
	}
}

// TestCrossSessionCursorsAre409 runs two tenants' sessions at once and has
// each present the other's cursors: every attempt is a 409 and carries
// nothing of the other's stream (never-event 1 of docs/design.md).
func TestCrossSessionCursorsAre409(t *testing.T) {
	e := newEnv(t, relay.Options{})
	a := e.initialize("2025-11-25", "Bearer tenant-a")
	b := e.initialize("2025-11-25", "Bearer tenant-b")
	var wg sync.WaitGroup
	ids := make([][]string, 2)
	for i, s := range []*rawSession{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, resp := s.call(40, 2, true)
			evs, _ := events(t, resp, 0, 20*time.Second)
			for _, ev := range evs {
				if ev.ID != "" {
					ids[i] = append(ids[i], ev.ID)
				}
			}
		}()
	}
	wg.Wait()
	if len(ids[0]) < 40 || len(ids[1]) < 40 {
		t.Fatalf("streams too short: %d %d", len(ids[0]), len(ids[1]))
	}
	var mu sync.Mutex
	for i, s := range []*rawSession{a, b} {
		for _, id := range ids[1-i] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp := s.get(id)
				txt := readBody(t, resp)
				mu.Lock()
				defer mu.Unlock()
				if resp.StatusCode != http.StatusConflict {
					t.Errorf("foreign cursor: got %s, want 409", resp.Status)
				}
				if strings.Contains(txt, "progress") || strings.Contains(txt, "counted") {
					t.Errorf("foreign cursor leaked data: %s", txt)
				}
			}()
		}
	}
	wg.Wait()
	if n := e.relay.Counts()["resume/409/foreign_stream"]; n != int64(len(ids[0])+len(ids[1])) {
		t.Fatalf("tenant-isolation counter %d, want %d", n, len(ids[0])+len(ids[1]))
	}
}

// TestTakeover: a second connection resuming a stream that still looks
// connected takes it over; the first one is closed.
func TestTakeover(t *testing.T) {
	e := newEnv(t, relay.Options{})
	s := e.initialize("2025-11-25", "")
	_, resp := s.call(200, 20, true)
	first, _ := events(t, resp, 2, 5*time.Second)
	// resp is still open: the relay believes the first connection is live.
	second := s.get(lastID(first))
	if second.StatusCode != 200 {
		t.Fatalf("takeover: %s", second.Status)
	}
	if _, ended := events(t, resp, 0, 5*time.Second); !ended {
		t.Fatal("the old connection was not closed by the takeover")
	}
	got, _ := events(t, second, 2, 5*time.Second)
	if p := progressOf(t, got); len(p) < 2 || p[0] != 3 {
		t.Fatalf("takeover continues at %v, want from 3", p)
	}
}
