package relay_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/relay"
)

// TestAccessLog: one line per request at the chosen level, with the HTTP
// and JSON-RPC methods, a short session tag (never the whole ID), status,
// duration and bytes.
func TestAccessLog(t *testing.T) {
	var buf syncBuffer
	e := newEnv(t, relay.Options{
		Logger:    slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})),
		AccessLog: slog.LevelInfo,
	})
	s := e.initialize("2025-11-25", "")
	_, resp := s.call(3, 0, true)
	if _, ended := events(t, resp, 0, 10*time.Second); !ended {
		t.Fatal("tools/call stream did not end")
	}
	// The stream has ended: its handler has returned and logged.
	var line string
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, "rpc=tools/call") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no access log line for tools/call in:\n%s", buf.String())
	}
	for _, want := range []string{"level=INFO", "msg=request", "method=POST", "session=" + s.id[:6] + " ", "status=200", "duration=", "bytes="} {
		if !strings.Contains(line, want) {
			t.Errorf("access log line lacks %q: %s", want, line)
		}
	}
	if strings.Contains(line, s.id) {
		t.Errorf("access log line holds the whole session ID: %s", line)
	}
	if strings.Contains(line, "bytes=0") {
		t.Errorf("access log line counts no bytes for an SSE answer: %s", line)
	}
}

// TestAccessLogLevel: access log lines at debug are not written by a
// logger at info, and no AccessLog means none at all.
func TestAccessLogLevel(t *testing.T) {
	for _, opt := range []slog.Leveler{nil, slog.LevelDebug} {
		var buf syncBuffer
		e := newEnv(t, relay.Options{
			Logger:    slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})),
			AccessLog: opt,
		})
		s := e.initialize("2025-11-25", "")
		_, resp := s.call(1, 0, true)
		events(t, resp, 0, 10*time.Second)
		if strings.Contains(buf.String(), "msg=request") {
			t.Errorf("AccessLog %v with an info logger: access lines written:\n%s", opt, buf.String())
		}
	}
}

// failingReads is a store whose stream reads fail with an error naming an
// internal address.
type failingReads struct{ eventlog.Store }

const internalAddr = "10.9.8.7:6379"

func (f failingReads) Read(ctx context.Context, key string, after uint64, max int, buf []eventlog.Event) (eventlog.Stream, []eventlog.Event, error) {
	if max == 0 {
		return eventlog.Stream{}, nil, errors.New("dial tcp " + internalAddr + ": connection refused")
	}
	return f.Store.Read(ctx, key, after, max, buf)
}

// A store error met while deciding a resume is logged, and the client's
// answer (503) does not carry its text.
func TestResumeStoreErrorNamesNoAddress(t *testing.T) {
	var buf syncBuffer
	e := newEnv(t, relay.Options{
		Store:  failingReads{eventlog.NewMemory(eventlog.Retention{})},
		Logger: slog.New(slog.NewTextHandler(&buf, nil)),
	})
	s := e.initialize("2025-11-25", "")
	_, resp := s.call(1, 0, true)
	evs, _ := events(t, resp, 0, 10*time.Second)
	r := s.get(lastID(evs))
	body := readBody(t, r)
	if r.StatusCode != http.StatusServiceUnavailable || strings.Contains(body, internalAddr) {
		t.Errorf("resume with a failing store: %s %q, want 503 naming no address", r.Status, body)
	}
	if !strings.Contains(buf.String(), internalAddr) {
		t.Errorf("the store's error is not logged:\n%s", buf.String())
	}
}

// An upstream that goes away: the client's 502 bodies (a call, a
// notification, a stateless request) name neither its URL nor its
// address; the log has the cause at warn and the metrics count it.
func TestUpstreamErrorsNameNoAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	up := httptest.NewUnstartedServer(newEnv(t, relay.Options{}).relay) // a relay is a Streamable HTTP server too
	up.Listener.Close()
	up.Listener = ln
	up.Start()
	var buf syncBuffer
	e := newEnv(t, relay.Options{
		Backend: backend.Remote(up.URL),
		Logger:  slog.New(slog.NewTextHandler(&buf, nil)),
	})
	s := e.initialize("2025-11-25", "")
	up.CloseClientConnections()
	up.Close()

	for _, c := range []struct {
		name string
		resp *http.Response
	}{
		{"call", s.post(`{"jsonrpc":"2.0","id":7,"method":"tools/list"}`)},
		{"notification", s.post(`{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`)},
		{"stateless", e.do("POST", map[string]string{"Mcp-Protocol-Version": "2026-07-28"}, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)},
	} {
		body := readBody(t, c.resp)
		if c.resp.StatusCode != http.StatusBadGateway {
			t.Errorf("%s: %s %s, want 502", c.name, c.resp.Status, body)
		}
		if strings.Contains(body, addr) || strings.Contains(body, "127.0.0.1") {
			t.Errorf("%s: the body names the upstream: %s", c.name, body)
		}
	}
	logs := buf.String()
	if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "cause=unreachable") || !strings.Contains(logs, addr) {
		t.Errorf("upstream failures not logged at warn with their cause and detail:\n%s", logs)
	}
	if got := value(scrape(t, e.relay), "mcprelay_upstream_errors_total", "cause", "unreachable"); got != 3 {
		t.Errorf("mcprelay_upstream_errors_total{cause=unreachable} = %v, want 3", got)
	}
}

// A stateless request whose backend cannot even be addressed: a 502 whose
// body does not carry the URL (the error text does).
func TestStatelessBadURLNamesNoURL(t *testing.T) {
	const secretURL = "http://internal.example:9/\x7fmcp"
	e := newEnv(t, relay.Options{Backend: &backend.Upstream{URL: "http://127.0.0.1:9/mcp", StatelessURL: secretURL}})
	r := e.do("POST", map[string]string{"Mcp-Protocol-Version": "2026-07-28"}, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	body := readBody(t, r)
	if r.StatusCode != http.StatusBadGateway || strings.Contains(body, "internal.example") {
		t.Errorf("stateless with a bad URL: %s %q, want 502 naming no URL", r.Status, body)
	}
}

// The backend's own session ID never reaches the client, even when a
// stateless backend sends one.
func TestStatelessHidesBackendSessionID(t *testing.T) {
	const backendSID = "backend-session-4711"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Mcp-Session-Id", backendSID)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`)
	}))
	defer up.Close()
	e := newEnv(t, relay.Options{Backend: backend.Remote(up.URL)})
	r := e.do("POST", map[string]string{"Mcp-Protocol-Version": "2026-07-28"}, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	body := readBody(t, r)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("stateless: %s %s", r.Status, body)
	}
	if got := r.Header.Get("Mcp-Session-Id"); got != "" {
		t.Errorf("the client got the backend's session ID %q", got)
	}
}
