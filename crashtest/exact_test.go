package crashtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
)

// collect reads resp's events until the stream ends, or until stop returns
// true for an event (stop may be nil).
func collect(resp *http.Response, stop func(data int, ev sse.Event) bool) ([]sse.Event, error) {
	var evs []sse.Event
	data := 0
	err := scan(resp, func(ev sse.Event) bool {
		evs = append(evs, ev)
		if len(ev.Data) > 0 {
			data++
		}
		return stop == nil || !stop(data, ev)
	})
	return evs, err
}

// describe renders an event for comparisons: "id? type data".
func describe(evs []sse.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = fmt.Sprintf("id=%t %s %s", ev.ID != "", ev.Type, ev.Data)
	}
	return out
}

// TestCrashResumeExact: one session, one call, kill -9 at a chosen point,
// restart, resume with the last event ID the client chose. The resume must
// be exactly: the events after the cursor that the log holds (durable
// before the crash), then, if the response was not among them, the seal
// (reset backend_lost naming the request, then a -32001 error under its
// id), then a generation_changed reset, then the end of the stream. A
// second identical resume gets the same events. The session goes on: a new
// call works, under generation 2.
func TestCrashResumeExact(t *testing.T) {
	needBinary(t)
	tests := []struct {
		name        string
		count       int
		intervalMS  int
		read        int // data events read before the kill; -1: the whole stream
		resumeAfter int // resume after the ID of this data event (0: the priming event)
		completed   bool
		silent      bool // call test_reconnection, silent for 100 ms: its priming event goes out after its stream's record is synced (the relay's primeDelay), not with a first event
	}{
		{name: "lost after the priming event", count: 200, intervalMS: 20, read: 0, resumeAfter: 0},
		{name: "lost after 5 events", count: 200, intervalMS: 20, read: 5, resumeAfter: 5},
		{name: "lost, resumed from an earlier cursor", count: 200, intervalMS: 20, read: 8, resumeAfter: 3},
		{name: "completed before the crash, resumed before its end", count: 4, intervalMS: 0, read: -1, resumeAfter: 1, completed: true},
		{name: "silent call lost after its priming event", read: 0, resumeAfter: 0, silent: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			p := newRelay(t)
			codec := p.codec()
			sid, err := initialize(ctx, p.url())
			if err != nil {
				t.Fatal(err)
			}
			// The standalone stream: its priming event is the cursor.
			sresp, err := do(ctx, p.url(), http.MethodGet, sessionHeaders(sid, ""), "")
			if err != nil || sresp.StatusCode != http.StatusOK {
				t.Fatalf("standalone GET: %v %v", sresp, err)
			}
			prime, err := collect(sresp, func(_ int, ev sse.Event) bool { return ev.ID != "" })
			if err != nil || len(prime) != 1 {
				t.Fatalf("standalone priming event: %q %v", describe(prime), err)
			}
			standalone, err := codec.Parse(prime[0].ID)
			if err != nil || standalone.Generation != 1 {
				t.Fatalf("standalone cursor %+v %v", standalone, err)
			}

			const reqID = "c1"
			body := callBody(reqID, reqID, tt.count, tt.intervalMS)
			if tt.silent {
				body = `{"jsonrpc":"2.0","id":"` + reqID + `","method":"tools/call","params":{"name":"test_reconnection"}}`
			}
			resp, err := do(ctx, p.url(), http.MethodPost, sessionHeaders(sid, ""), body)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("POST: %v %v", resp, err)
			}
			before, err := collect(resp, func(data int, ev sse.Event) bool { return tt.read >= 0 && data >= tt.read && ev.ID != "" })
			if err != nil {
				t.Fatalf("reading the call before the crash: %v", err)
			}
			var cursor string
			seen := 0
			for _, ev := range before {
				if len(ev.Data) > 0 {
					seen++
				}
				if seen == tt.resumeAfter && ev.ID != "" {
					cursor = ev.ID
					break
				}
			}
			cur, err := codec.Parse(cursor)
			if err != nil || cur.Generation != 1 || cur.Seq != uint64(tt.resumeAfter) {
				t.Fatalf("cursor %q: %+v %v; want generation 1 seq %d", cursor, cur, err, tt.resumeAfter)
			}

			p.kill()
			resp.Body.Close()
			sresp.Body.Close()
			p.start()

			// The old standalone stream was sealed with generation_changed
			// (from the log, so with an ID); the resume then carries on live
			// on the session's new standalone stream.
			sresp, err = do(ctx, p.url(), http.MethodGet, sessionHeaders(sid, prime[0].ID), "")
			if err != nil || sresp.StatusCode != http.StatusOK {
				t.Fatalf("standalone resume: %v %v", sresp, err)
			}
			sevs, err := collect(sresp, func(int, sse.Event) bool { return true })
			sresp.Body.Close()
			var sr resetMsg
			if err != nil || len(sevs) != 1 || sevs[0].Type != "reset" || json.Unmarshal(sevs[0].Data, &sr) != nil ||
				sr.Reason != resume.ReasonGenerationChanged || sr.Stream != standalone.Stream.String() || sr.Generation != 1 {
				t.Errorf("standalone resume: %q %v, want a generation_changed reset of %s gen 1", describe(sevs), err, standalone.Stream)
			} else if c, err := codec.Parse(sevs[0].ID); err != nil || c.Stream != standalone.Stream || c.Generation != 1 || c.Seq != 1 {
				t.Errorf("standalone seal's ID: %+v %v, want seq 1 of the old standalone stream", c, err)
			}

			resumeOnce := func() []sse.Event {
				t.Helper()
				resp, err := do(ctx, p.url(), http.MethodGet, sessionHeaders(sid, cursor), "")
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("resume: %v %v", resp, err)
				}
				defer resp.Body.Close()
				evs, err := collect(resp, nil)
				if err != nil {
					t.Fatalf("resume did not end cleanly: %v after %q", err, describe(evs))
				}
				return evs
			}
			got := resumeOnce()
			if again := resumeOnce(); !slices.Equal(describe(again), describe(got)) || lastIDs(again) != lastIDs(got) {
				t.Errorf("a second identical resume differs:\n%q\nfirst:\n%q", describe(again), describe(got))
			}

			// Shape: replayed log events (with IDs, on the cursor's stream,
			// consecutive seqs), then the relay's own generation_changed.
			if len(got) < 2 {
				t.Fatalf("resume: %q", describe(got))
			}
			replay, last := got[:len(got)-1], got[len(got)-1]
			var lr resetMsg
			if last.Type != "reset" || last.ID != "" || json.Unmarshal(last.Data, &lr) != nil ||
				lr.Reason != resume.ReasonGenerationChanged || lr.Stream != cur.Stream.String() || lr.Generation != 1 {
				t.Errorf("last event %q, want a generation_changed reset of stream %s gen 1 without an id", describe([]sse.Event{last}), cur.Stream)
			}
			seq := cur.Seq
			var kinds []string
			for _, ev := range replay {
				c, err := codec.Parse(ev.ID)
				if err != nil || c.Stream != cur.Stream || c.Generation != 1 || c.Seq != seq+1 {
					t.Errorf("replayed event %q: cursor %+v %v, want stream %s gen 1 seq %d", ev.Data, c, err, cur.Stream, seq+1)
				}
				seq = c.Seq
				kinds = append(kinds, kind(t, ev, reqID))
			}
			var want []string
			if tt.completed {
				for i := tt.resumeAfter + 1; i <= tt.count; i++ {
					want = append(want, fmt.Sprintf("progress %d", i))
				}
				want = append(want, "result")
			} else {
				// How far the dead process logged is up to the crash;
				// what matters is that the progress is contiguous and the
				// seal follows.
				n := len(kinds) - 2
				if n < 0 || n+tt.resumeAfter < tt.read {
					t.Fatalf("replay %q: fewer events than the client saw before the crash", kinds)
				}
				for i := range n {
					want = append(want, fmt.Sprintf("progress %d", tt.resumeAfter+1+i))
				}
				want = append(want, "reset backend_lost ["+`"`+reqID+`"`+"]", "error -32001")
			}
			if !slices.Equal(kinds, want) {
				t.Errorf("replay\n%q\nwant\n%q", kinds, want)
			}
			for i, ev := range before {
				// What the client saw before the crash after its cursor is
				// replayed identically (the same IDs, the same data).
				if c, err := codec.Parse(ev.ID); err == nil && c.Seq > cur.Seq && len(ev.Data) > 0 {
					j := int(c.Seq - cur.Seq - 1)
					if j >= len(replay) || replay[j].ID != ev.ID || string(replay[j].Data) != string(ev.Data) {
						t.Errorf("event %d seen before the crash (%s %q) not replayed as is", i, ev.ID, ev.Data)
					}
				}
			}

			// The session goes on under generation 2, on a new stream.
			resp, err = do(ctx, p.url(), http.MethodPost, sessionHeaders(sid, ""), callBody("c2", "c2", 3, 0))
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("new call after the restart: %v %v", resp, err)
			}
			next, err := collect(resp, nil)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("new call: %v", err)
			}
			var nk []string
			for _, ev := range next {
				c, err := codec.Parse(ev.ID)
				if err != nil || c.Generation != 2 || c.Stream == cur.Stream {
					t.Errorf("new call's event %q: cursor %+v %v, want generation 2 on a new stream", ev.Data, c, err)
				}
				if len(ev.Data) > 0 {
					nk = append(nk, kind(t, ev, "c2"))
				}
			}
			if want := []string{"progress 1", "progress 2", "progress 3", "result"}; !slices.Equal(nk, want) {
				t.Errorf("new call: %q, want %q", nk, want)
			}

			// The log on disk agrees: the replay is exactly what it holds
			// after the cursor, and the session is at incarnation 2.
			p.kill()
			st := p.openStore()
			rec, err := st.Session(ctx, sid)
			if err != nil || rec.Incarnation != 2 {
				t.Errorf("session record %+v %v, want incarnation 2", rec, err)
			}
			srec, logged, err := st.Read(ctx, cur.Stream.String(), cur.Seq, 1<<20, nil)
			if err != nil || !srec.Terminal {
				t.Fatalf("old stream in the log: %+v %v, want terminal", srec, err)
			}
			if len(logged) != len(replay) {
				t.Fatalf("log holds %d events after the cursor, the resume replayed %d", len(logged), len(replay))
			}
			for i, e := range logged {
				if e.Type != replay[i].Type || string(e.Data) != string(replay[i].Data) || codec.ID(resume.Cursor{Stream: cur.Stream, Generation: 1, Seq: e.Seq}) != replay[i].ID {
					t.Errorf("log event %d (%d %s %q) differs from replayed %s %s %q", i, e.Seq, e.Type, e.Data, replay[i].ID, replay[i].Type, replay[i].Data)
				}
			}
		})
	}
}

