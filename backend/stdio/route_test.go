package stdio_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/backend/stdio"
)

// session opens a session on c and collects what reaches its callbacks.
type session struct {
	*stdio.Session
	mu        sync.Mutex
	unrelated [][]byte
	lost      chan error
}

func (s *session) unrelatedMsgs() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.unrelated...)
}

const initReq = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"sampling":{}},"clientInfo":{"name":"t","version":"1"}}}`

func open(t *testing.T, c *stdio.Connector, log *slog.Logger) *session {
	t.Helper()
	s := &session{lost: make(chan error, 4)}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	bs, _, err := c.Open(ctx, backend.Init{
		Request: []byte(initReq),
		Unrelated: func(m []byte) {
			s.mu.Lock()
			s.unrelated = append(s.unrelated, m)
			s.mu.Unlock()
		},
		Lost:   func(err error) { s.lost <- err },
		Logger: log,
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	s.Session = bs.(*stdio.Session)
	t.Cleanup(func() { s.Close() })
	if err := s.Notify(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil {
		t.Fatal(err)
	}
	return s
}

func call(t *testing.T, ctx context.Context, s *session, msg string) backend.Reply {
	t.Helper()
	r, err := s.Call(ctx, []byte(msg), nil)
	if err != nil {
		t.Fatalf("Call(%s): %v", msg, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// all reads r to io.EOF, failing after 10s.
func all(t *testing.T, r backend.Reply) []string {
	t.Helper()
	type res struct {
		msgs []string
		err  error
	}
	c := make(chan res, 1)
	go func() {
		var out []string
		for {
			m, err := r.Next()
			if err == io.EOF {
				c <- res{out, nil}
				return
			}
			if err != nil {
				c <- res{out, err}
				return
			}
			out = append(out, string(m))
		}
	}()
	select {
	case x := <-c:
		if x.err != nil {
			t.Fatalf("Next after %q: %v", x.msgs, x.err)
		}
		return x.msgs
	case <-time.After(10 * time.Second):
		t.Fatal("the reply did not end in 10s")
		return nil
	}
}

func methods(msgs []string) []string {
	var out []string
	for _, m := range msgs {
		var v struct {
			Method string `json:"method"`
		}
		json.Unmarshal([]byte(m), &v)
		if v.Method == "" {
			v.Method = "response"
		}
		out = append(out, v.Method)
	}
	return out
}

func bytesToStrings(bs [][]byte) []string {
	var out []string
	for _, b := range bs {
		out = append(out, string(b))
	}
	return out
}

// TestLoggingRelatesToTheOnlyCallInFlight: logging notifications go to the
// call in flight when it is the only one, else to Unrelated.
func TestLoggingRelatesToTheOnlyCallInFlight(t *testing.T) {
	c := newConnector(t, "serve", stdio.Options{})
	s := open(t, c, nil)
	all(t, call(t, t.Context(), s, `{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"info"}}`))

	alone := methods(all(t, call(t, t.Context(), s, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"test_tool_with_logging"}}`)))
	if want := "notifications/message notifications/message notifications/message response"; strings.Join(alone, " ") != want {
		t.Fatalf("alone, the logging call got %v, want %s", alone, want)
	}
	if u := s.unrelatedMsgs(); len(u) != 0 {
		t.Fatalf("Unrelated got %q", bytesToStrings(u))
	}

	long := call(t, t.Context(), s, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"stream_progress","arguments":{"count":100,"interval_ms":100},"_meta":{"progressToken":"long"}}}`)
	if m, err := long.Next(); err != nil || !strings.Contains(string(m), `"notifications/progress"`) {
		t.Fatalf("long call: %s, %v", m, err)
	}
	two := methods(all(t, call(t, t.Context(), s, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"test_tool_with_logging"}}`)))
	if strings.Join(two, " ") != "response" {
		t.Fatalf("with another call in flight, the logging call got %v, want its response alone", two)
	}
	var logs int
	for _, m := range s.unrelatedMsgs() {
		if strings.Contains(string(m), `"notifications/message"`) {
			logs++
		}
	}
	if logs != 3 {
		t.Fatalf("Unrelated got %d log messages, want 3: %q", logs, bytesToStrings(s.unrelatedMsgs()))
	}
}

