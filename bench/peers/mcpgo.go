package peers

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// MCPGo returns mcp-go's Streamable HTTP server with the two tools, with
// server.NewInMemoryEventStore if store.
func MCPGo(store bool) http.Handler {
	s := server.NewMCPServer("mcpgo-peer", "v1.2.1", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool(ToolStream,
		mcp.WithDescription("sends count progress notifications"),
		mcp.WithNumber("count", mcp.Description("number of progress notifications (default 20)")),
		mcp.WithNumber("interval_ms", mcp.Description("milliseconds between notifications"))),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			n := clampCount(req.GetInt("count", DefaultCount))
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
	s.AddTool(mcp.NewTool(ToolSimple, mcp.WithDescription("returns a fixed text")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(SimpleText), nil
		})
	var opts []server.StreamableHTTPOption
	if store {
		opts = append(opts, server.WithEventStore(server.NewInMemoryEventStore()))
	}
	return server.NewStreamableHTTPServer(s, opts...)
}