// lastIDs joins the IDs of evs, to compare two resumes.
func lastIDs(evs []sse.Event) string {
	var s string
	for _, ev := range evs {
		s += ev.ID + ","
	}
	return s
}

// kind names a replayed event: "progress N", "result", "error CODE", or
// "reset REASON [lost ids]"; it fails the test on a message that does not
// belong to request reqID.
func kind(t *testing.T, ev sse.Event, reqID string) string {
	t.Helper()
	if ev.Type == "reset" {
		var r resetMsg
		if err := json.Unmarshal(ev.Data, &r); err != nil {
			t.Errorf("reset %q: %v", ev.Data, err)
		}
		lost, _ := json.Marshal(r.Lost)
		return "reset " + string(r.Reason) + " " + string(lost)
	}
	m, err := mcptest.DecodeMessage(ev.Data)
	if err != nil {
		t.Errorf("message %q: %v", ev.Data, err)
		return "?"
	}
	switch {
	case m.Method == "notifications/progress" && m.Params.ProgressToken == reqID:
		return fmt.Sprintf("progress %v", m.Params.Progress)
	case m.HasID(reqID) && m.Result != nil:
		return "result"
	case m.HasID(reqID) && m.Error != nil:
		return fmt.Sprintf("error %d", m.Error.Code)
	}
	t.Errorf("message %q does not belong to request %s", ev.Data, reqID)
	return "?"
}
