package exampleserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/internal/mcptest"

	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// legacyVersion is the protocol version the conformance suite negotiates.
const legacyVersion = "2025-11-25"

// waitLimit bounds every wait for something the server should already have
// sent, so that a broken server fails a test instead of hanging it.
const waitLimit = 10 * time.Second

// event is a server-to-client notification as the client saw it, in order.
type event struct {
	kind     string // "progress", "log" or "updated"
	token    any
	progress float64
	total    float64
	data     any
	level    mcp.LoggingLevel
}

// fixture is a client connected to a fresh example server over in-memory transports.
type fixture struct {
	cs       *mcp.ClientSession
	srv      *mcp.Server
	events   chan event
	samples  chan *mcp.CreateMessageParams
	elicits  chan *mcp.ElicitParams
	records  chan slog.Record
	quit     chan struct{} // closed at cleanup so that handlers stop blocking
	barriers atomic.Int64
}

// push records a notification; it gives up once the test is over, so that a
// server that keeps sending cannot block the client from closing.
func (f *fixture) push(e event) {
	select {
	case f.events <- e:
	case <-f.quit:
	}
}

// recordHandler is a slog.Handler that forwards every record to a channel.
type recordHandler struct{ ch chan slog.Record }

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.ch <- r.Clone():
	default: // never block the server on a slow test
	}
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := t.Context()
	f := &fixture{
		events:  make(chan event, 4096),
		samples: make(chan *mcp.CreateMessageParams, 8),
		elicits: make(chan *mcp.ElicitParams, 8),
		records: make(chan slog.Record, 1024),
		quit:    make(chan struct{}),
	}
	f.srv = exampleserver.New(&exampleserver.Options{Logger: slog.New(recordHandler{f.records})})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := f.srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatalf("server connect: %v", err)
	}
	t.Cleanup(func() { _ = ss.Close() })

	client := mcp.NewClient(&mcp.Implementation{Name: "exampleserver-test", Version: "1"}, &mcp.ClientOptions{
		CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			f.samples <- req.Params
			return &mcp.CreateMessageResult{Role: "assistant", Model: "test-model",
				Content: &mcp.TextContent{Text: "This is a test response from the client"}}, nil
		},
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			f.elicits <- req.Params
			props, _ := req.Params.RequestedSchema.(map[string]any)["properties"].(map[string]any)
			content := map[string]any{}
			switch {
			case props["username"] != nil:
				content = map[string]any{"username": "testuser", "email": "test@example.com"}
			case props["age"] != nil:
				content = map[string]any{"name": "Jane Smith", "age": 25, "score": 88, "status": "inactive", "verified": false}
			case props["untitledSingle"] != nil:
				content = map[string]any{"untitledSingle": "option1", "titledSingle": "value1", "legacyEnum": "opt1",
					"untitledMulti": []any{"option1", "option2"}, "titledMulti": []any{"value1", "value2"}}
			}
			return &mcp.ElicitResult{Action: "accept", Content: content}, nil
		},
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			p := req.Params
			f.push(event{kind: "progress", token: p.ProgressToken, progress: p.Progress, total: p.Total})
		},
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			f.push(event{kind: "log", data: req.Params.Data, level: req.Params.Level})
		},
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			f.push(event{kind: "updated", data: req.Params.URI})
		},
	})
	f.cs, err = client.Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: legacyVersion})
	if err != nil {
		t.Fatalf("client connect: %v", err)
	}
	t.Cleanup(func() { _ = f.cs.Close() })
	t.Cleanup(func() { close(f.quit) }) // runs first
	return f
}

// call calls a tool and fails the test on a protocol error.
func (f *fixture) call(t *testing.T, name string, args any, token any) *mcp.CallToolResult {
	t.Helper()
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	if token != nil {
		p.SetProgressToken(token)
	}
	res, err := f.cs.CallTool(t.Context(), p)
	if err != nil {
		t.Fatalf("CallTool(%s): %v", name, err)
	}
	return res
}

