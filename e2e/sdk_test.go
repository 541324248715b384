package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/sse"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// sdkWait bounds every SDK call, so that a relay that loses a response
// fails the test instead of hanging it.
const sdkWait = 20 * time.Second

// sdkClient is an official-Go-SDK client session through the relay, with
// sampling and elicitation answered the way the example server's own tests
// answer them, and every notification recorded on channels.
type sdkClient struct {
	cs       *mcp.ClientSession
	samples  chan *mcp.CreateMessageParams
	elicits  chan *mcp.ElicitParams
	progress chan *mcp.ProgressNotificationParams
	logs     chan *mcp.LoggingMessageParams
}

func connectSDK(t *testing.T, url, version string, client *http.Client) *sdkClient {
	t.Helper()
	c := &sdkClient{
		samples:  make(chan *mcp.CreateMessageParams, 8),
		elicits:  make(chan *mcp.ElicitParams, 8),
		progress: make(chan *mcp.ProgressNotificationParams, 4096),
		logs:     make(chan *mcp.LoggingMessageParams, 64),
	}
	cl := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, &mcp.ClientOptions{
		CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			c.samples <- req.Params
			return &mcp.CreateMessageResult{Role: "assistant", Model: "test-model",
				Content: &mcp.TextContent{Text: "This is a test response from the client"}}, nil
		},
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			c.elicits <- req.Params
			raw, _ := json.Marshal(req.Params.RequestedSchema)
			var s struct{ Properties map[string]any }
			json.Unmarshal(raw, &s)
			content := map[string]any{}
			switch {
			case s.Properties["username"] != nil:
				content = map[string]any{"username": "testuser", "email": "test@example.com"}
			case s.Properties["age"] != nil:
				content = map[string]any{"name": "Jane Smith", "age": 25, "score": 88, "status": "inactive", "verified": false}
			case s.Properties["untitledSingle"] != nil:
				content = map[string]any{"untitledSingle": "option1", "titledSingle": "value1", "legacyEnum": "opt1",
					"untitledMulti": []any{"option1", "option2"}, "titledMulti": []any{"value1", "value2"}}
			}
			return &mcp.ElicitResult{Action: "accept", Content: content}, nil
		},
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			c.progress <- req.Params
		},
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			select {
			case c.logs <- req.Params:
			default:
			}
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), sdkWait)
	defer cancel()
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: client}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect at %q: %v", version, err)
	}
	t.Cleanup(func() { cs.Close() })
	c.cs = cs
	return c
}

// receive returns the next value on ch, failing the test after sdkWait.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(sdkWait):
		t.Fatalf("no %s within %v", what, sdkWait)
		panic("unreachable")
	}
}

// legacyRequestRefused checks the result of a tool that sends the client a
// request (sampling, elicitation) at 2026-07-28: the example server uses the
// legacy server-to-client requests, which the SDK server refuses to send at
// that revision (it wants SEP-2322 input requests), with or without the
// relay. The relay must carry that tool error through unchanged.
func legacyRequestRefused(t *testing.T, _ *sdkClient, res *mcp.CallToolResult) {
	t.Helper()
	if got := mcptest.OnlyText(t, res); !res.IsError || !strings.Contains(got, "cannot be sent while serving a request on protocol version 2026-07-28") {
		t.Errorf("result %q (isError %v), want the SDK's refusal of a legacy server-to-client request", got, res.IsError)
	}
}

// exampleTool is a tool of the example server with valid arguments and
// what its result must be (the example server's own tests' checks).
type exampleTool struct {
	tool  string
	args  any
	token any // progress token, if the call sets one
	check func(t *testing.T, c *sdkClient, res *mcp.CallToolResult)
	// modern, if set, replaces check at 2026-07-28, where the example
	// server behaves differently with or without the relay (see below).
	modern func(t *testing.T, c *sdkClient, res *mcp.CallToolResult)
}

