package relay_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/relay"
)

func TestOriginAndHost(t *testing.T) {
	e := newEnv(t, relay.Options{})
	init := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"o","version":"1"}}}`
	for _, tc := range []struct {
		name   string
		hdr    map[string]string
		status int
	}{
		{"no origin", nil, 200},
		{"loopback origin", map[string]string{"Origin": "http://localhost:3000"}, 200},
		{"foreign origin", map[string]string{"Origin": "https://evil.example"}, 403},
		{"null origin", map[string]string{"Origin": "null"}, 403},
		{"foreign host on loopback listener", map[string]string{"Host": "evil.example"}, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
			maps.Copy(hdr, tc.hdr)
			resp := send(t, "POST", e.url, init, hdr)
			if resp.StatusCode != tc.status {
				t.Fatalf("got %d, want %d", resp.StatusCode, tc.status)
			}
		})
	}
	t.Run("allow-list", func(t *testing.T) {
		e := newEnv(t, relay.Options{AllowedOrigins: []string{"https://app.example"}})
		for origin, want := range map[string]int{"https://app.example": 200, "http://localhost:3000": 403} {
			resp := e.do("POST", map[string]string{"Origin": origin}, init)
			if resp.StatusCode != want {
				t.Errorf("%s: got %d, want %d", origin, resp.StatusCode, want)
			}
		}
	})
}

func TestRequestValidation(t *testing.T) {
	e := newEnv(t, relay.Options{MaxBodyBytes: 1024})
	s := e.initialize("2025-06-18", "")
	h := s.headers()
	for _, tc := range []struct {
		name   string
		method string
		hdr    map[string]string
		body   string
		status int
	}{
		{"body too large", "POST", h, `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"` + strings.Repeat("a", 2000) + `"}}`, 413},
		{"not json", "POST", h, `hello`, 400},
		{"no session on a request", "POST", nil, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 400},
		{"unknown session", "POST", map[string]string{"Mcp-Session-Id": "nope"}, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 404},
		{"unsupported protocol version", "POST", map[string]string{"Mcp-Session-Id": s.id, "Mcp-Protocol-Version": "1999-01-01"}, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 400},
		{"supported but different version (conformance suite quirk)", "POST", map[string]string{"Mcp-Session-Id": s.id, "Mcp-Protocol-Version": "2025-03-26"}, `{"jsonrpc":"2.0","id":1,"method":"ping"}`, 200},
		{"missing version header means 2025-03-26", "POST", map[string]string{"Mcp-Session-Id": s.id}, `{"jsonrpc":"2.0","id":1,"method":"ping"}`, 200},
		{"batch after 2025-03-26", "POST", h, `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, 400},
		{"notification gets 202", "POST", h, `{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`, 202},
		{"GET without session", "GET", nil, "", 400},
		{"DELETE without session", "DELETE", nil, "", 400},
		{"PUT", "PUT", h, "", 405},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.do(tc.method, tc.hdr, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("got %s (%s), want %d", resp.Status, readBody(t, resp), tc.status)
			}
		})
	}
}

func TestBatch20250326(t *testing.T) {
	e := newEnv(t, relay.Options{})
	s := e.initialize("2025-03-26", "")
	resp := s.post(`[{"jsonrpc":"2.0","id":"a","method":"ping"},{"jsonrpc":"2.0","id":"b","method":"tools/list"},{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}]`)
	if resp.StatusCode != 200 {
		t.Fatalf("batch: %s %s", resp.Status, readBody(t, resp))
	}
	evs, ended := events(t, resp, 0, 5*time.Second)
	if !ended {
		t.Fatal("batch stream did not end after both responses")
	}
	got := ""
	for _, ev := range dataEvents(evs) {
		got += string(ev.Data)
	}
	if !strings.Contains(got, `"id":"a"`) || !strings.Contains(got, `"id":"b"`) {
		t.Fatalf("batch responses: %s", got)
	}
}

// TestStandaloneStream: server messages unrelated to a request reach the
// GET stream, including those sent while no GET was open.
func TestStandaloneStream(t *testing.T) {
	e := newEnv(t, relay.Options{})
	s := e.initialize("2025-11-25", "")
	call := func() {
		t.Helper()
		resp := s.post(`{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"addtool","arguments":{}}}`)
		events(t, resp, 0, 5*time.Second)
	}
	call() // no GET open: the notification waits in the log
	resp := s.get("")
	if resp.StatusCode != 200 {
		t.Fatalf("GET: %s", resp.Status)
	}
	evs, _ := events(t, resp, 1, 5*time.Second)
	if d := dataEvents(evs); len(d) != 1 || mcptest.Decode(t, d[0].Data).Method != "notifications/tools/list_changed" {
		t.Fatalf("waiting message not delivered: %+v", evs)
	}
	resp.Body.Close()
	resp = s.get("")
	done := make(chan []byte, 1)
	go func() {
		evs, _ := events(t, resp, 1, 5*time.Second)
		d := dataEvents(evs)
		if len(d) == 0 {
			done <- nil
			return
		}
		done <- d[0].Data
	}()
	time.Sleep(50 * time.Millisecond)
	call()
	if data := <-done; data == nil || mcptest.Decode(t, data).Method != "notifications/tools/list_changed" {
		t.Fatalf("live message not delivered: %s", data)
	}
}

// TestStatelessEraCancelsOnDisconnect: a 2026-07-28 request passes through
// without a session (its answer carries no Mcp-Session-Id), and closing its
// response cancels it upstream.
func TestStatelessEraCancelsOnDisconnect(t *testing.T) {
	e := newEnv(t, relay.Options{})
	for _, ch := range []chan struct{}{blockStarted, blockCancelled} {
		select {
		case <-ch:
		default:
		}
	}
	stateless := func(ctx context.Context, name, args string) (*http.Response, error) {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%q,"arguments":%s,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"x","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`, name, args)
		req, err := mcptest.NewRequest(ctx, "POST", e.url, map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": name}, body)
		if err != nil {
			return nil, err
		}
		return http.DefaultClient.Do(req)
	}
	resp, err := stateless(t.Context(), "count", `{"n":1}`)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "counted 1") {
		t.Fatalf("stateless tools/call: %s %s", resp.Status, body)
	}
	if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
		t.Errorf("stateless answer carries a session ID %q", sid)
	}

	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		resp, err := stateless(ctx, "block", "{}")
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-blockStarted:
	case err := <-errc:
		t.Fatalf("the blocking call ended before it started upstream: %v", err)
	}
	cancel()
	select {
	case <-blockCancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("closing the response did not cancel the upstream request")
	}
	<-errc
}

func TestIdleSessionExpires(t *testing.T) {
	e := newEnv(t, relay.Options{SessionIdleTimeout: 100 * time.Millisecond})
	s := e.initialize("2025-11-25", "")
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp := s.post(`{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`)
		if resp.StatusCode == 404 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("idle session never expired")
		}
		time.Sleep(300 * time.Millisecond) // longer than the timeout: each probe finds it idle
	}
}
