package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/relay"
)

// probe GETs h's /readyz and returns its status and body.
func probe(t *testing.T, h http.Handler) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	return w.Code, strings.TrimSpace(w.Body.String())
}

// awaitReady probes until /readyz answers want (readiness of a URL
// upstream is cached for a second), failing after a minute.
func awaitReady(t *testing.T, h http.Handler, want int) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		code, body := probe(t, h)
		if code == want {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: %d %q, want %d", code, body, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serveUpstream serves an MCP server on ln until the returned server is
// closed.
func serveUpstream(ln net.Listener) *http.Server {
	srv := &http.Server{Handler: backend.SDKHandler(testServer(nil), &mcp.StreamableHTTPOptions{})}
	go srv.Serve(ln)
	return srv
}

// TestReadyzUpstream: readiness follows a URL upstream that goes away and
// comes back on the same address, and is 503 while draining.
func TestReadyzUpstream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	up := serveUpstream(ln)
	var logs syncBuffer
	e := newEnv(t, relay.Options{
		Backend: backend.Remote("http://" + addr + "/mcp"),
		Logger:  slog.New(slog.NewTextHandler(&logs, nil)),
	})
	readyz := e.relay.Readyz()
	if code, body := probe(t, readyz); code != http.StatusOK || body != "ready" {
		t.Fatalf("/readyz with the upstream up: %d %q", code, body)
	}
	if code, body := probe(t, relay.Healthz()); code != http.StatusOK || body != "ok" {
		t.Fatalf("/healthz: %d %q", code, body)
	}

	up.Close()
	body := awaitReady(t, readyz, http.StatusServiceUnavailable)
	if body != "not ready: upstream unreachable" {
		t.Errorf("/readyz with the upstream gone: %q", body)
	}
	if !strings.Contains(logs.String(), addr) {
		t.Errorf("the cause of not being ready is not logged:\n%s", logs.String())
	}
	if code, _ := probe(t, relay.Healthz()); code != http.StatusOK {
		t.Errorf("/healthz with the upstream gone: %d", code)
	}

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	up = serveUpstream(ln)
	defer up.Close()
	awaitReady(t, readyz, http.StatusOK)

	e.relay.Shutdown(context.Background())
	if code, body := probe(t, readyz); code != http.StatusServiceUnavailable || body != "not ready: draining" {
		t.Errorf("/readyz while draining: %d %q", code, body)
	}
}

// unwritable is a store that says it takes no writes.
type unwritable struct{ eventlog.Store }

func (unwritable) Ready(context.Context) error {
	return errors.New("disk /var/lib/mcprelay full")
}

func TestReadyzStore(t *testing.T) {
	e := newEnv(t, relay.Options{Store: unwritable{eventlog.NewMemory(eventlog.Retention{})}})
	if code, body := probe(t, e.relay.Readyz()); code != http.StatusServiceUnavailable || body != "not ready: store not writable" {
		t.Errorf("/readyz with an unwritable store: %d %q", code, body)
	}
}

func TestReadyzDraining(t *testing.T) {
	e := newEnv(t, relay.Options{})
	if code, _ := probe(t, e.relay.Readyz()); code != http.StatusOK {
		t.Fatalf("/readyz: %d", code)
	}
	e.relay.Shutdown(context.Background())
	if code, body := probe(t, e.relay.Readyz()); code != http.StatusServiceUnavailable || body != "not ready: draining" {
		t.Errorf("/readyz while draining: %d %q", code, body)
	}
}

// However often /readyz is probed, a URL upstream gets about one request
// a second from it.
func TestReadyzCachesUpstreamCheck(t *testing.T) {
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			hits.Add(1)
		}
		http.Error(w, "no", http.StatusMethodNotAllowed)
	}))
	defer up.Close()
	e := newEnv(t, relay.Options{Backend: backend.Remote(up.URL)})
	start := time.Now()
	const probes = 200
	for range probes {
		if code, body := probe(t, e.relay.Readyz()); code != http.StatusOK {
			t.Fatalf("/readyz: %d %q", code, body)
		}
	}
	// One check per started second, whatever the machine's speed.
	if max := 1 + int64(time.Since(start)/time.Second); hits.Load() > max {
		t.Errorf("%d probes cost the upstream %d requests, want at most %d", probes, hits.Load(), max)
	}
}