// barrier returns, in order, every notification received before a marker
// notification that the server sends after all earlier ones. Client
// notification handlers run in wire order, so nothing sent earlier can
// arrive after the marker.
func (f *fixture) barrier(t *testing.T) []event {
	t.Helper()
	token := fmt.Sprintf("barrier-%d", f.barriers.Add(1))
	f.call(t, "stream_progress", map[string]any{"count": 1, "interval_ms": 0}, token)
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	var got []event
	for {
		select {
		case e := <-f.events:
			if e.token == token {
				return got
			}
			got = append(got, e)
		case <-ctx.Done():
			t.Fatalf("barrier: %v; got %v", ctx.Err(), got)
		}
	}
}

func TestInitialize(t *testing.T) {
	f := newFixture(t)
	res := f.cs.InitializeResult()
	if res.ProtocolVersion != legacyVersion {
		t.Errorf("protocol version %q, want %q", res.ProtocolVersion, legacyVersion)
	}
	if res.ServerInfo == nil || res.ServerInfo.Name != exampleserver.Name {
		t.Errorf("server info %+v, want name %q", res.ServerInfo, exampleserver.Name)
	}
	c := res.Capabilities
	switch {
	case c.Logging == nil:
		t.Error("no logging capability")
	case c.Completions == nil:
		t.Error("no completions capability")
	case c.Resources == nil || !c.Resources.Subscribe:
		t.Errorf("resources capability %+v, want subscribe", c.Resources)
	case c.Tools == nil || c.Prompts == nil:
		t.Errorf("tools %+v / prompts %+v capability missing", c.Tools, c.Prompts)
	}
	if err := f.cs.Ping(t.Context(), nil); err != nil {
		t.Errorf("ping: %v", err)
	}
}

func TestNewReturnsFreshServers(t *testing.T) {
	a, b := exampleserver.New(nil), exampleserver.New(nil)
	if a == b {
		t.Fatal("New returned the same server twice")
	}
}

func TestListTools(t *testing.T) {
	f := newFixture(t)
	res, err := f.cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"json_schema_2020_12_tool", "stream_progress", "test_audio_content", "test_elicitation",
		"test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums", "test_embedded_resource",
		"test_error_handling", "test_image_content", "test_multiple_content_types", "test_reconnection",
		"test_sampling", "test_simple_text", "test_tool_with_logging", "test_tool_with_progress",
	}
	var got []string
	schemas := map[string]map[string]any{}
	for _, tool := range res.Tools {
		got = append(got, tool.Name)
		if tool.Description == "" {
			t.Errorf("tool %s has no description", tool.Name)
		}
		raw, err := json.Marshal(tool.InputSchema)
		if err != nil {
			t.Fatal(err)
		}
		var s map[string]any
		if err := json.Unmarshal(raw, &s); err != nil || s["type"] != "object" {
			t.Errorf("tool %s input schema %s, want an object schema", tool.Name, raw)
		}
		schemas[tool.Name] = s
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tools\n got %v\nwant %v", got, want)
	}

	s := schemas["json_schema_2020_12_tool"]
	if s["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("$schema = %v", s["$schema"])
	}
	if defs, _ := s["$defs"].(map[string]any); defs["address"] == nil {
		t.Errorf("$defs = %v, want an address definition", s["$defs"])
	}
	if ap, ok := s["additionalProperties"]; !ok || ap != false {
		t.Errorf("additionalProperties = %v (present %v), want false", ap, ok)
	}
}

