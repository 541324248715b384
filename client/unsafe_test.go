package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// unsafeServer is a deliberately unsafe Streamable HTTP server: its event
// IDs are bare integers that restart at 1 after each (simulated) restart,
// and a resume replays whatever its current incarnation has after the
// given number. A client that trusted such a cursor would apply events of
// the new incarnation as if they continued the old stream.
//
// The first tools/call answers with progress events 1 and 2 (progress 1,
// 2), then "crashes": the stream is cut and the server restarts. Later,
// tools/call sends progress 1, 2, 3 (as 10, 20, 30) and the result. The
// standalone GET stream sends log messages "<incarnation>-1..3" with IDs
// 1..3 and ends with retry; after two incarnations GET answers 405.
type unsafeServer struct {
	mu          sync.Mutex
	incarnation int
	resumes     []string // Last-Event-ID headers received
	gets        int
	calls       int
}

func (s *unsafeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		s.get(w, r)
	case http.MethodPost:
		s.post(w, r)
	case http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}

func (s *unsafeServer) post(w http.ResponseWriter, r *http.Request) {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Meta struct {
				ProgressToken json.RawMessage `json:"progressToken"`
			} `json:"_meta"`
		} `json:"params"`
	}
	body, _ := io.ReadAll(r.Body)
	if json.Unmarshal(body, &m) != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	w.Header().Set("Mcp-Session-Id", "unsafe-session")
	switch m.Method {
	case "initialize":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"unsafe","version":"1"}}}`, m.ID)
	case "tools/call":
		s.mu.Lock()
		s.calls++
		first := s.calls == 1
		s.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		progress := func(id int, v int) {
			fmt.Fprintf(w, "id: %d\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":%s,\"progress\":%d}}\n\n", id, m.Params.Meta.ProgressToken, v)
		}
		if first {
			progress(1, 1)
			progress(2, 2)
			w.(http.Flusher).Flush()
			s.restart()
			panic(http.ErrAbortHandler) // the crash cuts the stream
		}
		progress(1, 10)
		progress(2, 20)
		progress(3, 30)
		fmt.Fprintf(w, "id: 4\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"after restart\"}]}}\n\n", m.ID)
	default:
		if len(m.ID) > 0 {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{}}`, m.ID)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}
}

func (s *unsafeServer) restart() {
	s.mu.Lock()
	s.incarnation++
	s.mu.Unlock()
}

func (s *unsafeServer) get(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	lei := r.Header.Get("Last-Event-ID")
	if lei != "" {
		s.resumes = append(s.resumes, lei)
	}
	s.gets++
	n := s.gets
	s.mu.Unlock()
	if n > 2 {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Mcp-Session-Id", "unsafe-session")
	first := 1
	if lei != "" {
		fmt.Sscan(lei, &first) // unsafe: trusts a counter of another incarnation
		first++
	}
	for i := first; i <= 3; i++ {
		fmt.Fprintf(w, "id: %d\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"%d-%d\"}}\n\n", i, n, i)
	}
	fmt.Fprint(w, "retry: 5\n\n")
	if n == 1 {
		s.restart()
	}
}

// TestUnsafeServer: against a server whose bare integer IDs restart, the
// client never resumes with such a cursor, so no event of a new
// incarnation is taken as the continuation of the old stream.
func TestUnsafeServer(t *testing.T) {
	cases := []struct {
		name       string
		idempotent bool
		wantErr    error
		wantProg   []float64
	}{
		// The call's stream is cut after progress 1, 2; it cannot be
		// resumed, so the call is reported lost.
		{name: "call_lost", wantErr: client.ErrRequestLost, wantProg: []float64{1, 2}},
		// Marked idempotent, it is sent again: the new incarnation's
		// events 1..3 are new events, not duplicates of the old 1, 2.
		{name: "call_resent", idempotent: true, wantProg: []float64{1, 2, 10, 20, 30}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := &unsafeServer{}
			hs := httptest.NewServer(srv)
			defer hs.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			plog := newProgressLog()
			var mu sync.Mutex
			var logs []string
			logged := make(chan struct{}, 16)
			c := mcp.NewClient(&mcp.Implementation{Name: "unsafe", Version: "1"}, &mcp.ClientOptions{
				ProgressNotificationHandler: plog.handle,
				LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
					mu.Lock()
					logs = append(logs, fmt.Sprint(req.Params.Data))
					mu.Unlock()
					logged <- struct{}{}
				},
			})
			tr := client.New(client.Options{Endpoint: hs.URL, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Logger: testLogger(t)})
			cs, err := c.Connect(ctx, tr, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()

			// The standalone stream: 1-1..1-3, a restart, then 2-1..2-3
			// from a fresh GET (a resume after "3" would have got nothing).
			for range 6 {
				select {
				case <-logged:
				case <-ctx.Done():
					mu.Lock()
					t.Fatalf("log messages %v, want 6", logs)
				}
			}
			mu.Lock()
			if want := []string{"1-1", "1-2", "1-3", "2-1", "2-2", "2-3"}; !slices.Equal(logs, want) {
				t.Errorf("log messages %v, want %v", logs, want)
			}
			mu.Unlock()

			callCtx := ctx
			if tc.idempotent {
				callCtx = client.Idempotent(ctx)
			}
			p := &mcp.CallToolParams{Name: "anything"}
			p.SetProgressToken("tok")
			res, err := cs.CallTool(callCtx, p)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			} else if got := resultText(t, res); got != "after restart" {
				t.Errorf("result %q", got)
			}
			if got := plog.waitFor(ctx, "tok", len(tc.wantProg)); !slices.Equal(got, tc.wantProg) {
				t.Errorf("progress %v, want %v", got, tc.wantProg)
			}
			srv.mu.Lock()
			defer srv.mu.Unlock()
			if len(srv.resumes) > 0 {
				t.Errorf("client resumed with bare integer cursors %q", srv.resumes)
			}
		})
	}
}
