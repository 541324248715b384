package relay_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mcprelay/mcprelay/internal/mcptest"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestBackendPollingIsCarriedToTheClient: the backend closes its request
// stream mid-call with retry (2025-11-25 polling). The relay resumes the
// backend's stream itself, closes the client's stream with retry too, and
// the client's GET resume delivers the result. Regression: the poll request
// used to stick to the stream, so every resume was closed at once and the
// result never arrived.
func TestBackendPollingIsCarriedToTheClient(t *testing.T) {
	e := newEnv(t, relay.Options{})
	s := e.initialize("2025-11-25", "")
	// The close reaches the client only if its connection is attached when
	// the backend closes; on a loaded machine it may attach later and just
	// get the result. Try a few times for the interesting case.
	var first []sse.Event
	for try := 0; ; try++ {
		resp := s.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"poll","arguments":{},"_meta":{"progressToken":"t"}}}`, try))
		evs, ended := events(t, resp, 0, 5*time.Second)
		if !ended {
			t.Fatal("the client's stream neither ended nor closed")
		}
		if evs[len(evs)-1].Retry > 0 {
			first = evs
			break
		}
		if try == 10 {
			t.Fatalf("the backend's close never reached the client: %+v", evs)
		}
	}
	for _, ev := range dataEvents(first) {
		if mcptest.Decode(t, ev.Data).Result != nil {
			t.Fatal("the result came before the close")
		}
	}
	resp := s.get(lastID(first))
	rest, ended := events(t, resp, 0, 5*time.Second)
	if !ended {
		t.Fatal("resumed stream did not end")
	}
	data := dataEvents(rest)
	if len(data) == 0 {
		t.Fatalf("resume delivered nothing: %+v", rest)
	}
	if m := mcptest.Decode(t, data[len(data)-1].Data); m.Result == nil || m.Result.Content[0].Text != "polled" {
		t.Fatalf("resume did not deliver the result: %s", data[len(data)-1].Data)
	}
}

// TestRelayPollInterval: with PollInterval set, the relay itself closes
// long streams of 2025-11-25 clients with retry, exactly PollInterval after
// each connection opened; resuming continues them without loss. In a
// synctest bubble, so the count is exact: 20 events 20 ms apart answer at
// 400 ms, and a 33 ms interval (no multiple of 20 below 660) closes the
// stream 12 times before that.
func TestRelayPollInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const poll = 33 * time.Millisecond
		e := newBubbleEnv(t, relay.Options{PollInterval: poll})
		s := e.initialize("2025-11-25", "")
		start := time.Now()
		_, resp := s.call(20, 20, true)
		var all []float64
		cursor := ""
		polls := 0
		for {
			opened := time.Now()
			evs, ended := events(t, resp, 0, time.Hour)
			if !ended {
				t.Fatal("stream neither ended nor was closed for polling")
			}
			all = append(all, progressOf(t, evs)...)
			if id := lastID(evs); id != "" {
				cursor = id
			}
			if d := dataEvents(evs); len(d) > 0 && mcptest.Decode(t, d[len(d)-1].Data).Result != nil {
				break
			}
			if got := time.Since(opened); got != poll {
				t.Fatalf("connection %d closed %v after it opened, want the poll interval %v", polls+1, got, poll)
			}
			if evs[len(evs)-1].Retry != poll {
				t.Fatalf("closed without retry %v: %+v", poll, evs[len(evs)-1])
			}
			polls++
			resp = s.get(cursor)
		}
		if got := time.Since(start); got != 400*time.Millisecond {
			t.Errorf("the result came after %v, want 400ms", got)
		}
		if polls != 12 {
			t.Errorf("the stream was closed for polling %d times, want 12", polls)
		}
		if len(all) != 20 {
			t.Fatalf("progress across polls: %v", all)
		}
		for i, p := range all {
			if p != float64(i+1) {
				t.Fatalf("progress out of order or repeated: %v", all)
			}
		}
	})
}

// TestTerminalGrace: a finished request stream can be resumed (replayed to
// its end) until TerminalGrace has passed since its terminal event, and not
// a nanosecond longer: then the session no longer knows the stream (row 5,
// a reset unknown_stream, then the end).
func TestTerminalGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const grace = time.Minute
		st := eventlog.NewMemory(eventlog.Retention{TerminalGrace: grace})
		t.Cleanup(func() { st.Close() })
		e := newBubbleEnv(t, relay.Options{Store: st})
		s := e.initialize("2025-11-25", "")
		_, resp := s.call(3, 0, true)
		evs, ended := events(t, resp, 0, time.Hour)
		data := dataEvents(evs)
		if !ended || len(data) != 4 {
			t.Fatalf("the call's stream: ended %v, %d data events, want 4", ended, len(data))
		}
		time.Sleep(grace - time.Nanosecond)
		replay, ended := events(t, s.get(data[0].ID), 0, time.Hour)
		if !ended || len(resets(t, replay)) != 0 || len(dataEvents(replay)) != 3 {
			t.Fatalf("resume just inside the grace: ended %v, resets %v, %d data events; want the 3 events after the cursor", ended, resets(t, replay), len(dataEvents(replay)))
		}
		for i, ev := range dataEvents(replay) {
			if ev.ID != data[i+1].ID || string(ev.Data) != string(data[i+1].Data) {
				t.Fatalf("replayed event %d: %s %s, want %s %s", i, ev.ID, ev.Data, data[i+1].ID, data[i+1].Data)
			}
		}
		time.Sleep(time.Nanosecond)
		after, ended := events(t, s.get(data[0].ID), 0, time.Hour)
		if got := resets(t, after); !ended || len(dataEvents(after)) != 1 || len(got) != 1 || got[0] != resume.ReasonUnknownStream {
			t.Fatalf("resume when the grace ends: ended %v, resets %v, %d data events; want one unknown_stream reset, then the end", ended, got, len(dataEvents(after)))
		}
	})
}

// failFirstResume answers the first GET with Last-Event-ID with 503, as a
// backend restarting behind a load balancer might.
type failFirstResume struct {
	h      http.Handler
	failed atomic.Bool
}

func (f *failFirstResume) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") != "" && f.failed.CompareAndSwap(false, true) {
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	f.h.ServeHTTP(w, r)
}

// TestBackendResumeRetried: when the relay's first attempt to resume a
// backend stream fails, it tries again with the same cursor instead of
// declaring the request lost. Regression: a failed attempt made the relay
// forget the backend's cursor, so the request was reported lost.
func TestBackendResumeRetried(t *testing.T) {
	be := mcptest.NewRestartable(func() http.Handler {
		return backend.SDKHandler(testServer(nil), &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	})
	t.Cleanup(func() { be.Stop() })
	ff := &failFirstResume{h: be}
	up := backend.Handler(ff)
	e := newEnv(t, relay.Options{Backend: up})
	s := e.initialize("2025-11-25", "")
	resp := s.post(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"poll","arguments":{}}}`)
	evs, ended := events(t, resp, 0, 10*time.Second)
	for try := 0; !ended || len(dataEvents(evs)) == 0 || mcptest.Decode(t, dataEvents(evs)[len(dataEvents(evs))-1].Data).ID == nil; try++ {
		if try == 20 {
			t.Fatalf("no answer: %+v", evs)
		}
		resp = s.get(lastID(evs))
		evs, ended = events(t, resp, 0, 10*time.Second)
	}
	last := mcptest.Decode(t, dataEvents(evs)[len(dataEvents(evs))-1].Data)
	if last.Result == nil || last.Result.Content[0].Text != "polled" {
		t.Fatalf("want the result after a failed backend resume, got %s", dataEvents(evs)[len(dataEvents(evs))-1].Data)
	}
	if !ff.failed.Load() {
		t.Fatal("the backend was never asked to resume: the test proves nothing")
	}
}
