package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/internal/mcptest"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/sse"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// testServer returns the MCP server the relay fronts in these tests. Its
// "count" tool sends n progress notifications (log messages without a
// progress token), interval apart, then answers "counted n"; it waits for
// gate (if any) before answering.
func testServer(gate <-chan struct{}) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "relay-test", Version: "1"}, &mcp.ServerOptions{
		Capabilities: &mcp.ServerCapabilities{Logging: &mcp.LoggingCapabilities{}},
	})
	type countArgs struct {
		N          int `json:"n"`
		IntervalMS int `json:"interval_ms,omitempty"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "count", Description: "count to n"}, func(ctx context.Context, req *mcp.CallToolRequest, a countArgs) (*mcp.CallToolResult, any, error) {
		token := req.Params.GetProgressToken()
		for i := 1; i <= a.N; i++ {
			if token != nil {
				if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: float64(i), Total: float64(a.N), Message: fmt.Sprintf("step %d", i)}); err != nil {
					return nil, nil, err
				}
			} else {
				if err := req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: fmt.Sprintf("step %d", i)}); err != nil {
					return nil, nil, err
				}
			}
			if a.IntervalMS > 0 {
				select {
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				case <-time.After(time.Duration(a.IntervalMS) * time.Millisecond):
				}
			}
		}
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("counted %d", a.N)}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "poll", Description: "closes its stream asking the client to poll, then answers"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1})
		time.Sleep(50 * time.Millisecond) // let the client's connection attach
		if req.Extra != nil && req.Extra.CloseSSEStream != nil {
			req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: 20 * time.Millisecond})
		}
		time.Sleep(100 * time.Millisecond)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "polled"}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "block", Description: "blocks until cancelled"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		select {
		case blockStarted <- struct{}{}:
		default:
		}
		<-ctx.Done()
		select {
		case blockCancelled <- struct{}{}:
		default:
		}
		return nil, nil, ctx.Err()
	})
	mcp.AddTool(s, &mcp.Tool{Name: "addtool", Description: "adds a tool: tools/list_changed goes to every session's standalone stream"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		s.AddTool(&mcp.Tool{Name: fmt.Sprintf("added-%d", addedTools.Add(1)), InputSchema: &jsonschema.Schema{Type: "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{}, nil
		})
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "added"}}}, nil, nil
	})
	return s
}

var (
	blockStarted   = make(chan struct{}, 1) // the block tool is running
	blockCancelled = make(chan struct{}, 1)
	addedTools     atomic.Int64
)

type env struct {
	t       *testing.T
	url     string
	client  *http.Client
	relay   *relay.Handler
	backend *mcptest.Restartable
	gate    chan struct{}

	sessions []*rawSession // opened by initialize
}

// newEnv starts a relay (in front of testServer, in process) on a real
// loopback listener.
func newEnv(t *testing.T, opts relay.Options) *env {
	t.Helper()
	return startEnv(t, opts, false)
}

// newBubbleEnv is newEnv for a testing/synctest bubble: the client reaches
// the relay in process, without a socket (a bubble cannot wait on network
// I/O), so the relay's, the backend's and the test's timers all run on the
// bubble's clock and timing is exact.
func newBubbleEnv(t *testing.T, opts relay.Options) *env {
	t.Helper()
	return startEnv(t, opts, true)
}

func startEnv(t *testing.T, opts relay.Options, inProcess bool) *env {
	t.Helper()
	e := &env{t: t, gate: make(chan struct{})}
	e.backend = mcptest.NewRestartable(func() http.Handler {
		// The backend keeps an event store of its own so that it can close
		// its streams mid-call (polling) and be resumed by the relay.
		return backend.SDKHandler(testServer(nil), &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	})
	if opts.Backend == nil {
		up := backend.Handler(e.backend)
		up.StatelessURL = up.URL + "/stateless"
		opts.Backend = up
	}
	h, err := relay.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	e.relay = h
	if inProcess {
		e.client = &http.Client{Transport: backend.InProcess(h)}
		e.url = "http://relay.test/mcp"
		t.Cleanup(func() {
			// A bubble ends only when every goroutine in it has: the
			// backend sessions' too, which Close leaves for a restore.
			for _, s := range e.sessions {
				s.delete()
			}
			h.Close()
			e.backend.Stop()
			// The in-process transports keep a handler's goroutine for a
			// second after its request (backend.InProcess): a bubble
			// ends only once they have ended, on its fake clock.
			time.Sleep(2 * time.Second)
		})
		return e
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		h.Close()
		srv.CloseClientConnections()
		srv.Close()
		e.backend.Stop()
	})
	e.client = http.DefaultClient
	e.url = srv.URL
	return e
}

// send makes one request with headers hdr ("Host" sets the request's
// host) and returns the response, its body closed.
func send(t *testing.T, method, url, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// restartable serves the relay start returns on a loopback listener, and
// can replace it with a new one (on the same store) as a restart would.
type restartable struct {
	srv   *httptest.Server
	url   string
	start func() *relay.Handler
	cur   atomic.Pointer[relay.Handler]
}

func serveRestartable(t *testing.T, start func() *relay.Handler) *restartable {
	rs := &restartable{start: start}
	rs.cur.Store(start())
	rs.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { rs.cur.Load().ServeHTTP(w, r) }))
	rs.url = rs.srv.URL
	t.Cleanup(func() { rs.cur.Load().Close(); rs.srv.CloseClientConnections(); rs.srv.Close() })
	return rs
}

func (rs *restartable) current() *relay.Handler { return rs.cur.Load() }

// restart starts a new relay, then closes the old one without sealing
// anything (as a kill -9 would leave the store).
func (rs *restartable) restart() {
	old := rs.cur.Load()
	rs.cur.Store(rs.start())
	old.Close()
}

// rawSession speaks the transport by hand, to observe exactly what the
// relay sends.
type rawSession struct {
	e       *env
	id      string
	version string
	auth    string
	nextID  int
}

func (e *env) do(method string, hdr map[string]string, body string) *http.Response {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	e.t.Cleanup(cancel)
	req, err := mcptest.NewRequest(ctx, method, e.url, hdr, body)
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// initialize opens a session at version.
func (e *env) initialize(version, auth string) *rawSession {
	e.t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, version)
	resp := e.do("POST", map[string]string{"Authorization": auth}, body)
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		e.t.Fatalf("initialize: %s %s", resp.Status, b)
	}
	io.Copy(io.Discard, resp.Body)
	s := &rawSession{e: e, id: resp.Header.Get("Mcp-Session-Id"), version: version, auth: auth, nextID: 1}
	if s.id == "" {
		e.t.Fatal("initialize: no Mcp-Session-Id")
	}
	e.sessions = append(e.sessions, s)
	r := s.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if r.StatusCode != http.StatusAccepted {
		e.t.Fatalf("initialized: %s %s", r.Status, readBody(e.t, r))
	}
	return s
}

func (s *rawSession) headers() map[string]string {
	return map[string]string{"Mcp-Session-Id": s.id, "Mcp-Protocol-Version": s.version, "Authorization": s.auth}
}

// delete ends the session.
func (s *rawSession) delete() {
	s.e.t.Helper()
	resp := s.e.do("DELETE", s.headers(), "")
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotFound {
		s.e.t.Errorf("DELETE: %s", resp.Status)
	}
}

func (s *rawSession) post(body string) *http.Response {
	return s.e.do("POST", s.headers(), body)
}

// call starts a tools/call of count and returns its id and the SSE response.
func (s *rawSession) call(n, intervalMS int, progress bool) (int, *http.Response) {
	s.e.t.Helper()
	id := s.nextID
	s.nextID++
	meta := ""
	if progress {
		meta = fmt.Sprintf(`,"_meta":{"progressToken":"p%d"}`, id)
	}
	resp := s.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"count","arguments":{"n":%d,"interval_ms":%d}%s}}`, id, n, intervalMS, meta))
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		s.e.t.Fatalf("tools/call: %s %q %s", resp.Status, resp.Header.Get("Content-Type"), b)
	}
	return id, resp
}

