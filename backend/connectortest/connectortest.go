// Package connectortest provides the suite every [backend.Connector] passes,
// in the manner of testing/fstest.TestFS.
//
// A connector package runs it from its tests with a harness whose connector
// fronts the server of [Server] (the example server plus one tool the suite
// needs), and a way to make the backend lose a session behind the
// connector's back:
//
//	func TestConnector(t *testing.T) {
//		connectortest.Run(t, func(t *testing.T) connectortest.Harness {
//			c := newConnector(t) // fronting connectortest.Server
//			t.Cleanup(func() { c.Close() })
//			return connectortest.Harness{Connector: c, Lose: kill}
//		})
//	}
//
// The suite speaks the legacy (2025-06-18) protocol era. It closes every
// session it opens; the harness owns the connector. Run it under -race.
package connectortest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Harness is what the suite needs of one connector.
type Harness struct {
	// Connector fronts a server built by [Server].
	Connector backend.Connector

	// Lose makes the backend lose session s as it would on its own (a
	// stdio child killed, an HTTP server that forgot the session): the
	// connector must notice without being told.
	Lose func(t *testing.T, s backend.Session)
}

// TouchTool is the tool [Server] adds to the example server: it notifies
// the subscribers of the resource named by its "uri" argument with
// notifications/resources/updated, outside any request, and returns "ok".
const TouchTool = "connectortest_touch"

// Server returns the server a harness's connector fronts: a fresh
// [exampleserver.New] plus [TouchTool].
func Server(opts *exampleserver.Options) *mcp.Server {
	srv := exampleserver.New(opts)
	type touchArgs struct {
		URI string `json:"uri" jsonschema:"the resource to report as updated"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: TouchTool, Description: "Notifies the subscribers of uri that it was updated."},
		func(_ context.Context, _ *mcp.CallToolRequest, in touchArgs) (*mcp.CallToolResult, any, error) {
			// A context of no request: the notification belongs to no call.
			if err := srv.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: in.URI}); err != nil {
				return nil, nil, err
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
		})
	return srv
}

// wait bounds every step of the suite.
const wait = 15 * time.Second

// Run runs the suite with harnesses made by newHarness, one per subtest.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	s := suite{newHarness: newHarness}
	t.Run("OpenAnswersUnderClientID", s.openIDs)
	t.Run("CallResultUnderClientID", s.callResult)
	t.Run("Batch", s.batch)
	t.Run("ProgressBeforeResponse", s.progress)
	t.Run("SameClientIDsDoNotCross", s.sameIDs)
	t.Run("SamplingDuringCall", s.sampling)
	t.Run("Unrelated", s.unrelated)
	t.Run("LoseFailsReplies", s.lose)
	t.Run("Close", s.close)
	t.Run("ContextEndsReply", s.ctxEnds)
}

type suite struct {
	newHarness func(t *testing.T) Harness
}

// session is one open session and what its callbacks received.
type session struct {
	backend.Session
	unrelated chan []byte
	lost      chan error
}

func initRequestAt(id, version string) []byte {
	return []byte(`{"jsonrpc":"2.0","id":` + id + `,"method":"initialize","params":{"protocolVersion":"` + version + `",` +
		`"capabilities":{"sampling":{},"elicitation":{},"roots":{"listChanged":true}},` +
		`"clientInfo":{"name":"connectortest","version":"0.0.1"}}}`)
}

// open opens a session with initialize id id, checks the response, sends
// notifications/initialized and closes the session when t ends.
func (s suite) open(t *testing.T, h Harness, id string) *session {
	t.Helper()
	return s.openAt(t, h, id, "2025-06-18")
}

// openAt is open at a protocol version (batches need 2025-03-26).
func (s suite) openAt(t *testing.T, h Harness, id, version string) *session {
	t.Helper()
	ss := &session{unrelated: make(chan []byte, 1000), lost: make(chan error, 10)}
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	bs, resp, err := h.Connector.Open(ctx, backend.Init{
		Request: initRequestAt(id, version),
		Unrelated: func(m []byte) {
			select {
			case ss.unrelated <- bytes.Clone(m):
			default: // the suite looks at the first ones only
			}
		},
		Lost: func(err error) { ss.lost <- err },
	})
	if err != nil {
		t.Fatalf("Open(id %s): %v", id, err)
	}
	if bs == nil {
		t.Fatalf("Open(id %s): no session; response %s", id, resp)
	}
	t.Cleanup(func() { bs.Close() })
	ss.Session = bs
	if got := rawID(t, resp); got != id {
		t.Fatalf("initialize response id %s, want %s byte for byte: %s", got, id, resp)
	}
	var res struct {
		Result struct {
			ProtocolVersion string `json:"protocolVersion"`
			ServerInfo      struct {
				Name string `json:"name"`
			} `json:"serverInfo"`
		} `json:"result"`
	}
	if err := json.Unmarshal(resp, &res); err != nil || res.Result.ServerInfo.Name != exampleserver.Name || res.Result.ProtocolVersion == "" {
		t.Fatalf("initialize response %s (%v): want a result from %s", resp, err, exampleserver.Name)
	}
	if err := bs.Notify(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil {
		t.Fatalf("Notify(initialized): %v", err)
	}
	bs.Listen()
	return ss
}

// rawID returns the id of msg exactly as it is spelled there.
func rawID(t *testing.T, msg []byte) string {
	t.Helper()
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		t.Fatalf("not a JSON-RPC message: %s: %v", msg, err)
	}
	return string(m.ID)
}

func toolCall(id, tool, args, meta string) []byte {
	p := `"name":"` + tool + `"`
	if args != "" {
		p += `,"arguments":` + args
	}
	if meta != "" {
		p += `,"_meta":` + meta
	}
	return []byte(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{` + p + `}}`)
}