func TestTools(t *testing.T) {
	tests := []struct {
		name  string
		tool  string
		args  any
		check func(t *testing.T, f *fixture, res *mcp.CallToolResult)
	}{
		{"sampling", "test_sampling", map[string]any{"prompt": "Test prompt for sampling"}, func(t *testing.T, f *fixture, res *mcp.CallToolResult) {
			if got := mcptest.OnlyText(t, res); got != "LLM response: This is a test response from the client" {
				t.Errorf("text %q", got)
			}
			p := <-f.samples
			if p.MaxTokens != 100 || len(p.Messages) != 1 || p.Messages[0].Role != "user" {
				t.Fatalf("sampling request %+v, want one user message and maxTokens 100", p)
			}
			if tc, ok := p.Messages[0].Content.(*mcp.TextContent); !ok || tc.Text != "Test prompt for sampling" {
				t.Errorf("sampling message %+v", p.Messages[0].Content)
			}
		}},
		{"elicitation", "test_elicitation", map[string]any{"message": "Please provide your information"}, func(t *testing.T, f *fixture, res *mcp.CallToolResult) {
			want := `User response: action=accept, content={"email":"test@example.com","username":"testuser"}`
			if got := mcptest.OnlyText(t, res); got != want {
				t.Errorf("text %q, want %q", got, want)
			}
			p := <-f.elicits
			if p.Message != "Please provide your information" {
				t.Errorf("message %q", p.Message)
			}
			s := schemaOf(t, p)
			if !reflect.DeepEqual(s["required"], []any{"username", "email"}) {
				t.Errorf("required = %v", s["required"])
			}
			for _, k := range []string{"username", "email"} {
				if prop(s, k)["type"] != "string" {
					t.Errorf("property %s = %v", k, prop(s, k))
				}
			}
		}},
		{"elicitation defaults", "test_elicitation_sep1034_defaults", map[string]any{}, func(t *testing.T, f *fixture, res *mcp.CallToolResult) {
			want := `Elicitation completed: action=accept, content={"age":25,"name":"Jane Smith","score":88,"status":"inactive","verified":false}`
			if got := mcptest.OnlyText(t, res); got != want {
				t.Errorf("text %q, want %q", got, want)
			}
			s := schemaOf(t, <-f.elicits)
			for name, want := range map[string][2]any{
				"name": {"string", "John Doe"}, "age": {"integer", 30.0}, "score": {"number", 95.5},
				"status": {"string", "active"}, "verified": {"boolean", true},
			} {
				if p := prop(s, name); p["type"] != want[0] || p["default"] != want[1] {
					t.Errorf("property %s = %v, want type %v default %v", name, p, want[0], want[1])
				}
			}
			if !reflect.DeepEqual(prop(s, "status")["enum"], []any{"active", "inactive", "pending"}) {
				t.Errorf("status enum = %v", prop(s, "status")["enum"])
			}
		}},
		{"elicitation enums", "test_elicitation_sep1330_enums", map[string]any{}, func(t *testing.T, f *fixture, res *mcp.CallToolResult) {
			if got := mcptest.OnlyText(t, res); !strings.HasPrefix(got, "Elicitation completed: action=accept, content={") {
				t.Errorf("text %q", got)
			}
			s := schemaOf(t, <-f.elicits)
			if p := prop(s, "untitledSingle"); p["type"] != "string" || p["enum"] == nil || p["oneOf"] != nil || p["enumNames"] != nil {
				t.Errorf("untitledSingle = %v", p)
			}
			if p := prop(s, "titledSingle"); p["type"] != "string" || len(titledOptions(p["oneOf"])) != 3 || p["enum"] != nil {
				t.Errorf("titledSingle = %v", p)
			}
			if p := prop(s, "legacyEnum"); p["type"] != "string" || len(p["enum"].([]any)) != 3 || len(p["enumNames"].([]any)) != 3 {
				t.Errorf("legacyEnum = %v", p)
			}
			if p := prop(s, "untitledMulti"); p["type"] != "array" || prop(p, "")["type"] != "string" || prop(p, "")["enum"] == nil || prop(p, "")["anyOf"] != nil {
				t.Errorf("untitledMulti = %v", p)
			}
			if p := prop(s, "titledMulti"); p["type"] != "array" || len(titledOptions(prop(p, "")["anyOf"])) != 3 || prop(p, "")["enum"] != nil {
				t.Errorf("titledMulti = %v", p)
			}
		}},
		{"json schema 2020-12", "json_schema_2020_12_tool", map[string]any{"name": "x", "address": map[string]any{"city": "y"}}, func(t *testing.T, _ *fixture, res *mcp.CallToolResult) {
			if res.IsError || !strings.HasPrefix(mcptest.OnlyText(t, res), "JSON Schema 2020-12 tool called with: ") {
				t.Errorf("result %+v", res)
			}
		}},
		{"json schema 2020-12 rejects extra property", "json_schema_2020_12_tool", map[string]any{"extra": 1}, func(t *testing.T, _ *fixture, res *mcp.CallToolResult) {
			if !res.IsError {
				t.Errorf("additionalProperties: false not enforced: %+v", res)
			}
		}},
		{"reconnection without HTTP", "test_reconnection", map[string]any{}, func(t *testing.T, _ *fixture, res *mcp.CallToolResult) {
			if got := mcptest.OnlyText(t, res); got != "Reconnection test completed successfully" {
				t.Errorf("text %q", got)
			}
		}},
	}
	for _, tool := range mcptest.ExampleContentTools {
		t.Run(tool, func(t *testing.T) {
			f := newFixture(t)
			mcptest.CheckExampleResult(t, tool, f.call(t, tool, map[string]any{}, nil))
		})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			tt.check(t, f, f.call(t, tt.tool, tt.args, nil))
		})
	}
}

