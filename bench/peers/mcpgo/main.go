// Command mcpgo serves an mcp-go (v1.2.x) MCP server over Streamable HTTP
// with mcp-go's InMemoryEventStore, for `mcprelay probe`.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18942", "listen address (endpoint /mcp)")
	flag.Parse()

	s := server.NewMCPServer("mcpgo-peer", "v1.2.1", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("stream_progress",
		mcp.WithDescription("sends count progress notifications"),
		mcp.WithNumber("count", mcp.Description("number of progress notifications (default 20)")),
		mcp.WithNumber("interval_ms", mcp.Description("milliseconds between notifications"))),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			n := req.GetInt("count", 20)
			if n <= 0 {
				n = 20
			}
			n = min(n, 100000)
			interval := req.GetInt("interval_ms", 0)
			var tok mcp.ProgressToken
			if req.Params.Meta != nil {
				tok = req.Params.Meta.ProgressToken
			}
			for i := 1; i <= n && tok != nil; i++ {
				if i > 1 && interval > 0 {
					time.Sleep(time.Duration(interval) * time.Millisecond)
				}
				if err := s.SendNotificationToClient(ctx, string(mcp.MethodNotificationProgress), map[string]any{
					"progressToken": tok, "progress": i, "total": n,
				}); err != nil {
					return nil, err
				}
			}
			return mcp.NewToolResultText(fmt.Sprintf("streamed %d events", n)), nil
		})
	h := server.NewStreamableHTTPServer(s, server.WithEventStore(server.NewInMemoryEventStore()))
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	log.Printf("mcp-go peer on http://%s/mcp", *addr)
	log.Fatal(http.ListenAndServe(*addr, mux))
}