// TestCancelledNamesTheChildID: notifications/cancelled from the client is
// rewritten to the child's id of the call, so the child stops it.
func TestCancelledNamesTheChildID(t *testing.T) {
	c := newConnector(t, "serve", stdio.Options{})
	s := open(t, c, nil)
	ctx, cancel := context.WithCancel(t.Context())
	long := call(t, ctx, s, `{"jsonrpc":"2.0","id":"c-1","method":"tools/call","params":{"name":"stream_progress","arguments":{"count":100,"interval_ms":50},"_meta":{"progressToken":"long"}}}`)
	if m, err := long.Next(); err != nil || !strings.Contains(string(m), `"notifications/progress"`) {
		t.Fatalf("long call: %s, %v", m, err)
	}
	if err := s.Notify(t.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"c-1","reason":"test"}}`)); err != nil {
		t.Fatal(err)
	}
	cancel()
	time.Sleep(200 * time.Millisecond) // the cancellation reaches the child
	before := len(s.unrelatedMsgs())
	time.Sleep(500 * time.Millisecond) // 10 progress notifications if it goes on
	if after := len(s.unrelatedMsgs()); after != before {
		t.Fatalf("the child went on after notifications/cancelled: %d more messages", after-before)
	}
	if got := all(t, call(t, t.Context(), s, `{"jsonrpc":"2.0","id":"c-2","method":"ping"}`)); len(got) != 1 {
		t.Fatalf("ping after the cancellation: %q", got)
	}
}

func init() {
	// scripted: answers every request with an empty result, except methods
	// "garbage" (lines that are not messages before the response) and "big"
	// (a 4 KiB line instead).
	childModes["scripted"] = func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(sc.Bytes(), &m) != nil || m.ID == nil {
				continue
			}
			switch m.Method {
			case "garbage":
				fmt.Println("this is not JSON")
				fmt.Println(`{"jsonrpc":"2.0"}`)
				fmt.Println(`[1,2`)
			case "batch":
				fmt.Printf(`[{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"in a batch"}},{"jsonrpc":"2.0","id":%s,"result":{}}]`+"\n", m.ID)
				continue
			case "deaf": // answers, then never reads stdin again
				fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{}}`+"\n", m.ID)
				for {
					time.Sleep(time.Hour)
				}
			case "big":
				fmt.Printf(`{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"%s"}}`+"\n", strings.Repeat("x", 4096))
				continue
			}
			fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":{}}`+"\n", m.ID)
		}
	}
}

// TestMalformedLinesSkipped: lines that are not JSON-RPC messages are
// logged and skipped; the session goes on.
func TestMalformedLinesSkipped(t *testing.T) {
	c := newConnector(t, "scripted", stdio.Options{})
	h := &recorder{}
	s := open(t, c, slog.New(h))
	got := all(t, call(t, t.Context(), s, `{"jsonrpc":"2.0","id":"g","method":"garbage"}`))
	if len(got) != 1 || got[0] != `{"jsonrpc":"2.0","id":"g","result":{}}` {
		t.Fatalf("reply %q, want the response alone", got)
	}
	if n := h.count("stdio: skipped a malformed line from the child"); n != 3 {
		t.Fatalf("%d malformed lines logged, want 3", n)
	}
	if got := all(t, call(t, t.Context(), s, `{"jsonrpc":"2.0","id":"h","method":"ping"}`)); len(got) != 1 {
		t.Fatalf("after the garbage: %q", got)
	}
}

// TestBatchFromChild: a batch the child writes is routed message by message.
func TestBatchFromChild(t *testing.T) {
	c := newConnector(t, "scripted", stdio.Options{})
	s := open(t, c, nil)
	got := methods(all(t, call(t, t.Context(), s, `{"jsonrpc":"2.0","id":"b","method":"batch"}`)))
	if strings.Join(got, " ") != "notifications/message response" {
		t.Fatalf("reply %v, want the log message and the response", got)
	}
}