// contentTools are the example server's tools that answer fixed content.
func contentTools() []exampleTool {
	var out []exampleTool
	for _, name := range mcptest.ExampleContentTools {
		out = append(out, exampleTool{tool: name, args: map[string]any{}, check: func(t *testing.T, _ *sdkClient, res *mcp.CallToolResult) {
			mcptest.CheckExampleResult(t, name, res)
		}})
	}
	return out
}

// exampleTools is every tool of the example server.
var exampleTools = append(contentTools(), []exampleTool{
	{"test_tool_with_logging", map[string]any{}, nil, func(t *testing.T, c *sdkClient, res *mcp.CallToolResult) {
		if got := mcptest.OnlyText(t, res); got != "Tool with logging executed successfully" {
			t.Errorf("text %q", got)
		}
		// Log messages are sent only at or above the session's level; the
		// client set "debug" first, so all three come, in order.
		var got []any
		for range 3 {
			got = append(got, receive(t, c.logs, "log message").Data)
		}
		if want := []any{"Tool execution started", "Tool processing data", "Tool execution completed"}; !reflect.DeepEqual(got, want) {
			t.Errorf("logs %v, want %v", got, want)
		}
	}, func(t *testing.T, _ *sdkClient, res *mcp.CallToolResult) {
		// At 2026-07-28 the SDK client cannot set a log level (the SDK
		// server rejects its logging/setLevel for a missing _meta
		// protocolVersion, also without the relay), so no log is sent.
		if got := mcptest.OnlyText(t, res); got != "Tool with logging executed successfully" {
			t.Errorf("text %q", got)
		}
	}},
	{"test_tool_with_progress", map[string]any{}, "every-tool-progress", func(t *testing.T, c *sdkClient, res *mcp.CallToolResult) {
		if got := mcptest.OnlyText(t, res); got != "Tool with progress executed successfully" {
			t.Errorf("text %q", got)
		}
		var got []float64
		for range 3 {
			p := receive(t, c.progress, "progress notification")
			if p.ProgressToken != "every-tool-progress" || p.Total != 100 {
				t.Errorf("progress %+v", p)
			}
			got = append(got, p.Progress)
		}
		if want := []float64{0, 50, 100}; !reflect.DeepEqual(got, want) {
			t.Errorf("progress %v, want %v", got, want)
		}
	}, nil},
	{"test_sampling", map[string]any{"prompt": "Test prompt for sampling"}, nil, func(t *testing.T, c *sdkClient, res *mcp.CallToolResult) {
		if got := mcptest.OnlyText(t, res); got != "LLM response: This is a test response from the client" {
			t.Errorf("text %q", got)
		}
		p := receive(t, c.samples, "sampling request")
		if p.MaxTokens != 100 || len(p.Messages) != 1 || p.Messages[0].Role != "user" {
			t.Fatalf("sampling request %+v, want one user message and maxTokens 100", p)
		}
		if tc, ok := p.Messages[0].Content.(*mcp.TextContent); !ok || tc.Text != "Test prompt for sampling" {
			t.Errorf("sampling message %+v", p.Messages[0].Content)
		}
	}, legacyRequestRefused},
	{"test_elicitation", map[string]any{"message": "Please provide your information"}, nil, func(t *testing.T, c *sdkClient, res *mcp.CallToolResult) {
		want := `User response: action=accept, content={"email":"test@example.com","username":"testuser"}`
		if got := mcptest.OnlyText(t, res); got != want {
			t.Errorf("text %q, want %q", got, want)
		}
		if p := receive(t, c.elicits, "elicitation"); p.Message != "Please provide your information" {
			t.Errorf("elicitation message %q", p.Message)
		}
	}, legacyRequestRefused},
	{"test_elicitation_sep1034_defaults", map[string]any{}, nil, func(t *testing.T, c *sdkClient, res *mcp.CallToolResult) {
		want := `Elicitation completed: action=accept, content={"age":25,"name":"Jane Smith","score":88,"status":"inactive","verified":false}`
		if got := mcptest.OnlyText(t, res); got != want {
			t.Errorf("text %q, want %q", got, want)
		}
		receive(t, c.elicits, "elicitation")
	}, legacyRequestRefused},
	{"test_elicitation_sep1330_enums", map[string]any{}, nil, func(t *testing.T, c *sdkClient, res *mcp.CallToolResult) {
		want := `Elicitation completed: action=accept, content={"legacyEnum":"opt1","titledMulti":["value1","value2"],"titledSingle":"value1","untitledMulti":["option1","option2"],"untitledSingle":"option1"}`
		if got := mcptest.OnlyText(t, res); got != want {
			t.Errorf("text %q, want %q", got, want)
		}
		receive(t, c.elicits, "elicitation")
	}, legacyRequestRefused},
	{"json_schema_2020_12_tool", map[string]any{"name": "x", "address": map[string]any{"city": "y"}}, nil, func(t *testing.T, _ *sdkClient, res *mcp.CallToolResult) {
		if got := mcptest.OnlyText(t, res); res.IsError || got != `JSON Schema 2020-12 tool called with: {"address":{"city":"y"},"name":"x"}` {
			t.Errorf("result %q (isError %v)", got, res.IsError)
		}
	}, nil},
	{"test_reconnection", map[string]any{}, nil, func(t *testing.T, _ *sdkClient, res *mcp.CallToolResult) {
		if got := mcptest.OnlyText(t, res); got != "Reconnection test completed successfully" {
			t.Errorf("text %q", got)
		}
	}, nil},
	{"stream_progress", map[string]any{"count": 5, "interval_ms": 10}, "every-tool-stream", func(t *testing.T, c *sdkClient, res *mcp.CallToolResult) {
		if got := mcptest.OnlyText(t, res); got != "streamed 5 events" {
			t.Errorf("text %q", got)
		}
		for i := 1; i <= 5; i++ {
			p := receive(t, c.progress, "progress notification")
			if p.ProgressToken != "every-tool-stream" || p.Progress != float64(i) || p.Total != 5 {
				t.Errorf("progress %d = %+v", i, p)
			}
		}
	}, nil},
}...)