func schemaOf(t *testing.T, p *mcp.ElicitParams) map[string]any {
	t.Helper()
	raw, err := json.Marshal(p.RequestedSchema)
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// prop returns schema s's property name, or its items schema if name is "".
func prop(s map[string]any, name string) map[string]any {
	if name == "" {
		m, _ := s["items"].(map[string]any)
		return m
	}
	props, _ := s["properties"].(map[string]any)
	m, _ := props[name].(map[string]any)
	return m
}

// titledOptions returns the entries of a oneOf/anyOf list that have a string const and title.
func titledOptions(v any) []any {
	var ok []any
	list, _ := v.([]any)
	for _, e := range list {
		m, _ := e.(map[string]any)
		if _, c := m["const"].(string); c {
			if _, tt := m["title"].(string); tt {
				ok = append(ok, e)
			}
		}
	}
	return ok
}

func TestToolWithLogging(t *testing.T) {
	tests := []struct {
		name  string
		level mcp.LoggingLevel
		want  []any
	}{
		{"debug shows all", "debug", []any{"Tool execution started", "Tool processing data", "Tool execution completed"}},
		{"info shows all", "info", []any{"Tool execution started", "Tool processing data", "Tool execution completed"}},
		{"warning filters info", "warning", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			if err := f.cs.SetLoggingLevel(t.Context(), &mcp.SetLoggingLevelParams{Level: tt.level}); err != nil {
				t.Fatalf("setLevel: %v", err)
			}
			f.call(t, "test_tool_with_logging", map[string]any{}, nil)
			var got []any
			for _, e := range f.barrier(t) {
				if e.kind != "log" || e.level != "info" {
					t.Errorf("unexpected event %+v", e)
				}
				got = append(got, e.data)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("logs %v, want %v", got, tt.want)
			}
		})
	}
}

func TestToolWithProgress(t *testing.T) {
	f := newFixture(t)
	f.call(t, "test_tool_with_progress", map[string]any{}, "progress-test-1")
	var got []float64
	for _, e := range f.barrier(t) {
		if e.kind != "progress" || e.token != "progress-test-1" || e.total != 100 {
			t.Errorf("unexpected event %+v", e)
		}
		got = append(got, e.progress)
	}
	if want := []float64{0, 50, 100}; !reflect.DeepEqual(got, want) {
		t.Errorf("progress %v, want %v", got, want)
	}
}

func TestStreamProgress(t *testing.T) {
	tests := []struct {
		name  string
		args  map[string]any
		token any
		want  int  // events and count in the result text
		logs  bool // log lines instead of progress notifications
	}{
		{"burst", map[string]any{"count": 50, "interval_ms": 0}, "tok", 50, false},
		{"paced", map[string]any{"count": 3, "interval_ms": 5}, "tok", 3, false},
		{"numeric token", map[string]any{"count": 2, "interval_ms": 0}, 7, 2, false},
		{"default count", map[string]any{"interval_ms": 0}, "tok", 20, false},
		{"zero", map[string]any{"count": 0}, "tok", 0, false},
		{"no token logs", map[string]any{"count": 4, "interval_ms": 0}, nil, 4, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			if err := f.cs.SetLoggingLevel(t.Context(), &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
				t.Fatal(err)
			}
			res := f.call(t, "stream_progress", tt.args, tt.token)
			if got, want := mcptest.OnlyText(t, res), fmt.Sprintf("streamed %d events", tt.want); res.IsError || got != want {
				t.Errorf("result %q (isError %v), want %q", got, res.IsError, want)
			}
			evs := f.barrier(t)
			if len(evs) != tt.want {
				t.Fatalf("got %d events, want exactly %d: %+v", len(evs), tt.want, evs)
			}
			for i, e := range evs {
				step := i + 1
				if tt.logs {
					if want := fmt.Sprintf("step %d of %d", step, tt.want); e.kind != "log" || e.data != want {
						t.Errorf("event %d = %+v, want log %q", i, e, want)
					}
					continue
				}
				// JSON numbers arrive as float64.
				wantTok := tt.token
				if n, ok := tt.token.(int); ok {
					wantTok = float64(n)
				}
				if e.kind != "progress" || e.token != wantTok || e.progress != float64(step) || e.total != float64(tt.want) {
					t.Errorf("event %d = %+v, want progress %d/%d on %v", i, e, step, tt.want, tt.token)
				}
			}
		})
	}
}

