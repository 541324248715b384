package client_test

import (
	"context"
	"fmt"
	"log"
	"net/http/httptest"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/client"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Connect through mcprelay, call a long tool, and resume: the relay closes
// the call's stream every 10ms (polling, with "retry:"), and the transport
// resumes it by GET with Last-Event-ID each time, so the caller sees one
// uninterrupted call with every progress notification once.
func Example() {
	h, err := relay.New(relay.Options{Backend: backend.SDK(countServer(nil), nil), PollInterval: 10 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	srv := httptest.NewServer(h)
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	progress := 0
	c := mcp.NewClient(&mcp.Implementation{Name: "example", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progress++ },
	})
	cs, err := c.Connect(ctx, client.New(client.Options{Endpoint: srv.URL}), nil)
	if err != nil {
		log.Fatal(err)
	}
	params := &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": 10, "interval_ms": 5}}
	params.SetProgressToken("job")
	res, err := cs.CallTool(ctx, params)
	if client.IsLost(err) {
		log.Fatal("the server lost the call: ", err)
	}
	if err != nil {
		log.Fatal(err)
	}
	cs.Close()
	fmt.Println(res.Content[0].(*mcp.TextContent).Text)
	fmt.Println("progress notifications:", progress)
	// Output:
	// counted 10
	// progress notifications: 10
}
