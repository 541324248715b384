package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/client"
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

// TestOverlappingReplay: events repeated by a replay, and a second copy of
// the response, never reach the SDK twice.
func TestOverlappingReplay(t *testing.T) {
	hs := httptest.NewServer(overlapServer())
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	plog := newProgressLog()
	c := mcp.NewClient(&mcp.Implementation{Name: "overlap", Version: "1"}, &mcp.ClientOptions{ProgressNotificationHandler: plog.handle})
	cs, err := c.Connect(ctx, client.New(client.Options{Endpoint: hs.URL, MinBackoff: time.Millisecond}), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &mcp.CallToolParams{Name: "x"}
	p.SetProgressToken("t")
	res, err := cs.CallTool(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if got := resultText(t, res); got != "ok" {
		t.Errorf("result %q", got)
	}
	plog.waitFor(ctx, "t", 4)
	cs.Close() // waits for the transport's goroutines: nothing more can arrive
	if got, want := plog.get("t"), []float64{1, 2, 3, 4}; !slices.Equal(got, want) {
		t.Errorf("progress %v, want %v", got, want)
	}
}
