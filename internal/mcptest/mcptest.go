// Package mcptest provides helpers shared by mcprelay's tests: a backend
// that can be "restarted" as by a crash, a recorder of the headers a backend
// receives, checks of tool results, and the raw side of the wire: a request
// built by hand and the JSON-RPC message read back.
package mcptest

import (
	"bytes"
	"context"
	"image/png"
	"net/http"
	"reflect"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Restartable is an in-process backend that can be restarted as by a
// crash: the old server's in-flight requests are cut and a new server,
// built by make, which knows no session, takes over.
type Restartable struct {
	make func() http.Handler

	mu     sync.Mutex
	h      http.Handler
	ctx    context.Context
	cancel context.CancelFunc
}

// NewRestartable starts a backend built by make.
func NewRestartable(make func() http.Handler) *Restartable {
	r := &Restartable{make: make}
	r.Restart()
	return r
}

// Restart cuts every request in flight and replaces the server.
func (r *Restartable) Restart() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		r.cancel()
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.h = r.make()
}

// Stop cuts every request in flight (the server keeps answering new ones).
func (r *Restartable) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cancel()
}

func (r *Restartable) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	h, ctx := r.h, r.ctx
	r.mu.Unlock()
	rctx, cancel := context.WithCancel(req.Context())
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	h.ServeHTTP(w, req.WithContext(rctx))
}

// OnlyText returns the text of a result that holds exactly one text item,
// failing the test otherwise.
func OnlyText(t testing.TB, res *mcp.CallToolResult) string {
	t.Helper()
	if len(res.Content) != 1 {
		t.Fatalf("content has %d items, want 1: %+v", len(res.Content), res.Content)
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("content is %T, want text", res.Content[0])
	}
	return tc.Text
}

// CheckPNG fails the test unless data decodes as a PNG image.
func CheckPNG(t testing.TB, data []byte) {
	t.Helper()
	if _, err := png.Decode(bytes.NewReader(data)); err != nil {
		t.Errorf("image data is not a valid PNG: %v", err)
	}
}

// HeaderRecorder is an http.Handler that records the values of the headers
// named in Names on every request, then passes it to H: what a backend
// received from the relay.
type HeaderRecorder struct {
	H     http.Handler
	Names []string

	mu   sync.Mutex
	reqs []Recorded
}

// Recorded is one request a HeaderRecorder saw: its method, path, and the
// values of the named headers, in the order of Names.
type Recorded struct {
	Method, Path string
	Values       []string
}

func (hr *HeaderRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := Recorded{Method: r.Method, Path: r.URL.Path}
	for _, n := range hr.Names {
		rec.Values = append(rec.Values, r.Header.Get(n))
	}
	hr.mu.Lock()
	hr.reqs = append(hr.reqs, rec)
	hr.mu.Unlock()
	hr.H.ServeHTTP(w, r)
}

// Take returns the requests recorded since the last Take.
func (hr *HeaderRecorder) Take() []Recorded {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	out := hr.reqs
	hr.reqs = nil
	return out
}

// Prompt is one prompt of the example server (package exampleserver) and
// the messages prompts/get returns for it, all with role "user".
type Prompt struct {
	Name string
	Args map[string]string
	Want []mcp.Content // an *mcp.ImageContent entry only needs to hold a PNG
}

// ExamplePrompts are the example server's prompts, in name order.
var ExamplePrompts = []Prompt{
	{"test_prompt_with_arguments", map[string]string{"arg1": "hello", "arg2": "world"},
		[]mcp.Content{text("Prompt with arguments: arg1='hello', arg2='world'")}},
	{"test_prompt_with_embedded_resource", map[string]string{"resourceUri": "test://example-resource"}, []mcp.Content{
		&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "test://example-resource", MIMEType: "text/plain", Text: "Embedded resource content for testing."}},
		text("Please process the embedded resource above."),
	}},
	{"test_prompt_with_image", nil, []mcp.Content{&mcp.ImageContent{MIMEType: "image/png"}, text("Please analyze the image above.")}},
	{"test_simple_prompt", nil, []mcp.Content{text("This is a simple prompt for testing.")}},
}

