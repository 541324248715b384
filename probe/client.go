package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mcprelay/mcprelay/sse"
)

const (
	headerSessionID       = "Mcp-Session-Id"
	headerProtocolVersion = "Mcp-Protocol-Version"
	headerLastEventID     = "Last-Event-ID"
)

// client sends the probe's requests. Every request is bounded by timeout and
// goes to url only: redirects are not followed.
type client struct {
	url     string
	hc      *http.Client
	header  http.Header // sent with every request (e.g. Authorization)
	version string      // protocol version offered in initialize
	timeout time.Duration
	settle  time.Duration // quiet period after which an open stream is taken as idle
	nsess   atomic.Int64
}

// session is one initialized MCP session.
type session struct {
	c       *client
	id      string // Mcp-Session-Id ("" if the server issued none)
	version string // negotiated protocol version
	token   string // progressToken prefix unique to this session
	nextID  int64
	ids     map[int64]bool // request ids this session sent
}

// message is the part of a JSON-RPC message the probe looks at.
type message struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params struct {
		ProgressToken json.RawMessage `json:"progressToken,omitempty"`
	} `json:"params"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  json.RawMessage `json:"error,omitempty"`
}

// event is one SSE event as received, with its JSON-RPC message parsed.
type event struct {
	sse.Event
	msg   message
	isMsg bool // Data parsed as a JSON-RPC message
}

// isReset reports whether e signals a reset or gap.
func (e event) isReset() bool {
	t := strings.ToLower(e.Type)
	return strings.Contains(t, "reset") || strings.Contains(t, "gap")
}

// responseTo reports whether e is the JSON-RPC response to request id.
func (e event) responseTo(id int64) bool {
	return e.isMsg && e.msg.Method == "" && string(e.msg.ID) == strconv.FormatInt(id, 10)
}

// exchange is what one HTTP request produced.
type exchange struct {
	status  int
	header  http.Header
	ctype   string  // media type of the response
	body    []byte  // non-SSE body
	events  []event // SSE events, in order
	ended   bool    // the response body ended (EOF or unexpected EOF)
	hung    bool    // still open when the request timeout expired
	idle    bool    // still open but quiet for the settle period
	stopped bool    // the caller's stop condition ended the read
	err     error   // transport error, if any
}

// dataEvents returns the events that carry a JSON-RPC message.
func (x *exchange) dataEvents() []event {
	var out []event
	for _, e := range x.events {
		if e.isMsg {
			out = append(out, e)
		}
	}
	return out
}

func (x *exchange) hasReset() bool {
	for _, e := range x.events {
		if e.isReset() {
			return true
		}
	}
	return false
}

// describe summarises x for a report: "200 text/event-stream, 3 events, ended".
func (x *exchange) describe() string {
	if x.err != nil {
		return "error: " + x.err.Error()
	}
	s := strconv.Itoa(x.status)
	if x.ctype == "text/event-stream" {
		n := len(x.dataEvents())
		s += fmt.Sprintf(" SSE, %d message", n)
		if n != 1 {
			s += "s"
		}
		if x.hasReset() {
			s += " + reset"
		}
		switch {
		case x.hung:
			s += ", still open at timeout"
		case x.idle:
			s += ", left open"
		case x.ended:
			s += ", ended"
		}
	}
	return s
}

// stopFunc ends a stream read early when it returns true for an event.
type stopFunc func(event) bool

// readMode says how long to read a stream.
type readMode int

const (
	untilEnd    readMode = iota // until EOF or the request timeout (a hang)
	untilSettle                 // until EOF or a quiet settle period
)

// request is one HTTP request the probe sends.
type request struct {
	method string
	sess   *session // adds Mcp-Session-Id and the protocol version when non-nil
	body   any      // JSON-encoded when non-nil
	header map[string]string
	mode   readMode
	stop   stopFunc
}

// do sends r and reads its response within the client's timeout.
func (c *client) do(ctx context.Context, r request) *exchange {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	x := &exchange{}
	var body io.Reader
	if r.body != nil {
		b, err := json.Marshal(r.body)
		if err != nil {
			x.err = err
			return x
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, c.url, body)
	if err != nil {
		x.err = err
		return x
	}
	for k, vs := range c.header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	switch r.method {
	case http.MethodPost:
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
	case http.MethodGet:
		req.Header.Set("Accept", "text/event-stream")
	}
	if r.sess != nil {
		if r.sess.id != "" {
			req.Header.Set(headerSessionID, r.sess.id)
		}
		if r.sess.version != "" {
			req.Header.Set(headerProtocolVersion, r.sess.version)
		}
	}
	for k, v := range r.header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			x.hung = true
		}
		x.err = err
		return x
	}
	defer resp.Body.Close()
	x.status = resp.StatusCode
	x.header = resp.Header
	x.ctype, _, _ = mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if x.ctype != "text/event-stream" {
		x.body, err = io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		if err != nil && ctx.Err() != nil {
			x.hung = true
		}
		x.ended = err == nil
		return x
	}
	c.readStream(ctx, resp.Body, x, r.mode, r.stop)
	return x
}

// readStream reads SSE events from body into x until EOF, the stop
// condition, ctx's deadline (a hang) or, in untilSettle mode, a quiet period.
func (c *client) readStream(ctx context.Context, body io.ReadCloser, x *exchange, mode readMode, stop stopFunc) {
	type item struct {
		ev  sse.Event
		err error
	}
	ch := make(chan item)
	done := make(chan struct{})
	defer func() {
		close(done)
		body.Close() // unblocks the reader goroutine
	}()
	go func() {
		sc := sse.NewScanner(body)
		for {
			ev, err := sc.Next()
			select {
			case ch <- item{ev, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var quiet <-chan time.Time
	var timer *time.Timer
	if mode == untilSettle {
		timer = time.NewTimer(c.settle)
		defer timer.Stop()
		quiet = timer.C
	}
	for {
		select {
		case it := <-ch:
			if it.err != nil {
				if errors.Is(it.err, io.EOF) || errors.Is(it.err, io.ErrUnexpectedEOF) {
					x.ended = true
				} else if ctx.Err() != nil {
					x.hung = true
				} else {
					x.err = it.err
				}
				return
			}
			e := event{Event: it.ev}
			if len(it.ev.Data) > 0 && json.Unmarshal(it.ev.Data, &e.msg) == nil {
				e.isMsg = true
			}
			x.events = append(x.events, e)
			if stop != nil && stop(e) {
				x.stopped = true
				return
			}
			if timer != nil {
				timer.Reset(c.settle)
			}
		case <-quiet:
			x.idle = true
			return
		case <-ctx.Done():
			x.hung = true
			return
		}
	}
}

// rpc is a JSON-RPC request or notification body.
type rpc struct {
	JSONRPC string `json:"jsonrpc"`
	ID      *int64 `json:"id,omitempty"`
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
}

// call builds a request with the session's next id and records the id.
func (s *session) call(method string, params any) (rpc, int64) {
	s.nextID++
	id := s.nextID
	s.ids[id] = true
	return rpc{JSONRPC: "2.0", ID: &id, Method: method, Params: params}, id
}

// errInit wraps every failure to open a session.
var errInit = errors.New("initialize")

// open initializes a new session. The request ids of the n-th session start
// at n*1000+1, so that sessions never share an id.
func (c *client) open(ctx context.Context) (*session, error) {
	n := c.nsess.Add(1)
	s := &session{c: c, token: fmt.Sprintf("mcprelay-probe-%d-%x", n, time.Now().UnixNano()&0xffffff), nextID: n * 1000, ids: map[int64]bool{}}
	body, id := s.call("initialize", map[string]any{
		"protocolVersion": c.version,
		"capabilities":    map[string]any{},
		"clientInfo":      map[string]any{"name": "mcprelay-probe", "version": "1"},
	})
	x := c.do(ctx, request{method: http.MethodPost, body: body, stop: func(e event) bool { return e.responseTo(id) }})
	if x.err != nil {
		return nil, fmt.Errorf("%w: %v", errInit, x.err)
	}
	if x.status != http.StatusOK {
		return nil, fmt.Errorf("%w: status %d: %s", errInit, x.status, bytes.TrimSpace(x.body))
	}
	var res struct {
		Result struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
		Error json.RawMessage `json:"error"`
	}
	data := x.body
	for _, e := range x.events {
		if e.responseTo(id) {
			data = e.Data
		}
	}
	if err := json.Unmarshal(data, &res); err != nil || res.Error != nil || res.Result.ProtocolVersion == "" {
		return nil, fmt.Errorf("%w: no initialize result (%s)", errInit, x.describe())
	}
	s.id = x.header.Get(headerSessionID)
	s.version = res.Result.ProtocolVersion
	nx := c.do(ctx, request{method: http.MethodPost, sess: s, body: rpc{JSONRPC: "2.0", Method: "notifications/initialized"}})
	if nx.err != nil || nx.status/100 != 2 {
		return nil, fmt.Errorf("%w: notifications/initialized: %s", errInit, nx.describe())
	}
	return s, nil
}

// close deletes the session, best effort.
func (s *session) close(ctx context.Context) *exchange {
	return s.c.do(ctx, request{method: http.MethodDelete, sess: s})
}

// resume sends GET with Last-Event-ID under s.
func (s *session) resume(ctx context.Context, cursor string, mode readMode, stop stopFunc) *exchange {
	return s.c.do(ctx, request{method: http.MethodGet, sess: s, header: map[string]string{headerLastEventID: cursor}, mode: mode, stop: stop})
}
