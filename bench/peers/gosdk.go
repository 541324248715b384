package peers

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type goSDKStreamArgs struct {
	Count      int `json:"count,omitempty" jsonschema:"number of progress notifications (default 20)"`
	IntervalMS int `json:"interval_ms,omitempty" jsonschema:"milliseconds between notifications"`
}

// GoSDKServer returns an official-Go-SDK server with the two tools.
func GoSDKServer() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "gosdk-peer", Version: "v1.8.0"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: ToolStream, Description: "sends count progress notifications"},
		func(ctx context.Context, req *mcp.CallToolRequest, in goSDKStreamArgs) (*mcp.CallToolResult, any, error) {
			n := clampCount(in.Count)
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
	mcp.AddTool(srv, &mcp.Tool{Name: ToolSimple, Description: "returns a fixed text"},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: SimpleText}}}, nil, nil
		})
	return srv
}

// GoSDK returns the official Go SDK's Streamable HTTP handler over
// [GoSDKServer], with mcp.NewMemoryEventStore (default limits) if store.
func GoSDK(store bool) http.Handler {
	srv := GoSDKServer()
	var o mcp.StreamableHTTPOptions
	if store {
		o.EventStore = mcp.NewMemoryEventStore(nil)
	}
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &o)
}