func text(s string) mcp.Content { return &mcp.TextContent{Text: s} }

// CheckPrompt fails the test unless res holds p's messages.
func CheckPrompt(t testing.TB, p Prompt, res *mcp.GetPromptResult) {
	t.Helper()
	if len(res.Messages) != len(p.Want) {
		t.Errorf("%s: %d messages, want %d", p.Name, len(res.Messages), len(p.Want))
		return
	}
	for i, m := range res.Messages {
		got := m.Content
		if img, ok := got.(*mcp.ImageContent); ok {
			CheckPNG(t, img.Data)
			got = &mcp.ImageContent{MIMEType: img.MIMEType}
		}
		if m.Role != "user" || !reflect.DeepEqual(got, p.Want[i]) {
			t.Errorf("%s message %d = %s %+v, want user %+v", p.Name, i, m.Role, got, p.Want[i])
		}
	}
}

// ExampleContentTools are the example server's tools whose result is fixed
// content, which CheckExampleResult checks.
var ExampleContentTools = []string{"test_simple_text", "test_image_content", "test_audio_content",
	"test_embedded_resource", "test_multiple_content_types", "test_error_handling"}

// CheckExampleResult fails the test unless res is what the example server's
// tool (one of ExampleContentTools) answers.
func CheckExampleResult(t testing.TB, tool string, res *mcp.CallToolResult) {
	t.Helper()
	checkResource := func(c mcp.Content, want mcp.ResourceContents) {
		t.Helper()
		if r, ok := c.(*mcp.EmbeddedResource); !ok || r.Resource == nil || !reflect.DeepEqual(*r.Resource, want) {
			t.Errorf("%s: content %+v, want resource %+v", tool, c, want)
		}
	}
	switch tool {
	case "test_simple_text":
		if got := OnlyText(t, res); got != "This is a simple text response for testing." {
			t.Errorf("%s: text %q", tool, got)
		}
	case "test_image_content":
		img, ok := res.Content[0].(*mcp.ImageContent)
		if len(res.Content) != 1 || !ok || img.MIMEType != "image/png" {
			t.Fatalf("%s: content %+v, want one image/png", tool, res.Content)
		}
		CheckPNG(t, img.Data)
	case "test_audio_content":
		a, ok := res.Content[0].(*mcp.AudioContent)
		if len(res.Content) != 1 || !ok || a.MIMEType != "audio/wav" {
			t.Fatalf("%s: content %+v, want one audio/wav", tool, res.Content)
		}
		if len(a.Data) < 44 || string(a.Data[:4]) != "RIFF" || string(a.Data[8:16]) != "WAVEfmt " {
			t.Errorf("%s: audio data is not a WAV file: % x", tool, a.Data[:min(16, len(a.Data))])
		}
	case "test_embedded_resource":
		if len(res.Content) != 1 {
			t.Fatalf("%s: content %+v, want one resource", tool, res.Content)
		}
		checkResource(res.Content[0], mcp.ResourceContents{URI: "test://embedded-resource", MIMEType: "text/plain", Text: "This is an embedded resource content."})
	case "test_multiple_content_types":
		if len(res.Content) != 3 {
			t.Fatalf("%s: content has %d items, want 3", tool, len(res.Content))
		}
		if tc, ok := res.Content[0].(*mcp.TextContent); !ok || tc.Text != "Multiple content types test:" {
			t.Errorf("%s: item 0 = %+v", tool, res.Content[0])
		}
		if img, ok := res.Content[1].(*mcp.ImageContent); !ok || img.MIMEType != "image/png" {
			t.Errorf("%s: item 1 = %+v", tool, res.Content[1])
		} else {
			CheckPNG(t, img.Data)
		}
		checkResource(res.Content[2], mcp.ResourceContents{URI: "test://mixed-content-resource", MIMEType: "application/json", Text: `{"test":"data","value":123}`})
	case "test_error_handling":
		if !res.IsError || OnlyText(t, res) != "This tool intentionally returns an error for testing" {
			t.Errorf("%s: result %+v, want the tool error", tool, res)
		}
	default:
		t.Fatalf("CheckExampleResult: %s is not one of ExampleContentTools", tool)
	}
}