func (s *rawSession) get(lastEventID string) *http.Response {
	h := s.headers()
	h["Last-Event-ID"] = lastEventID
	return s.e.do("GET", h, "")
}

// events reads SSE events until the body ends, n data events were read
// (n > 0), or the timeout passes.
func events(t *testing.T, resp *http.Response, n int, timeout time.Duration) (evs []sse.Event, ended bool) {
	t.Helper()
	type res struct {
		evs   []sse.Event
		ended bool
	}
	done := make(chan res, 1)
	go func() {
		sc := sse.NewScanner(resp.Body)
		var out []sse.Event
		data := 0
		for {
			ev, err := sc.Next()
			if err != nil {
				done <- res{out, errors.Is(err, io.EOF)}
				return
			}
			out = append(out, ev)
			if len(ev.Data) > 0 {
				data++
			}
			if n > 0 && data >= n {
				done <- res{out, false}
				return
			}
		}
	}()
	select {
	case r := <-done:
		return r.evs, r.ended
	case <-time.After(timeout):
		resp.Body.Close()
		r := <-done
		return r.evs, false
	}
}

// dataEvents keeps events with data.
func dataEvents(evs []sse.Event) []sse.Event {
	var out []sse.Event
	for _, e := range evs {
		if len(e.Data) > 0 {
			out = append(out, e)
		}
	}
	return out
}

// lastID returns the id of the last event with an id.
func lastID(evs []sse.Event) string {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].ID != "" {
			return evs[i].ID
		}
	}
	return ""
}

func readBody(t *testing.T, resp *http.Response) string {
	b, _ := io.ReadAll(resp.Body)
	return string(bytes.TrimSpace(b))
}