func (ss *session) call(t *testing.T, ctx context.Context, msg []byte) backend.Reply {
	t.Helper()
	var ids []json.RawMessage
	if bytes.HasPrefix(msg, []byte("[")) {
		var batch []struct {
			ID json.RawMessage `json:"id"`
		}
		json.Unmarshal(msg, &batch)
		for _, b := range batch {
			ids = append(ids, b.ID)
		}
	} else {
		ids = []json.RawMessage{json.RawMessage(rawID(t, msg))}
	}
	r, err := ss.Call(ctx, msg, ids)
	if err != nil {
		t.Fatalf("Call(%s): %v", msg, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

type result struct {
	msg []byte
	err error
}

// next is r.Next bounded by wait.
func next(t *testing.T, r backend.Reply) ([]byte, error) {
	t.Helper()
	c := make(chan result, 1)
	go func() {
		m, err := r.Next()
		c <- result{m, err}
	}()
	select {
	case res := <-c:
		return res.msg, res.err
	case <-time.After(wait):
		t.Fatalf("Reply.Next did not return in %v", wait)
		return nil, nil
	}
}

// readAll returns the reply's messages up to io.EOF.
func readAll(t *testing.T, r backend.Reply) [][]byte {
	t.Helper()
	var out [][]byte
	for {
		m, err := next(t, r)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("Reply.Next after %d messages: %v", len(out), err)
		}
		out = append(out, m)
	}
}

// msg is the part of a message the suite checks.
type msg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		ProgressToken json.RawMessage `json:"progressToken"`
		Progress      float64         `json:"progress"`
		URI           string          `json:"uri"`
		Messages      []struct {
			Content struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"messages"`
	} `json:"params"`
	Result *struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"result"`
	Error json.RawMessage `json:"error"`
}

func decode(t *testing.T, b []byte) msg {
	t.Helper()
	var m msg
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("not a JSON-RPC message: %s: %v", b, err)
	}
	return m
}

// text returns the first text of a tools/call response, checking its id.
func text(t *testing.T, b []byte, id string) string {
	t.Helper()
	m := decode(t, b)
	if string(m.ID) != id || m.Result == nil || len(m.Result.Content) == 0 {
		t.Fatalf("want a tool result with id %s, got %s", id, b)
	}
	return m.Result.Content[0].Text
}

const simpleText = "This is a simple text response for testing."

func (s suite) openIDs(t *testing.T) {
	h := s.newHarness(t)
	for _, id := range []string{`"mcprelay-init"`, `1.0`, `0`, `-7`, `"42"`, `1e2`, `"\u00e9t\u00e9"`} {
		ss := s.open(t, h, id) // checks the id byte for byte
		if err := ss.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

func (s suite) callResult(t *testing.T) {
	h := s.newHarness(t)
	ss := s.open(t, h, "1")
	for _, id := range []string{`"x-1"`, `1.0`, `1`, `"mcprelay-ping"`} {
		msgs := readAll(t, ss.call(t, t.Context(), toolCall(id, "test_simple_text", "", "")))
		if len(msgs) != 1 {
			t.Fatalf("id %s: %d messages, want the response alone: %q", id, len(msgs), msgs)
		}
		if got := text(t, msgs[0], id); got != simpleText {
			t.Fatalf("id %s: text %q", id, got)
		}
	}
}

func (s suite) batch(t *testing.T) {
	h := s.newHarness(t)
	ss := s.openAt(t, h, "1", "2025-03-26") // batches exist in that revision only
	b := []byte(`[` + string(toolCall(`"b-1"`, "test_simple_text", "", "")) + `,` +
		string(toolCall(`2`, "test_error_handling", "", "")) + `]`)
	msgs := readAll(t, ss.call(t, t.Context(), b))
	got := map[string]bool{}
	for _, m := range msgs {
		got[rawID(t, m)] = true
	}
	if len(msgs) != 2 || !got[`"b-1"`] || !got[`2`] {
		t.Fatalf("batch: want responses to \"b-1\" and 2, got %q", msgs)
	}
}

func (s suite) progress(t *testing.T) {
	h := s.newHarness(t)
	ss := s.open(t, h, "1")
	for _, tok := range []string{`"p-1"`, `7`} {
		msgs := readAll(t, ss.call(t, t.Context(), toolCall(`"c"`, "test_tool_with_progress", "", `{"progressToken":`+tok+`}`)))
		if len(msgs) != 4 {
			t.Fatalf("token %s: %d messages, want 3 progress and the response: %q", tok, len(msgs), msgs)
		}
		for i, want := range []float64{0, 50, 100} {
			m := decode(t, msgs[i])
			if m.Method != "notifications/progress" || m.Params.Progress != want || normal(m.Params.ProgressToken) != normal(json.RawMessage(tok)) {
				t.Fatalf("token %s: message %d is %s, want progress %v", tok, i, msgs[i], want)
			}
		}
		if got := text(t, msgs[3], `"c"`); got != "Tool with progress executed successfully" {
			t.Fatalf("token %s: result %q", tok, got)
		}
	}
}

// normal spells a JSON value the way Go would encode it.
func normal(b json.RawMessage) string {
	var v any
	json.Unmarshal(b, &v)
	out, _ := json.Marshal(v)
	return string(out)
}

func (s suite) sameIDs(t *testing.T) {
	h := s.newHarness(t)
	ss := s.open(t, h, `"mcprelay-init"`)
	// The relay's own requests use ids like these; a connector's internal
	// ids may be small numbers. Two calls in flight with one client id.
	for _, id := range []string{`1`, `2`, `"mcprelay-init"`, `"mcprelay-ping"`} {
		slow := ss.call(t, t.Context(), toolCall(id, "test_tool_with_progress", "", `{"progressToken":"slow"}`))
		first, err := next(t, slow) // progress 0: the slow call is running
		if err != nil || decode(t, first).Method != "notifications/progress" {
			t.Fatalf("id %s: first message %s, %v; want progress", id, first, err)
		}
		fast := readAll(t, ss.call(t, t.Context(), toolCall(id, "test_simple_text", "", "")))
		if len(fast) != 1 || text(t, fast[0], id) != simpleText {
			t.Fatalf("id %s: the fast call got %q", id, fast)
		}
		rest := readAll(t, slow)
		if len(rest) != 3 || text(t, rest[2], id) != "Tool with progress executed successfully" {
			t.Fatalf("id %s: the slow call got %q", id, rest)
		}
	}
}

func (s suite) sampling(t *testing.T) {
	h := s.newHarness(t)
	ss := s.open(t, h, "1")
	r := ss.call(t, t.Context(), toolCall(`"s-1"`, "test_sampling", `{"prompt":"two plus two?"}`, ""))
	b, err := next(t, r)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	m := decode(t, b)
	if m.Method != "sampling/createMessage" || len(m.ID) == 0 || len(m.Params.Messages) == 0 || m.Params.Messages[0].Content.Text != "two plus two?" {
		t.Fatalf("want the server's sampling/createMessage request, got %s", b)
	}
	answer := `{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{"role":"assistant","model":"m","content":{"type":"text","text":"four"}}}`
	if err := ss.Notify(t.Context(), []byte(answer)); err != nil {
		t.Fatalf("Notify(answer): %v", err)
	}
	msgs := readAll(t, r)
	if len(msgs) != 1 || text(t, msgs[0], `"s-1"`) != "LLM response: four" {
		t.Fatalf("after the answer: %q", msgs)
	}
}

func (s suite) unrelated(t *testing.T) {
	h := s.newHarness(t)
	ss := s.open(t, h, "1")
	const uri = "test://watched-resource"
	sub := readAll(t, ss.call(t, t.Context(), []byte(`{"jsonrpc":"2.0","id":2,"method":"resources/subscribe","params":{"uri":"`+uri+`"}}`)))
	if len(sub) != 1 || decode(t, sub[0]).Error != nil {
		t.Fatalf("subscribe: %q", sub)
	}
	touch := readAll(t, ss.call(t, t.Context(), toolCall("3", TouchTool, `{"uri":"`+uri+`"}`, "")))
	if len(touch) != 1 || text(t, touch[0], "3") != "ok" {
		t.Fatalf("the touch call's reply holds %q, want its response alone", touch)
	}
	select {
	case b := <-ss.unrelated:
		if m := decode(t, b); m.Method != "notifications/resources/updated" || m.Params.URI != uri {
			t.Fatalf("Unrelated got %s, want resources/updated for %s", b, uri)
		}
	case <-time.After(wait):
		t.Fatalf("no resources/updated reached Init.Unrelated in %v", wait)
	}
}

// longCall starts a call that streams progress for a minute and waits for
// its first notification.
func (ss *session) longCall(t *testing.T, ctx context.Context) backend.Reply {
	t.Helper()
	r := ss.call(t, ctx, toolCall(`"long"`, "stream_progress", `{"count":600,"interval_ms":100}`, `{"progressToken":"long"}`))
	b, err := next(t, r)
	if err != nil || decode(t, b).Method != "notifications/progress" {
		t.Fatalf("long call: first message %s, %v; want progress", b, err)
	}
	return r
}

// drain reads r until it fails, bounded by wait.
func drain(t *testing.T, r backend.Reply) error {
	t.Helper()
	for {
		_, err := next(t, r)
		if err != nil {
			return err
		}
	}
}

func (s suite) lose(t *testing.T) {
	h := s.newHarness(t)
	ss := s.open(t, h, "1")
	r := ss.longCall(t, t.Context())
	h.Lose(t, ss.Session)
	if err := drain(t, r); !errors.Is(err, backend.ErrSessionLost) {
		t.Fatalf("the reply in flight ended with %v, want ErrSessionLost", err)
	}
	select {
	case <-ss.lost:
	case <-time.After(wait):
		t.Fatalf("Init.Lost was not called in %v", wait)
	}
	_, err := ss.Call(t.Context(), toolCall("9", "test_simple_text", "", ""), []json.RawMessage{json.RawMessage("9")})
	if !errors.Is(err, backend.ErrSessionLost) {
		t.Fatalf("Call after the loss: %v, want ErrSessionLost", err)
	}
	if err := ss.Notify(t.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`)); !errors.Is(err, backend.ErrSessionLost) {
		t.Fatalf("Notify after the loss: %v, want ErrSessionLost", err)
	}
	ss.Close()
	select {
	case err := <-ss.lost:
		t.Fatalf("Init.Lost called a second time (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
}

func (s suite) close(t *testing.T) {
	h := s.newHarness(t)
	ss := s.open(t, h, "1")
	r := ss.longCall(t, t.Context())
	closed := make(chan error, 2)
	go func() { closed <- ss.Close() }()
	go func() { closed <- ss.Close() }() // concurrently too
	if err := drain(t, r); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("the reply in flight ended with %v, want an error", err)
	}
	for range 2 {
		select {
		case err := <-closed:
			if err != nil {
				t.Fatalf("Close: %v", err)
			}
		case <-time.After(wait):
			t.Fatalf("Close did not return in %v", wait)
		}
	}
	if err := ss.Close(); err != nil {
		t.Fatalf("Close again: %v", err)
	}
	if _, err := ss.Call(t.Context(), toolCall("9", "test_simple_text", "", ""), []json.RawMessage{json.RawMessage("9")}); err == nil {
		t.Fatal("Call after Close succeeded")
	}
	if err := ss.Notify(t.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`)); err == nil {
		t.Fatal("Notify after Close succeeded")
	}
	select {
	case err := <-ss.lost:
		t.Fatalf("Init.Lost called after Close (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
}

func (s suite) ctxEnds(t *testing.T) {
	h := s.newHarness(t)
	ss := s.open(t, h, "1")
	ctx, cancel := context.WithCancel(t.Context())
	r := ss.longCall(t, ctx)
	// As the relay would: cancel the request, then abandon the reply.
	if err := ss.Notify(t.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"long"}}`)); err != nil {
		t.Fatalf("Notify(cancelled): %v", err)
	}
	cancel()
	if err := drain(t, r); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("the reply whose context ended ended with %v, want an error", err)
	}
	// A reply whose response has come but was not read yet is abandoned
	// as well: the response is not for the caller any more. Regression:
	// the stdio connector handed it over, then io.EOF.
	ctx, cancel = context.WithCancel(t.Context())
	answered := ss.call(t, ctx, toolCall("4", "test_simple_text", "", ""))
	time.Sleep(300 * time.Millisecond) // the response comes meanwhile
	cancel()
	if b, err := answered.Next(); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("an answered reply whose context ended gave %s, %v; want an error", b, err)
	}
	answered.Close()
	// The session goes on.
	msgs := readAll(t, ss.call(t, t.Context(), toolCall("5", "test_simple_text", "", "")))
	if len(msgs) != 1 || text(t, msgs[0], "5") != simpleText {
		t.Fatalf("a call after the abandoned one got %q", msgs)
	}
}
