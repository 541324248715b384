package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/backend/stdio"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/relay"
)

const stdioChildEnv = "MCPRELAY_CMD_TEST_EXAMPLE_STDIO"

// TestExampleServerStdioChild is not a test: re-executed by
// TestExampleServerStdio, it is "mcprelay example-server --stdio".
func TestExampleServerStdioChild(t *testing.T) {
	if os.Getenv(stdioChildEnv) == "" {
		t.Skip("run by TestExampleServerStdio")
	}
	if err := exampleServer([]string{"--stdio", "--log-level", "debug"}); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

// TestExampleServerStdio runs "example-server --stdio" behind the stdio
// connector: initialize and a tool call answer, and the child exits when
// the session is closed.
func TestExampleServerStdio(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts, err := stdioOptions([]string{exe, "-test.run=^TestExampleServerStdioChild$"}, 0, []string{stdioChildEnv + "=1"}, "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := stdio.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s, resp, err := c.Open(ctx, backend.Init{Request: []byte(`{"jsonrpc":"2.0","id":"i","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if !strings.Contains(string(resp), `"id":"i"`) || !strings.Contains(string(resp), `"mcprelay-exampleserver"`) {
		t.Fatalf("initialize response %s", resp)
	}
	s.Notify(t.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	r, err := s.Call(context.Background(), []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_simple_text"}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Next()
	if err != nil || !strings.Contains(string(m), "This is a simple text response for testing.") {
		t.Fatalf("tool call: %s, %v", m, err)
	}
	s.Close()
	if n := c.Children(); n != 0 {
		t.Fatalf("%d children after Close", n)
	}
}

func TestStdioOptions(t *testing.T) {
	f := filepath.Join(t.TempDir(), "env")
	os.WriteFile(f, []byte("# secrets\nTOKEN=file\nA=1\n"), 0o600)
	o, err := stdioOptions([]string{"npx", "server"}, 8, []string{"TOKEN=flag"}, f, "/srv", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Command, []string{"npx", "server"}) || o.MaxChildren != 8 || o.Dir != "/srv" ||
		!slices.Equal(o.Env, []string{"TOKEN=file", "A=1", "TOKEN=flag"}) {
		t.Fatalf("options %+v", o)
	}
	for _, bad := range []func() error{
		func() error { _, err := stdioOptions(nil, 0, nil, "", "", nil); return err },
		func() error { _, err := stdioOptions([]string{"x"}, -1, nil, "", "", nil); return err },
		func() error { _, err := stdioOptions([]string{"x"}, 0, []string{"NOVALUE"}, "", "", nil); return err },
		func() error { _, err := stdioOptions([]string{"x"}, 0, nil, f+".missing", "", nil); return err },
	} {
		if bad() == nil {
			t.Error("bad options accepted")
		}
	}
	var e envList
	if e.Set("K=V") != nil || e.Set("bad") == nil || e.String() != "K=V" {
		t.Errorf("envList: %q", e)
	}
}

// stdioRelay serves a relay on store in front of "example-server --stdio"
// children (this test binary re-executed), on a loopback listener.
func stdioRelay(t *testing.T, store eventlog.Store) (url string, c *stdio.Connector, stop func()) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts, err := stdioOptions([]string{exe, "-test.run=^TestExampleServerStdioChild$"}, 0, []string{stdioChildEnv + "=1"}, "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c, err = stdio.New(opts); err != nil {
		t.Fatal(err)
	}
	h, err := relay.New(relay.Options{Backend: c, Store: store, Secret: []byte("stdio-test-secret-0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	return srv.URL, c, func() { srv.CloseClientConnections(); srv.Close(); h.Close(); c.Close() }
}

func post(t *testing.T, url, sid, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// A stdio session survives a relay restart (the store keeps it): the next
// request restores it with a new child. And a stateless 2026-07-28 request
// gets a clear error from a stdio backend.
func TestStdioRestoreAndStateless(t *testing.T) {
	store := eventlog.NewMemory(eventlog.Retention{})
	url, c, stop := stdioRelay(t, store)
	resp, _ := post(t, url, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || sid == "" {
		t.Fatalf("initialize: %s", resp.Status)
	}
	post(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if _, body := post(t, url, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_simple_text"}}`); !strings.Contains(body, "This is a simple text response for testing.") {
		t.Fatalf("call before the restart: %s", body)
	}
	if n := c.Children(); n != 1 {
		t.Fatalf("%d children, want 1", n)
	}
	resp, body := post(t, url, "", `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`, "MCP-Protocol-Version", "2026-07-28")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "session-based") || !strings.Contains(body, `"id":7`) {
		t.Fatalf("a 2026-07-28 request against a stdio backend: %s %s, want a clear 400", resp.Status, body)
	}
	stop() // the relay and its children are gone; the store stays

	url, c, stop = stdioRelay(t, store)
	defer stop()
	if _, body := post(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_simple_text"}}`); !strings.Contains(body, "This is a simple text response for testing.") {
		t.Fatalf("call after the restart: %s", body)
	}
	if n := c.Children(); n != 1 {
		t.Fatalf("%d children after the restore, want a new one", n)
	}
	rec, err := store.Session(context.Background(), sid)
	if err != nil || rec.Incarnation != 2 {
		t.Fatalf("session record %+v %v: want incarnation 2", rec, err)
	}
}
