// Command gosdk serves an official-Go-SDK (v1.8.0) MCP server over Streamable
// HTTP with the SDK's MemoryEventStore, for `mcprelay probe`.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type streamArgs struct {
	Count      int `json:"count,omitempty" jsonschema:"number of progress notifications (default 20)"`
	IntervalMS int `json:"interval_ms,omitempty" jsonschema:"milliseconds between notifications"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:18941", "listen address (endpoint /mcp)")
	flag.Parse()

	srv := mcp.NewServer(&mcp.Implementation{Name: "gosdk-peer", Version: "v1.8.0"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "stream_progress", Description: "sends count progress notifications"},
		func(ctx context.Context, req *mcp.CallToolRequest, in streamArgs) (*mcp.CallToolResult, any, error) {
			n := in.Count
			if n <= 0 {
				n = 20
			}
			n = min(n, 100000)
			tok := req.Params.GetProgressToken()
			for i := 1; i <= n && tok != nil; i++ {
				if i > 1 && in.IntervalMS > 0 {
					time.Sleep(time.Duration(in.IntervalMS) * time.Millisecond)
				}
				if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: tok, Progress: float64(i), Total: float64(n),
				}); err != nil {
					return nil, nil, err
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("streamed %d events", n)}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	log.Printf("gosdk peer on http://%s/mcp", *addr)
	log.Fatal(http.ListenAndServe(*addr, mux))
}
