package relay_test

import (
	"context"
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
// the POST stream of a 2025-11-25 client's long call with retry, once,
// exactly PollInterval after it opened; the GET that resumes it is not
// closed for polling and delivers the rest and the result, without loss.
// Regression: the resumed GET was closed again after each interval, and a
// client that resumes a stream once (the conformance suite's
// server-sse-polling) never got the result. In a synctest bubble, so
// timing is exact: 20 events 20 ms apart answer at 400 ms.
func TestRelayPollInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const poll = 33 * time.Millisecond
		e := newBubbleEnv(t, relay.Options{PollInterval: poll})
		s := e.initialize("2025-11-25", "")
		start := time.Now()
		_, resp := s.call(20, 20, true)
		first, ended := events(t, resp, 0, time.Hour)
		if !ended {
			t.Fatal("the POST stream neither ended nor was closed for polling")
		}
		if got := time.Since(start); got != poll {
			t.Fatalf("the POST stream closed %v after it opened, want the poll interval %v", got, poll)
		}
		if len(first) == 0 || first[0].ID == "" || len(first[0].Data) != 0 {
			t.Fatalf("the POST stream did not start with a priming event: %+v", first)
		}
		if last := first[len(first)-1]; last.Retry != poll || last.ID == "" {
			t.Fatalf("the POST stream did not end with retry %v and an id: %+v", poll, last)
		}
		rest, ended := events(t, s.get(lastID(first)), 0, time.Hour)
		if !ended {
			t.Fatal("the resumed stream did not end")
		}
		for _, ev := range rest {
			if ev.Retry > 0 {
				t.Fatalf("the resumed request stream was closed for polling again: %+v", rest)
			}
		}
		data := dataEvents(rest)
		if len(data) == 0 || mcptest.Decode(t, data[len(data)-1].Data).Result == nil {
			t.Fatalf("the resumed stream did not end with the result: %+v", rest)
		}
		if got := time.Since(start); got != 400*time.Millisecond {
			t.Errorf("the result came after %v, want 400ms", got)
		}
		all := append(progressOf(t, first), progressOf(t, rest)...)
		if len(all) != 20 {
			t.Fatalf("progress across the poll: %v", all)
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

// TestRelayPollIntervalStandalone: the GET that opens the standalone
// stream is closed for polling with retry and an id; the GET that resumes
// from that id is not closed again.
func TestRelayPollIntervalStandalone(t *testing.T) {
	e := newEnv(t, relay.Options{PollInterval: 50 * time.Millisecond})
	s := e.initialize("2025-11-25", "")
	evs, ended := events(t, s.get(""), 0, 5*time.Second)
	if !ended {
		t.Fatal("the standalone stream was not closed for polling")
	}
	last := evs[len(evs)-1]
	if last.Retry != 50*time.Millisecond || last.ID == "" {
		t.Fatalf("closed without retry and an id: %+v", evs)
	}
	// Ten intervals: on a slow machine this only proves less, it never
	// fails wrongly.
	if evs, ended := events(t, s.get(last.ID), 0, 500*time.Millisecond); ended {
		t.Fatalf("the resumed standalone stream was closed: %+v", evs)
	}
}

// TestPollIntervalGoSDKClient: the official Go SDK client (v1.8.0) counts
// a reconnect whose last event ID did not advance as a retry without
// progress and fails the whole session after five. A poll close of a
// stream with nothing new carries no new id, so a relay that closed
// resumed streams again broke the session within six intervals of an idle
// standalone stream or of a quiet call. Regression test: idle for many
// intervals, then a call quiet for many intervals.
func TestPollIntervalGoSDKClient(t *testing.T) {
	e := newEnv(t, relay.Options{PollInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "sdk-poll", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.url}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	time.Sleep(300 * time.Millisecond) // idle: about 30 intervals
	out, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": 1, "interval_ms": 300}})
	if err != nil {
		t.Fatalf("a call after the session idled across poll intervals: %v", err)
	}
	if txt := out.Content[0].(*mcp.TextContent).Text; txt != "counted 1" {
		t.Fatalf("result %q", txt)
	}
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatalf("the session after a quiet call: %v", err)
	}
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
