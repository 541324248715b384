package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestRawCallStreamsProgressThenResult(t *testing.T) {
	e := newEnv(t, relay.Options{})
	s := e.initialize("2025-11-25", "")
	id, resp := s.call(5, 0, true)
	evs, ended := events(t, resp, 0, 10*time.Second)
	if !ended {
		t.Fatal("stream did not end after the response")
	}
	if len(evs) == 0 || evs[0].ID == "" || evs[0].Data == nil || len(evs[0].Data) != 0 {
		t.Fatalf("first event is not a priming event: %+v", evs)
	}
	data := dataEvents(evs)
	if len(data) != 6 {
		t.Fatalf("got %d data events, want 5 progress + 1 result: %+v", len(data), evs)
	}
	for i, ev := range data[:5] {
		m := mcptest.Decode(t, ev.Data)
		if m.Method != "notifications/progress" || m.Params.Progress != float64(i+1) {
			t.Fatalf("event %d: %s", i, ev.Data)
		}
	}
	m := mcptest.Decode(t, data[5].Data)
	if string(m.ID) != fmt.Sprint(id) || m.Result == nil || m.Result.Content[0].Text != "counted 5" {
		t.Fatalf("result: %s", data[5].Data)
	}
	seen := map[string]bool{}
	for _, ev := range evs {
		if ev.ID != "" && seen[ev.ID] {
			t.Fatalf("event ID %s repeated", ev.ID)
		}
		seen[ev.ID] = true
	}
}

func TestPrimingOnlyFor20251125(t *testing.T) {
	e := newEnv(t, relay.Options{})
	for _, v := range []string{"2025-03-26", "2025-06-18"} {
		s := e.initialize(v, "")
		_, resp := s.call(1, 0, true)
		evs, _ := events(t, resp, 0, 10*time.Second)
		for _, ev := range evs {
			if ev.Data != nil && len(ev.Data) == 0 {
				t.Fatalf("%s: got a priming event (empty data): older clients choke on it", v)
			}
		}
		if len(dataEvents(evs)) != 2 {
			t.Fatalf("%s: events %+v", v, evs)
		}
	}
}

// TestGoSDKClient drives the relay with the official Go SDK client, at its
// default protocol (2026-07-28, stateless pass-through) and pinned to each
// session-based revision.
func TestGoSDKClient(t *testing.T) {
	e := newEnv(t, relay.Options{})
	for _, version := range []string{"", "2025-11-25", "2025-06-18", "2025-03-26"} {
		t.Run("version="+version, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var mu sync.Mutex
			var progress []float64
			c := mcp.NewClient(&mcp.Implementation{Name: "sdk-test", Version: "1"}, &mcp.ClientOptions{
				ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
					mu.Lock()
					progress = append(progress, r.Params.Progress)
					mu.Unlock()
				},
			})
			cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.url}, &mcp.ClientSessionOptions{ProtocolVersion: version})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			res, err := cs.ListTools(ctx, nil)
			if err != nil || len(res.Tools) < 4 {
				t.Fatalf("tools/list: %v %+v", err, res)
			}
			params := &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": 10}}
			params.SetProgressToken("tok")
			out, err := cs.CallTool(ctx, params)
			if err != nil {
				t.Fatal(err)
			}
			if txt := out.Content[0].(*mcp.TextContent).Text; txt != "counted 10" {
				t.Fatalf("result %q", txt)
			}
			// The SDK client runs notification handlers asynchronously: give
			// the last ones a moment after the result.
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				mu.Lock()
				n := len(progress)
				mu.Unlock()
				if n >= 10 {
					break
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if len(progress) != 10 {
				t.Fatalf("got %d progress notifications, want 10: %v", len(progress), progress)
			}
			if version != "" && cs.ID() == "" {
				t.Fatal("no session ID for a session-based revision")
			}
			if version == "" {
				// The default is the stateless revision, passed through
				// without a session.
				if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" || cs.ID() != "" {
					t.Fatalf("default protocol: negotiated %q with session %q, want 2026-07-28 without a session", v, cs.ID())
				}
			}
		})
	}
}