func TestStreamProgressRejectsBadArguments(t *testing.T) {
	tests := []struct {
		name string
		args map[string]any
	}{
		{"count too large", map[string]any{"count": 100001}},
		{"negative count", map[string]any{"count": -1}},
		{"negative interval", map[string]any{"interval_ms": -1}},
		{"count not a number", map[string]any{"count": "many"}},
		{"unknown argument", map[string]any{"cnt": 3}},
	}
	f := newFixture(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := f.call(t, "stream_progress", tt.args, "tok")
			if !res.IsError {
				t.Errorf("got %+v, want a tool error", res.Content)
			}
		})
	}
	if evs := f.barrier(t); len(evs) != 0 {
		t.Errorf("rejected calls sent %d notifications", len(evs))
	}
}

func TestStreamProgressStopsOnCancel(t *testing.T) {
	f := newFixture(t)
	const count = 100000
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	wait, stopWaiting := context.WithTimeout(t.Context(), waitLimit)
	defer stopWaiting()
	done := make(chan error, 1)
	go func() {
		p := &mcp.CallToolParams{Name: "stream_progress", Arguments: map[string]any{"count": count, "interval_ms": 1}}
		p.SetProgressToken("cancel-me")
		_, err := f.cs.CallTool(ctx, p)
		done <- err
	}()
	for i := range 3 {
		select {
		case e := <-f.events:
			if e.progress != float64(i+1) {
				t.Fatalf("event %d = %+v", i, e)
			}
		case <-wait.Done():
			t.Fatal("no progress before cancellation")
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("CallTool error %v, want context.Canceled", err)
		}
	case <-wait.Done():
		t.Fatal("CallTool did not return after cancellation")
	}
	// The server logs when the tool stops early; wait for that record.
	for {
		var r slog.Record
		select {
		case r = <-f.records:
		case <-wait.Done():
			t.Fatal("server never reported that stream_progress stopped")
		}
		if r.Message != "stream stopped early" {
			continue
		}
		attrs := map[string]slog.Value{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
		if err, _ := attrs["err"].Any().(error); !errors.Is(err, context.Canceled) {
			t.Errorf("stopped with %v, want context.Canceled", attrs["err"])
		}
		if sent := attrs["sent"].Int64(); sent < 3 || sent >= count {
			t.Errorf("sent %d before stopping, want between 3 and %d", sent, count)
		}
		return
	}
}

func TestResources(t *testing.T) {
	f := newFixture(t)
	list, err := f.cs.ListResources(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, r := range list.Resources {
		if r.Name == "" || r.Description == "" {
			t.Errorf("resource %+v lacks a name or description", r)
		}
		uris = append(uris, r.URI)
	}
	if want := []string{"test://static-binary", "test://static-text", "test://watched-resource"}; !reflect.DeepEqual(uris, want) {
		t.Errorf("resources %v, want %v", uris, want)
	}
	tmpl, err := f.cs.ListResourceTemplates(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tmpl.ResourceTemplates) != 1 || tmpl.ResourceTemplates[0].URITemplate != "test://template/{id}/data" {
		t.Errorf("templates %+v", tmpl.ResourceTemplates)
	}

	tests := []struct {
		name string
		uri  string
		want mcp.ResourceContents // Blob is checked as a PNG when non-nil
	}{
		{"static text", "test://static-text", mcp.ResourceContents{URI: "test://static-text", MIMEType: "text/plain", Text: "This is the content of the static text resource."}},
		{"static binary", "test://static-binary", mcp.ResourceContents{URI: "test://static-binary", MIMEType: "image/png", Blob: []byte{}}},
		{"watched", "test://watched-resource", mcp.ResourceContents{URI: "test://watched-resource", MIMEType: "text/plain", Text: "Watched resource content"}},
		{"template", "test://template/123/data", mcp.ResourceContents{URI: "test://template/123/data", MIMEType: "application/json", Text: `{"id":"123","templateTest":true,"data":"Data for ID: 123"}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := f.cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: tt.uri})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Contents) != 1 {
				t.Fatalf("%d contents, want 1", len(res.Contents))
			}
			got := *res.Contents[0]
			if tt.want.Blob != nil {
				mcptest.CheckPNG(t, got.Blob)
				got.Blob, tt.want.Blob = nil, nil
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	t.Run("unknown", func(t *testing.T) {
		if _, err := f.cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "test://nope"}); err == nil {
			t.Error("reading an unknown resource succeeded")
		}
	})
}

func TestSubscribe(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	if err := f.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://watched-resource"}); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	// The SDK tracks the subscription: an update reaches this session.
	if err := f.srv.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "test://watched-resource"}); err != nil {
		t.Fatal(err)
	}
	if evs := f.barrier(t); len(evs) != 1 || evs[0].kind != "updated" || evs[0].data != "test://watched-resource" {
		t.Errorf("after subscribe got %+v, want one update", evs)
	}
	if err := f.cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: "test://watched-resource"}); err != nil {
		t.Fatalf("unsubscribe: %v", err)
	}
	if err := f.srv.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "test://watched-resource"}); err != nil {
		t.Fatal(err)
	}
	if evs := f.barrier(t); len(evs) != 0 {
		t.Errorf("after unsubscribe got %+v, want nothing", evs)
	}
	if err := f.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://nope"}); err == nil {
		t.Error("subscribing to an unknown resource succeeded")
	}
}

func TestPrompts(t *testing.T) {
	f := newFixture(t)
	list, err := f.cs.ListPrompts(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range list.Prompts {
		if p.Description == "" {
			t.Errorf("prompt %s has no description", p.Name)
		}
		names = append(names, p.Name)
	}
	if want := []string{"test_prompt_with_arguments", "test_prompt_with_embedded_resource", "test_prompt_with_image", "test_simple_prompt"}; !reflect.DeepEqual(names, want) {
		t.Errorf("prompts %v, want %v", names, want)
	}

	for _, p := range mcptest.ExamplePrompts {
		t.Run(p.Name, func(t *testing.T) {
			res, err := f.cs.GetPrompt(t.Context(), &mcp.GetPromptParams{Name: p.Name, Arguments: p.Args})
			if err != nil {
				t.Fatal(err)
			}
			mcptest.CheckPrompt(t, p, res)
		})
	}
}

func TestComplete(t *testing.T) {
	f := newFixture(t)
	prompt := &mcp.CompleteReference{Type: "ref/prompt", Name: "test_prompt_with_arguments"}
	tmpl := &mcp.CompleteReference{Type: "ref/resource", URI: "test://template/{id}/data"}
	tests := []struct {
		name  string
		ref   *mcp.CompleteReference
		arg   string
		value string
		want  []string
	}{
		{"suite request", prompt, "arg1", "test", []string{}},
		{"prefix", prompt, "arg1", "par", []string{"paris", "park", "party"}},
		{"narrow prefix", prompt, "arg1", "pari", []string{"paris"}},
		{"second argument", prompt, "arg2", "", []string{"hello", "world"}},
		{"template", tmpl, "id", "1", []string{"1", "123"}},
		{"unknown prompt", &mcp.CompleteReference{Type: "ref/prompt", Name: "nope"}, "x", "", []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := f.cs.Complete(t.Context(), &mcp.CompleteParams{Ref: tt.ref, Argument: mcp.CompleteParamsArgument{Name: tt.arg, Value: tt.value}})
			if err != nil {
				t.Fatal(err)
			}
			// A nil slice here would mean the server sent "values": null.
			if res.Completion.Values == nil || !reflect.DeepEqual(res.Completion.Values, tt.want) {
				t.Errorf("values %#v, want %#v", res.Completion.Values, tt.want)
			}
		})
	}
}

// sseEvent is one parsed server-sent event.
type sseEvent struct{ id, name, data, retry string }

// readSSE parses r until EOF or until stop returns true.
func readSSE(t *testing.T, r io.Reader, stop func(sseEvent) bool) []sseEvent {
	t.Helper()
	var evs []sseEvent
	var cur sseEvent
	var seen bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if seen {
				evs = append(evs, cur)
				if stop(cur) {
					return evs
				}
			}
			cur, seen = sseEvent{}, false
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		seen = true
		switch field {
		case "id":
			cur.id = value
		case "event":
			cur.name = value
		case "data":
			cur.data += value
		case "retry":
			cur.retry = value
		}
	}
	return evs
}

// TestReconnectionOverHTTP runs the conformance suite's server-sse-polling
// exchange by hand against the SDK's own Streamable HTTP handler: the POST
// stream must end without the tool result, and a GET with Last-Event-ID must
// then deliver it.
func TestReconnectionOverHTTP(t *testing.T) {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return exampleserver.New(nil) },
		&mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	ts := httptest.NewServer(h)
	defer ts.Close()

	ctx, cancel := context.WithTimeout(t.Context(), waitLimit) // bounds reads of streams that never end
	defer cancel()
	session := ""
	post := func(body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", legacyVersion)
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode/100 != 2 {
			t.Fatalf("POST %s: %s", body, resp.Status)
		}
		return resp
	}
	resp := post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"` + legacyVersion +
		`","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	session = resp.Header.Get("Mcp-Session-Id")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if session == "" {
		t.Fatal("no session id")
	}
	resp = post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	resp.Body.Close()

	isResult := func(e sseEvent) bool {
		return strings.Contains(e.data, `"id":1,`) && strings.Contains(e.data, `"result"`)
	}
	resp = post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_reconnection","arguments":{}}}`)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("tools/call answered with %q, want an SSE stream", ct)
	}
	postEvents := readSSE(t, resp.Body, isResult) // runs until the server closes the stream
	resp.Body.Close()
	var lastID, retry string
	for _, e := range postEvents {
		if isResult(e) {
			t.Fatalf("result arrived on the POST stream: %+v", postEvents)
		}
		if e.id != "" {
			lastID = e.id
		}
		if e.retry != "" {
			retry = e.retry
		}
	}
	if len(postEvents) == 0 || postEvents[0].id == "" || postEvents[0].data != "" {
		t.Errorf("POST stream %+v, want a priming event (id, empty data) first", postEvents)
	}
	if retry == "" {
		t.Errorf("POST stream %+v carries no retry field", postEvents)
	}
	if lastID == "" {
		t.Fatal("no event id to resume from")
	}

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", session)
	req.Header.Set("MCP-Protocol-Version", legacyVersion)
	req.Header.Set("Last-Event-ID", lastID)
	gresp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer gresp.Body.Close()
	if gresp.StatusCode != http.StatusOK {
		t.Fatalf("GET resume: %s", gresp.Status)
	}
	getEvents := readSSE(t, gresp.Body, isResult)
	if len(getEvents) == 0 || !isResult(getEvents[len(getEvents)-1]) {
		t.Fatalf("GET resume delivered %+v, want the tool result", getEvents)
	}
	var msg struct {
		Result mcp.CallToolResult `json:"result"`
	}
	if err := json.Unmarshal([]byte(getEvents[len(getEvents)-1].data), &msg); err != nil {
		t.Fatal(err)
	}
	if msg.Result.IsError || len(msg.Result.Content) != 1 {
		t.Fatalf("result %+v", msg.Result)
	}
	if tc, ok := msg.Result.Content[0].(*mcp.TextContent); !ok || tc.Text != "Reconnection test completed successfully" {
		t.Errorf("result content %+v", msg.Result.Content[0])
	}
}

// TestReconnectionGoClient checks that the official Go client, which resumes
// on its own, gets test_reconnection's result through the SDK handler.
func TestReconnectionGoClient(t *testing.T) {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return exampleserver.New(nil) },
		&mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	ts := httptest.NewServer(h)
	defer ts.Close()
	client := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	cs, err := client.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: ts.URL}, &mcp.ClientSessionOptions{ProtocolVersion: legacyVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_reconnection"})
	if err != nil {
		t.Fatal(err)
	}
	if got := mcptest.OnlyText(t, res); got != "Reconnection test completed successfully" {
		t.Errorf("text %q", got)
	}
}
