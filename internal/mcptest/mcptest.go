// Package mcptest provides helpers shared by mcprelay's tests: a backend
// that can be "restarted" as by a crash, a recorder of the headers a backend
// receives, and checks of tool results.
package mcptest

import (
	"bytes"
	"context"
	"image/png"
	"net/http"
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
