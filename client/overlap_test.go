package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/client"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// overlapServer answers tools/call with progress events s_1..s_3 and cuts
// the stream; a resume replays from one event too early (s_2 again, then
// s_3, s_4, a second copy of the response, and the response again under
// a new ID), as a sloppy server might. GET without Last-Event-ID is 405.
func overlapServer() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Mcp-Session-Id", "overlap")
		if r.Method == http.MethodGet {
			if r.Header.Get("Last-Event-ID") != "s_3" {
				w.WriteHeader(http.StatusMethodNotAllowed)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 2; i <= 4; i++ {
				fmt.Fprintf(w, "id: s_%d\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"t\",\"progress\":%d}}\n\n", i, i)
			}
			res := `{"jsonrpc":"2.0","id":` + lastCallID + `,"result":{"content":[{"type":"text","text":"ok"}]}}`
			fmt.Fprintf(w, "id: s_5\ndata: %s\n\nid: s_5\ndata: %s\n\nid: s_6\ndata: %s\n\n", res, res, res)
			return
		}
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		body, _ := io.ReadAll(r.Body)
		json.Unmarshal(body, &m)
		switch m.Method {
		case "initialize":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"overlap","version":"1"}}}`, m.ID)
		case "tools/call":
			lastCallID = string(m.ID)
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 1; i <= 3; i++ {
				fmt.Fprintf(w, "id: s_%d\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"t\",\"progress\":%d}}\n\n", i, i)
			}
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		default:
			w.WriteHeader(http.StatusAccepted)
		}
	})
}

// lastCallID is the ID of the last tools/call overlapServer saw; the test
// makes one call at a time.
var lastCallID string

// recordingTransport records every message its transport hands the SDK
// (the SDK itself drops a response to a call already answered, so what
// reaches it must be seen below it).
type recordingTransport struct {
	mcp.Transport

	mu   sync.Mutex
	read []jsonrpc.Message
}

func (r *recordingTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := r.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &recordingConn{Connection: c, r: r}, nil
}

func (r *recordingTransport) responses() []*jsonrpc.Response {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*jsonrpc.Response
	for _, m := range r.read {
		if res, ok := m.(*jsonrpc.Response); ok {
			out = append(out, res)
		}
	}
	return out
}

type recordingConn struct {
	mcp.Connection
	r *recordingTransport
}

func (c *recordingConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if err == nil {
		c.r.mu.Lock()
		c.r.read = append(c.r.read, m)
		c.r.mu.Unlock()
	}
	return m, err
}

// TestOverlappingReplay: events repeated by a replay, and a second copy of
// the response (under the same event ID or a new one), never reach the SDK
// twice: each progress notification and the call's response are read
// exactly once. In a synctest bubble (the server in process): once every
// goroutine is idle, the transport has handed the SDK all it ever will.
func TestOverlappingReplay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		endWorkers(t)
		ctx := t.Context()
		plog := newProgressLog()
		c := mcp.NewClient(&mcp.Implementation{Name: "overlap", Version: "1"}, &mcp.ClientOptions{ProgressNotificationHandler: plog.handle})
		tr := &recordingTransport{Transport: client.New(client.Options{
			Endpoint:   "http://overlap.test/mcp",
			HTTPClient: &http.Client{Transport: backend.InProcess(overlapServer())},
			MinBackoff: time.Millisecond,
		})}
		cs, err := c.Connect(ctx, tr, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		p := &mcp.CallToolParams{Name: "x"}
		p.SetProgressToken("t")
		res, err := cs.CallTool(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if got := resultText(t, res); got != "ok" {
			t.Errorf("result %q", got)
		}
		synctest.Wait()
		if got, want := plog.get("t"), []float64{1, 2, 3, 4}; !slices.Equal(got, want) {
			t.Errorf("progress %v, want %v", got, want)
		}
		var answers []string
		for _, r := range tr.responses() {
			if strings.Contains(string(r.Result), `"text":"ok"`) {
				answers = append(answers, string(r.Result))
			}
		}
		if len(answers) != 1 {
			t.Errorf("the call's response reached the SDK %d times: %q", len(answers), answers)
		}
	})
}

// endWorkers makes a synctest bubble's test wait, last of its cleanups, on
// the bubble's fake clock, until the goroutines backend.InProcess keeps for
// a second after each request have ended: the bubble ends only once they
// have.
func endWorkers(t *testing.T) {
	t.Cleanup(func() { time.Sleep(2 * time.Second) })
}