// TestWriteBoundedByContext: a child that stops reading its stdin does not
// hold a Call beyond its context; a message cut short loses the session.
func TestWriteBoundedByContext(t *testing.T) {
	c := newConnector(t, "scripted", stdio.Options{})
	s := open(t, c, nil)
	all(t, call(t, t.Context(), s, `{"jsonrpc":"2.0","id":"d","method":"deaf"}`))
	big := `{"jsonrpc":"2.0","id":"x","method":"ping","params":{"pad":"` + strings.Repeat("p", 512<<10) + `"}}`
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := s.Call(ctx, []byte(big), nil)
		done <- err
	}()
	select {
	case err := <-done:
		t.Logf("Call returned after %v", time.Since(start))
		if !errors.Is(err, backend.ErrSessionLost) {
			t.Fatalf("Call: %v, want ErrSessionLost (the message was cut short)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Call still blocked 10s after its context ended")
	}
}

// TestOversizeMessageLosesSession: a line over MaxMessage breaks the
// protocol: the call and the session are lost, Lost says why.
func TestOversizeMessageLosesSession(t *testing.T) {
	c := newConnector(t, "scripted", stdio.Options{MaxMessage: 1024})
	s := open(t, c, nil)
	r := call(t, t.Context(), s, `{"jsonrpc":"2.0","id":"b","method":"big"}`)
	if _, err := r.Next(); !errors.Is(err, backend.ErrSessionLost) || !errors.Is(err, stdio.ErrMessageTooLarge) {
		t.Fatalf("Next: %v, want ErrSessionLost and ErrMessageTooLarge", err)
	}
	select {
	case err := <-s.lost:
		if !errors.Is(err, stdio.ErrMessageTooLarge) {
			t.Fatalf("Lost(%v), want ErrMessageTooLarge", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Lost not called in 10s")
	}
}

// recorder is a slog.Handler that keeps the records.
type recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *recorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}
func (h *recorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recorder) WithGroup(string) slog.Handler      { return h }

func (h *recorder) records(msg string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.recs {
		if r.Message == msg {
			out = append(out, r)
		}
	}
	return out
}

func (h *recorder) count(msg string) int { return len(h.records(msg)) }

func attr(r slog.Record, key string) slog.Value {
	var v slog.Value
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

// TestStderrBoundedAndRateLimited: the child's stderr reaches the session's
// logger line by line, each line cut to 4 KiB, at most about 50 lines a
// second, the lines dropped counted.
func TestStderrBoundedAndRateLimited(t *testing.T) {
	c := newConnector(t, "noisy", stdio.Options{})
	h := &recorder{}
	s := open(t, c, slog.New(h))
	s.Close() // the stderr reader is done when Close returns
	lines := h.records("stdio: child's stderr")
	dropped := 0
	for _, r := range h.records("stdio: child's stderr lines dropped (rate limit)") {
		dropped += int(attr(r, "dropped").Int64())
	}
	const total = 1 + 500 + 1 // the long line, the noise, "last noise"
	if len(lines) < 40 || len(lines) > 60 || len(lines)+dropped != total {
		t.Fatalf("%d lines logged, %d counted as dropped; want about 50 and %d in all", len(lines), dropped, total)
	}
	first := attr(lines[0], "line").String()
	if len(first) > 4096+len("…") || !strings.HasPrefix(first, "xxxx") || !strings.HasSuffix(first, "…") {
		t.Fatalf("the long line was logged as %d bytes %.20q…, want it cut to 4 KiB", len(first), first)
	}
	if second := attr(lines[1], "line").String(); second != "noise 0" {
		t.Fatalf("the line after the long one is %q, want %q", second, "noise 0")
	}
}

// TestCloseEndsBlockedWrite: Close does not wait for a write the child
// blocks, even one whose context never ends.
func TestCloseEndsBlockedWrite(t *testing.T) {
	c := newConnector(t, "scripted", stdio.Options{})
	s := open(t, c, nil)
	all(t, call(t, t.Context(), s, `{"jsonrpc":"2.0","id":"d","method":"deaf"}`))
	big := `{"jsonrpc":"2.0","id":"x","method":"ping","params":{"pad":"` + strings.Repeat("p", 512<<10) + `"}}`
	done := make(chan error, 1)
	go func() {
		_, err := s.Call(context.Background(), []byte(big), nil)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // the write blocks on a full pipe
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	for _, ch := range []<-chan struct{}{closed} {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("Close blocked 10s behind a write")
		}
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the blocked Call succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the blocked Call did not return 10s after Close")
	}
}