// TestSDKClientEveryTool drives the relay, in front of the example server,
// with the official Go SDK client: every tool, resource and prompt, at
// 2025-11-25 (sessions, relay-owned streams) and at the client's default
// revision (2026-07-28, stateless pass-through).
func TestSDKClientEveryTool(t *testing.T) {
	_, url := startRelay(t, relay.Options{
		Backend: backend.SDK(exampleserver.New(nil), &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)}),
	})
	for _, version := range []string{"2025-11-25", ""} {
		name := version
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			c := connectSDK(t, url, version, nil)
			ctx, cancel := context.WithTimeout(t.Context(), 2*sdkWait)
			defer cancel()
			got := c.cs.InitializeResult().ProtocolVersion
			if version != "" && got != version {
				t.Fatalf("negotiated %q, want %q", got, version)
			}
			t.Logf("negotiated protocol %s, session %q", got, c.cs.ID())
			if version != "" && c.cs.ID() == "" {
				t.Fatal("no session ID at a session-based revision")
			}
			if version != "" {
				if err := c.cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
					t.Fatalf("logging/setLevel: %v", err)
				}
			}

			list, err := c.cs.ListTools(ctx, nil)
			if err != nil {
				t.Fatalf("tools/list: %v", err)
			}
			var names, want []string
			for _, tool := range list.Tools {
				names = append(names, tool.Name)
			}
			for _, tt := range exampleTools {
				want = append(want, tt.tool)
			}
			slices.Sort(names)
			slices.Sort(want)
			if !slices.Equal(names, want) {
				t.Fatalf("tools\n got %v\nwant %v (every tool must be called)", names, want)
			}

			for _, tt := range exampleTools {
				t.Run(tt.tool, func(t *testing.T) {
					p := &mcp.CallToolParams{Name: tt.tool, Arguments: tt.args}
					if tt.token != nil {
						p.SetProgressToken(tt.token)
					}
					ctx, cancel := context.WithTimeout(t.Context(), sdkWait)
					defer cancel()
					res, err := c.cs.CallTool(ctx, p)
					if err != nil {
						t.Fatalf("tools/call %s: %v", tt.tool, err)
					}
					if version == "" && tt.modern != nil {
						tt.modern(t, c, res)
						return
					}
					tt.check(t, c, res)
				})
			}

			t.Run("resources", func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), sdkWait)
				defer cancel()
				res, err := c.cs.ListResources(ctx, nil)
				if err != nil {
					t.Fatalf("resources/list: %v", err)
				}
				var uris []string
				for _, r := range res.Resources {
					uris = append(uris, r.URI)
				}
				if want := []string{"test://static-binary", "test://static-text", "test://watched-resource"}; !reflect.DeepEqual(uris, want) {
					t.Errorf("resources %v, want %v", uris, want)
				}
				tests := []struct {
					uri  string
					want mcp.ResourceContents // Blob is checked as a PNG when non-nil
				}{
					{"test://static-text", mcp.ResourceContents{URI: "test://static-text", MIMEType: "text/plain", Text: "This is the content of the static text resource."}},
					{"test://static-binary", mcp.ResourceContents{URI: "test://static-binary", MIMEType: "image/png", Blob: []byte{}}},
					{"test://watched-resource", mcp.ResourceContents{URI: "test://watched-resource", MIMEType: "text/plain", Text: "Watched resource content"}},
					{"test://template/123/data", mcp.ResourceContents{URI: "test://template/123/data", MIMEType: "application/json", Text: `{"id":"123","templateTest":true,"data":"Data for ID: 123"}`}},
				}
				for _, tt := range tests {
					res, err := c.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: tt.uri})
					if err != nil {
						t.Errorf("resources/read %s: %v", tt.uri, err)
						continue
					}
					if len(res.Contents) != 1 {
						t.Errorf("%s: %d contents, want 1", tt.uri, len(res.Contents))
						continue
					}
					got := *res.Contents[0]
					if tt.want.Blob != nil {
						mcptest.CheckPNG(t, got.Blob)
						got.Blob, tt.want.Blob = nil, nil
					}
					if !reflect.DeepEqual(got, tt.want) {
						t.Errorf("%s: got %+v, want %+v", tt.uri, got, tt.want)
					}
				}
			})

			t.Run("prompts", func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), sdkWait)
				defer cancel()
				for _, p := range mcptest.ExamplePrompts {
					res, err := c.cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: p.Name, Arguments: p.Args})
					if err != nil {
						t.Errorf("prompts/get %s: %v", p.Name, err)
						continue
					}
					mcptest.CheckPrompt(t, p, res)
				}
			})
		})
	}
}

// cutter is an http.RoundTripper that cuts the bodies of the SSE responses
// the client receives (tools/call POST streams, the standalone GET stream
// and GET resumes), one offset per response in the order they arrive, as
// a dropped connection would.
type cutter struct {
	base http.RoundTripper

	mu      sync.Mutex
	offsets []int    // offsets still to apply, in order
	log     []string // what happened, for failure messages
	cuts    int
	resumes int
	seen    []*bytes.Buffer // of each SSE response, the bytes the client read
}

// teeBody copies what its reader reads into w.
type teeBody struct {
	rc io.ReadCloser
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (b *teeBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.mu.Lock()
	b.w.Write(p[:n])
	b.mu.Unlock()
	return n, err
}

func (b *teeBody) Close() error { return b.rc.Close() }

// delivered returns the SSE events the client read whole, from every
// stream (an event cut in its middle was not delivered: the client drops
// it and gets it again from the resume).
func (c *cutter) delivered() []sse.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []sse.Event
	for _, b := range c.seen {
		sc := sse.NewScanner(bytes.NewReader(b.Bytes()))
		for {
			ev, err := sc.Next()
			if err != nil {
				break
			}
			out = append(out, ev)
		}
	}
	return out
}

func (c *cutter) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var buf bytes.Buffer
		buf.ReadFrom(req.Body)
		req.Body.Close()
		body = buf.Bytes()
		req.Body = nopCloser{bytes.NewReader(body)}
	}
	resp, err := c.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	lei := req.Header.Get("Last-Event-ID")
	isCall := req.Method == http.MethodPost && bytes.Contains(body, []byte(`"tools/call"`))
	c.mu.Lock()
	defer c.mu.Unlock()
	what := req.Method
	switch {
	case lei != "":
		c.resumes++
		what = "GET resume"
	case req.Method == http.MethodGet:
		what = "GET standalone"
	case isCall:
		what = "POST tools/call"
	default:
		return resp, nil
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		c.log = append(c.log, fmt.Sprintf("%s -> %s", what, resp.Status))
		return resp, nil
	}
	seen := &bytes.Buffer{}
	c.seen = append(c.seen, seen)
	defer func() { resp.Body = &teeBody{rc: resp.Body, mu: &c.mu, w: seen} }()
	if len(c.offsets) == 0 {
		c.log = append(c.log, fmt.Sprintf("%s -> %s", what, resp.Status))
		return resp, nil
	}
	off := c.offsets[0]
	c.offsets = c.offsets[1:]
	c.log = append(c.log, fmt.Sprintf("%s -> %s, cut after %d bytes", what, resp.Status, off))
	resp.Body = &cutBody{rc: resp.Body, limit: off, onCut: func() {
		c.mu.Lock()
		c.cuts++
		c.log = append(c.log, fmt.Sprintf("cut %s after %d bytes", what, off))
		c.mu.Unlock()
	}}
	return resp, nil
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

// requestStreamTool is the name of a tool this test adds to the example
// server: stream_progress, but with its progress notifications sent in the
// request's context, so that the SDK server puts them on the request's own
// POST stream. (The example server's stream_progress notifies with
// context.Background(), so the SDK server sends its progress on the
// session's standalone GET stream, and only the result on the POST stream.)
const requestStreamTool = "stream_progress_on_request"

func addRequestStreamTool(s *mcp.Server) {
	type args struct {
		Count      int `json:"count"`
		IntervalMS int `json:"interval_ms"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: requestStreamTool, Description: "stream_progress on the request's stream"},
		func(ctx context.Context, req *mcp.CallToolRequest, a args) (*mcp.CallToolResult, any, error) {
			for i := 1; i <= a.Count; i++ {
				if i > 1 {
					select {
					case <-ctx.Done():
						return nil, nil, ctx.Err()
					case <-time.After(time.Duration(a.IntervalMS) * time.Millisecond):
					}
				}
				if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: req.Params.GetProgressToken(), Progress: float64(i), Total: float64(a.Count),
					Message: fmt.Sprintf("step %d of %d", i, a.Count),
				}); err != nil {
					return nil, nil, err
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("streamed %d events", a.Count)}}}, nil, nil
		})
}

// TestSDKClientResumesCutStream cuts the SDK client's streams while a
// streaming call runs and checks that the client resumes through the relay
// (GET with Last-Event-ID) and sees every progress notification exactly
// once, in order, and the result.
func TestSDKClientResumesCutStream(t *testing.T) {
	const count, intervalMS = 60, 30 // ~1.8 s of streaming
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := newRand(seed)
	once := func() []int { return []int{1500, 1500} }
	several := func() []int {
		// At most 5 offsets: the SDK client gives up after 5 reconnections
		// that bring no new event ID. Each is past the stream's priming
		// event, so every cut comes after some progress.
		var offs []int
		for range 5 {
			offs = append(offs, rnd.between(300, 2500))
		}
		return offs
	}
	tests := []struct {
		name     string
		tool     string
		offsets  func() []int
		minCuts  int
		protocol string
	}{
		// The example server's own stream_progress: the progress flows on
		// the standalone GET stream (see requestStreamTool).
		{"stream_progress/cut once", "stream_progress", once, 1, "2025-11-25"},
		{"stream_progress/cut several times", "stream_progress", several, 2, "2025-11-25"},
		// Progress and result on the POST stream: the cut POST stream is
		// resumed by GET.
		{"request stream/cut once", requestStreamTool, once, 1, "2025-11-25"},
		{"request stream/cut several times", requestStreamTool, several, 2, "2025-11-25"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := exampleserver.New(nil)
			addRequestStreamTool(srv)
			_, url := startRelay(t, relay.Options{
				Backend: backend.SDK(srv, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)}),
			})
			cut := &cutter{base: http.DefaultTransport, offsets: tt.offsets()}
			c := connectSDK(t, url, tt.protocol, &http.Client{Transport: cut})
			ctx, cancel := context.WithTimeout(t.Context(), sdkWait)
			defer cancel()
			p := &mcp.CallToolParams{Name: tt.tool, Arguments: map[string]any{"count": count, "interval_ms": intervalMS}}
			p.SetProgressToken("cut-stream")
			res, err := c.cs.CallTool(ctx, p)
			report := func() string {
				cut.mu.Lock()
				defer cut.mu.Unlock()
				return fmt.Sprintf("%d cuts, %d resumes:\n\t%s", cut.cuts, cut.resumes, strings.Join(cut.log, "\n\t"))
			}
			if err != nil {
				t.Fatalf("tools/call: %v\n%s", err, report())
			}
			if got, want := mcptest.OnlyText(t, res), fmt.Sprintf("streamed %d events", count); got != want {
				t.Errorf("result %q, want %q", got, want)
			}
			// Notification handlers may run after CallTool returns: wait on
			// the channel, bounded.
			for i := 1; i <= count; i++ {
				n := receive(t, c.progress, fmt.Sprintf("progress notification %d (%s)", i, report()))
				if n.ProgressToken != "cut-stream" || n.Progress != float64(i) || n.Total != count {
					t.Fatalf("progress notification %d = %+v, want %d/%d (exactly once, in order)\n%s", i, n, i, count, report())
				}
			}
			// Closing the session waits for its handlers: what it read,
			// it has handled. Nothing extra may have come, and on the
			// wire every notification and the result came in exactly one
			// whole event (a replay overlapping what the client had would
			// show here even if it came after the result).
			c.cs.Close()
			select {
			case n := <-c.progress:
				t.Fatalf("extra progress notification %+v after all %d\n%s", n, count, report())
			default:
			}
			times := map[string]int{}
			for _, ev := range cut.delivered() {
				if len(ev.Data) == 0 || ev.Type != "" {
					continue
				}
				switch m := mcptest.Decode(t, ev.Data); {
				case m.Method == "notifications/progress" && m.Params.ProgressToken == "cut-stream":
					times[fmt.Sprint("progress ", m.Params.Progress)]++
				case m.Result != nil && strings.HasPrefix(m.Text(), "streamed "):
					times["result"]++
				}
			}
			for i := 1; i <= count; i++ {
				if n := times[fmt.Sprint("progress ", float64(i))]; n != 1 {
					t.Errorf("progress %d came in %d whole events, want exactly 1\n%s", i, n, report())
				}
			}
			if times["result"] != 1 {
				t.Errorf("the result came in %d whole events, want exactly 1\n%s", times["result"], report())
			}
			cut.mu.Lock()
			cuts, resumes := cut.cuts, cut.resumes
			cut.mu.Unlock()
			if cuts < tt.minCuts || resumes < cuts {
				t.Fatalf("the test did not exercise resumption: %s", report())
			}
			t.Log(report())
		})
	}
}
