package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const (
	headerSessionID       = "Mcp-Session-Id"
	headerProtocolVersion = "MCP-Protocol-Version"
	headerLastEventID     = "Last-Event-ID"

	// initTimeout bounds one re-initialization exchange.
	initTimeout = 30 * time.Second
	// deleteTimeout bounds the DELETE sent by Close.
	deleteTimeout = 5 * time.Second
	// maxJSONBody bounds a JSON (non-SSE) answer.
	maxJSONBody = 16 << 20
)

// ErrClosed is returned by Read and Write after Close.
var ErrClosed = errors.New("client: connection closed")

// session is one server session as this connection knows it. Its context
// ends when the session is replaced (re-initialized) or the connection
// closes, which stops its streams.
type session struct {
	id         string
	ctx        context.Context
	cancel     context.CancelFunc
	standalone sync.Once
}

// call is one request the SDK sent and awaits an answer to.
type call struct {
	orig       jsonrpc.ID // the SDK's ID
	wire       jsonrpc.ID // the ID on the wire (differs after a re-send)
	method     string
	params     json.RawMessage
	idempotent bool
	ctx        context.Context // the caller's context joined with the connection's
	stop       context.CancelFunc
	done       chan struct{} // closed once the call is finished (answered, lost, abandoned)
}

type conn struct {
	opts     Options
	log      *slog.Logger
	ctx      context.Context // ends at Close
	cancel   context.CancelFunc
	incoming chan jsonrpc.Message
	wg       sync.WaitGroup

	closeOnce sync.Once
	failOnce  sync.Once
	failErr   error
	failed    chan struct{}

	mu         sync.Mutex
	sess       *session
	version    string          // negotiated protocol version; "" before initialize
	initParams json.RawMessage // the SDK's initialize params, as sent
	calls      map[string]*call
	seq        int64
	reinit     *reinitRun // a re-initialization in progress
}

type reinitRun struct {
	done chan struct{}
	err  error
}

func newConn(opts Options) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{
		opts:     opts,
		log:      opts.Logger,
		ctx:      ctx,
		cancel:   cancel,
		incoming: make(chan jsonrpc.Message),
		failed:   make(chan struct{}),
		calls:    make(map[string]*call),
	}
	c.sess = c.newSession("")
	return c
}

var _ mcp.Connection = (*conn)(nil)

func (c *conn) newSession(id string) *session {
	ctx, cancel := context.WithCancel(c.ctx)
	return &session{id: id, ctx: ctx, cancel: cancel}
}

func (c *conn) current() (*session, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess, c.version
}

// SessionID returns the current session ID; it changes after a
// re-initialization.
func (c *conn) SessionID() string {
	s, _ := c.current()
	return s.id
}

// fail breaks the connection: pending and later Reads return err.
func (c *conn) fail(err error) {
	c.failOnce.Do(func() {
		c.log.Error("connection failed", logErr, err)
		c.failErr = err
		close(c.failed)
	})
}

func (c *conn) err() error {
	select {
	case <-c.failed:
		return c.failErr
	default:
	}
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	return nil
}

// Read returns the next message for the SDK.
func (c *conn) Read(ctx context.Context) (jsonrpc.Message, error) {
	if err := c.err(); err != nil {
		return nil, err
	}
	select {
	case msg := <-c.incoming:
		return msg, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.failed:
		return nil, c.failErr
	case <-c.ctx.Done():
		return nil, io.EOF
	}
}

// push hands msg to the SDK, unless the connection closes first.
func (c *conn) push(msg jsonrpc.Message) bool {
	select {
	case c.incoming <- msg:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// deliver hands a message read from a stream to the SDK. A response is
// handed on only if its request is still awaited, under the SDK's own ID,
// so a response is never delivered twice.
func (c *conn) deliver(msg jsonrpc.Message) {
	r, ok := msg.(*jsonrpc.Response)
	if !ok {
		c.push(msg)
		return
	}
	cl := c.lookup(r.ID)
	if cl == nil || !c.finish(cl) {
		c.log.Debug("dropping a response to no awaited request", "id", r.ID.Raw())
		return
	}
	if cl.method == "initialize" && r.Error == nil {
		var res struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		if json.Unmarshal(r.Result, &res) == nil && res.ProtocolVersion != "" {
			c.mu.Lock()
			c.version = res.ProtocolVersion
			c.mu.Unlock()
		}
	}
	if w, ok := r.Error.(*jsonrpc.Error); ok && isRelayLost(w) {
		r.Error = &LostError{Method: cl.method, Reason: ReasonBackendLost, Detail: w.Message, Wire: w}
	}
	r.ID = cl.orig
	c.push(r)
}

// isRelayLost reports whether w is mcprelay's "request lost" error
// (code -32001; its data says {"reason":"backend_lost"} when the backend
// lost the request, and nothing when the backend was unreachable).
func isRelayLost(w *jsonrpc.Error) bool { return w.Code == CodeRequestLost }

func idKey(id jsonrpc.ID) string {
	switch v := id.Raw().(type) {
	case int64:
		return "n" + strconv.FormatInt(v, 10)
	case string:
		return "s" + v
	}
	return ""
}

func (c *conn) lookup(id jsonrpc.ID) *call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[idKey(id)]
}

// finish removes cl from the awaited calls; it reports false if cl was
// already finished.
func (c *conn) finish(cl *call) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := idKey(cl.wire)
	if c.calls[k] != cl {
		return false
	}
	delete(c.calls, k)
	close(cl.done)
	return true
}

func (cl *call) finished() bool {
	select {
	case <-cl.done:
		return true
	default:
		return false
	}
}

// renumber gives cl a new wire ID for a re-send; answers to the old one
// are dropped from now on.
func (c *conn) renumber(cl *call) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := idKey(cl.wire)
	if c.calls[k] != cl {
		return false
	}
	delete(c.calls, k)
	c.seq++
	id, _ := jsonrpc.MakeID("mcprelay-client-" + strconv.FormatInt(c.seq, 10))
	cl.wire = id
	c.calls[idKey(id)] = cl
	return true
}

// lose finishes cl with a *LostError.
func (c *conn) lose(cl *call, lost *LostError) {
	if c.finish(cl) {
		c.log.Warn("request lost", logMethod, cl.method, logReason, lost.Reason, "detail", lost.Detail)
		c.push(&jsonrpc.Response{ID: cl.orig, Error: lost})
	}
}

// failCall finishes cl with an error that is not a loss (the server
// refused the request).
func (c *conn) failCall(cl *call, err error) {
	if c.finish(cl) {
		c.push(&jsonrpc.Response{ID: cl.orig, Error: &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}})
	}
}

// Write sends a message. A call's answer is followed in the background;
// whatever happens to it, the SDK gets a response (result or error).
func (c *conn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if err := c.err(); err != nil {
		return err
	}
	switch m := msg.(type) {
	case *jsonrpc.Request:
		if m.IsCall() {
			return c.writeCall(ctx, m)
		}
		return c.writeOneWay(ctx, m, m.Method)
	case *jsonrpc.Response:
		return c.writeOneWay(ctx, m, "response")
	}
	return fmt.Errorf("client: cannot send a %T", msg)
}

func (c *conn) writeCall(ctx context.Context, m *jsonrpc.Request) error {
	if m.Method == "server/discover" {
		// This transport speaks the legacy era; the SDK then falls back
		// to initialize.
		c.goPush(&jsonrpc.Response{ID: m.ID, Error: &jsonrpc.Error{
			Code:    jsonrpc.CodeMethodNotFound,
			Message: "client: this transport speaks protocol " + c.opts.ProtocolVersion + ": use initialize",
		}})
		return nil
	}
	params := m.Params
	if m.Method == "initialize" {
		params = withProtocolVersion(params, c.opts.ProtocolVersion)
		c.mu.Lock()
		c.initParams = params
		c.mu.Unlock()
	}
	cl := &call{
		orig:       m.ID,
		wire:       m.ID,
		method:     m.Method,
		params:     params,
		idempotent: markedIdempotent(ctx) || c.opts.Idempotent(m.Method),
		done:       make(chan struct{}),
	}
	cl.ctx, cl.stop = context.WithCancel(ctx)
	stopJoin := context.AfterFunc(c.ctx, cl.stop)
	c.mu.Lock()
	c.calls[idKey(cl.wire)] = cl
	c.mu.Unlock()

	// The POST is sent before Write returns, so that messages reach the
	// server in the order the SDK wrote them.
	sess, resp, err := c.postCall(cl)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer stopJoin()
		defer cl.stop()
		c.run(cl, sess, resp, err)
	}()
	return nil
}

func (c *conn) goPush(msg jsonrpc.Message) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.push(msg)
	}()
}

// withProtocolVersion sets protocolVersion in initialize params.
func withProtocolVersion(params json.RawMessage, v string) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(params, &m) != nil || m == nil {
		return params
	}
	m["protocolVersion"], _ = json.Marshal(v)
	b, err := json.Marshal(m)
	if err != nil {
		return params
	}
	return b
}

// request builds an HTTP request to the endpoint for sess.
func (c *conn) request(ctx context.Context, method string, sess *session, version string, body []byte) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.opts.Endpoint, rd)
	if err != nil {
		return nil, err
	}
	switch method {
	case http.MethodPost:
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
	case http.MethodGet:
		req.Header.Set("Accept", "text/event-stream")
	}
	if sess != nil && sess.id != "" {
		req.Header.Set(headerSessionID, sess.id)
	}
	if version != "" {
		req.Header.Set(headerProtocolVersion, version)
	}
	return req, nil
}

// postCall POSTs cl on the current session. For initialize, the session
// the server assigns becomes current.
func (c *conn) postCall(cl *call) (*session, *http.Response, error) {
	sess, version := c.current()
	body, err := jsonrpc.EncodeMessage(&jsonrpc.Request{ID: cl.wire, Method: cl.method, Params: cl.params})
	if err != nil {
		return sess, nil, err
	}
	if cl.method == "initialize" {
		sess, version = nil, ""
	}
	req, err := c.request(cl.ctx, http.MethodPost, sess, version, body)
	if err != nil {
		return sess, nil, err
	}
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return sess, nil, err
	}
	if cl.method == "initialize" {
		c.mu.Lock()
		if resp.StatusCode == http.StatusOK {
			c.sess = c.newSession(resp.Header.Get(headerSessionID))
		}
		sess = c.sess
		c.mu.Unlock()
	}
	return sess, resp, nil
}

// run follows cl until it is answered, abandoned by its caller, or lost;
// a lost call that may be repeated is sent again under a new ID.
func (c *conn) run(cl *call, sess *session, resp *http.Response, postErr error) {
	resends := 0
	for {
		lost, accepted := c.follow(cl, sess, resp, postErr)
		if lost == nil {
			return
		}
		if lost.Reason == ReasonSessionLost {
			if err := c.reinitialize(sess); err != nil {
				lost.Detail += "; re-initialization failed: " + err.Error()
				c.lose(cl, lost)
				return
			}
		}
		// A request the server never accepted (its POST was answered 404)
		// can always be sent again.
		repeat := cl.idempotent || (lost.Reason == ReasonSessionLost && !accepted)
		if !repeat || cl.method == "initialize" || resends >= c.opts.MaxRetries || cl.ctx.Err() != nil {
			c.lose(cl, lost)
			return
		}
		resends++
		if !c.renumber(cl) {
			return
		}
		c.log.Info("re-sending request", logMethod, cl.method, logReason, lost.Reason, "id", cl.wire.Raw(), logAttempt, resends)
		if lost.Reason != ReasonSessionLost && !sleep(cl.ctx, c.delay(resends, 0)) {
			c.finish(cl)
			return
		}
		sess, resp, postErr = c.postCall(cl)
	}
}

// follow reads cl's answer to resp (its POST), resuming the stream as
// needed. It returns nil when the call is finished (answered, failed, or
// abandoned by its caller), or why it was lost; accepted reports whether
// the server had accepted the request.
func (c *conn) follow(cl *call, sess *session, resp *http.Response, postErr error) (lost *LostError, accepted bool) {
	lostf := func(reason, format string, args ...any) (*LostError, bool) {
		return &LostError{Method: cl.method, Reason: reason, Detail: fmt.Sprintf(format, args...)}, accepted
	}
	if postErr != nil {
		if cl.ctx.Err() != nil {
			c.finish(cl)
			return nil, false
		}
		return lostf(ReasonSendFailed, "%v", postErr)
	}
	var relayLost *jsonrpc.Error
	intercept := func(r *jsonrpc.Response) bool {
		w, ok := r.Error.(*jsonrpc.Error)
		if ok && cl.idempotent && idKey(r.ID) == idKey(cl.wire) && isRelayLost(w) {
			relayLost = w
			return true
		}
		return false
	}
	st := &streamState{}
	resuming := false
	attempts := 0
	for {
		if resp != nil {
			status, ct := resp.StatusCode, mediaType(resp)
			switch {
			case status == http.StatusOK && ct == "text/event-stream":
				accepted = true
				actx, stop := joinContext(cl.ctx, sess.ctx)
				body := resp.Body
				stopBody := context.AfterFunc(actx, func() { body.Close() })
				c.readStream(body, st, sess.id, intercept, cl.finished)
				stopBody()
				stop()
				if relayLost != nil {
					return &LostError{Method: cl.method, Reason: ReasonBackendLost, Detail: relayLost.Message, Wire: relayLost}, true
				}
				if st.progress {
					attempts = 0
				}
			case !resuming && (status == http.StatusOK || status == http.StatusCreated) && ct == "application/json":
				accepted = true
				c.readJSON(resp, intercept)
				if relayLost != nil {
					return &LostError{Method: cl.method, Reason: ReasonBackendLost, Detail: relayLost.Message, Wire: relayLost}, true
				}
				if !cl.finished() {
					return lostf(ReasonStreamFinished, "the JSON answer did not contain the response")
				}
			case status == http.StatusNotFound && sess.id != "":
				resp.Body.Close()
				return lostf(ReasonSessionLost, "HTTP 404 for session %s", sess.id)
			case resuming && status == http.StatusNoContent:
				resp.Body.Close()
				return lostf(ReasonStreamFinished, "the server has nothing more for the stream (HTTP 204)")
			case resuming && (status >= 500 || status == http.StatusTooManyRequests):
				c.log.Info("transient HTTP error", logMethod, cl.method, logStatus, status)
				resp.Body.Close()
			case resuming:
				err := readStatusError(resp)
				return lostf(ReasonCursorRejected, "resume refused: %v", err)
			case ct == "application/json":
				// An error answer to the POST, e.g. mcprelay's 502 with a
				// -32001 error under the request's ID.
				c.readJSON(resp, intercept)
				if relayLost != nil {
					return &LostError{Method: cl.method, Reason: ReasonBackendLost, Detail: relayLost.Message, Wire: relayLost}, false
				}
				if cl.finished() {
					return nil, false
				}
				if status >= 500 {
					return lostf(ReasonSendFailed, "HTTP %d", status)
				}
				c.failCall(cl, &httpStatusError{status: status, body: "no JSON-RPC response for the request"})
				return nil, false
			case status >= 500:
				return lostf(ReasonSendFailed, "%v", readStatusError(resp))
			default:
				c.failCall(cl, readStatusError(resp))
				return nil, false
			}
			resp = nil
		}
		if cl.finished() {
			return nil, accepted
		}
		if cl.ctx.Err() != nil {
			c.finish(cl) // the caller gave up
			return nil, accepted
		}
		if sess.ctx.Err() != nil {
			return lostf(ReasonSessionLost, "the session was replaced")
		}
		if st.reset {
			return lostf(ReasonStreamFinished, "the stream was reset and ended without the response")
		}
		cur, sid := st.cursor, sess.id
		if now, _ := c.current(); now != sess {
			sid = now.id
		}
		if _, why := st.resumeCursor(sid); why != "" {
			c.log.Warn("not resuming a request stream", logMethod, cl.method, logCursor, cur, logReason, why)
			return lostf(ReasonUnattributable, "cannot resume: %s", why)
		}
		attempts++
		if attempts > c.opts.MaxRetries {
			return lostf(ReasonRetriesExceeded, "gave up after %d resume attempts", c.opts.MaxRetries)
		}
		wait := c.delay(attempts, st.retry)
		c.log.Debug("resuming request stream", logMethod, cl.method, logCursor, cur, logAttempt, attempts, logWait, wait)
		if !sleep(cl.ctx, wait) {
			continue // the checks above finish the call
		}
		var err error
		resp, err = c.get(cl.ctx, sess, cur)
		if err != nil {
			c.log.Debug("resume failed", logMethod, cl.method, logErr, err)
		}
		resuming = true
	}
}

// get opens a GET stream on sess, resuming after cursor if it is not "".
func (c *conn) get(ctx context.Context, sess *session, cursor string) (*http.Response, error) {
	_, version := c.current()
	req, err := c.request(ctx, http.MethodGet, sess, version, nil)
	if err != nil {
		return nil, err
	}
	if cursor != "" {
		req.Header.Set(headerLastEventID, cursor)
	}
	return c.opts.HTTPClient.Do(req)
}

// readJSON delivers the message(s) of a JSON answer.
func (c *conn) readJSON(resp *http.Response, intercept func(*jsonrpc.Response) bool) {
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONBody))
	if err != nil {
		c.log.Warn("reading a JSON answer", logErr, err)
		return
	}
	data = bytes.TrimSpace(data)
	var raws []json.RawMessage
	if len(data) > 0 && data[0] == '[' {
		if json.Unmarshal(data, &raws) != nil {
			return
		}
	} else {
		raws = []json.RawMessage{data}
	}
	for _, raw := range raws {
		msg, err := jsonrpc.DecodeMessage(raw)
		if err != nil {
			c.log.Warn("dropping an answer that is not JSON-RPC", logErr, err)
			continue
		}
		if r, ok := msg.(*jsonrpc.Response); ok && intercept != nil && intercept(r) {
			continue
		}
		c.deliver(msg)
	}
}

// writeOneWay POSTs a notification or a response.
func (c *conn) writeOneWay(ctx context.Context, msg jsonrpc.Message, what string) error {
	if r, ok := msg.(*jsonrpc.Request); ok && r.Method == "notifications/cancelled" {
		r.Params = c.mapCancelled(r.Params)
	}
	body, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	sess, version := c.current()
	req, err := c.request(ctx, http.MethodPost, sess, version, body)
	if err != nil {
		return err
	}
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("client: sending %s: %w", what, err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxJSONBody))
	switch {
	case resp.StatusCode/100 == 2:
		if what == "notifications/initialized" {
			c.startStandalone(sess)
		}
		return nil
	case resp.StatusCode == http.StatusNotFound && sess.id != "":
		// The session is gone; what was addressed to it cannot reach its
		// successor. Re-initialize in the background.
		c.log.Warn("session lost while sending; dropping the message", logSession, sess.id, logMethod, what)
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.reinitialize(sess)
		}()
		return nil
	}
	return fmt.Errorf("client: sending %s: HTTP %d", what, resp.StatusCode)
}

// mapCancelled rewrites the requestId of notifications/cancelled to the
// wire ID of a re-sent request.
func (c *conn) mapCancelled(params json.RawMessage) json.RawMessage {
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil {
		return params
	}
	var raw any
	if json.Unmarshal(p["requestId"], &raw) != nil {
		return params
	}
	id, err := jsonrpc.MakeID(raw)
	if err != nil {
		return params
	}
	c.mu.Lock()
	var wire any
	for _, cl := range c.calls {
		if idKey(cl.orig) == idKey(id) && idKey(cl.wire) != idKey(id) {
			wire = cl.wire.Raw()
		}
	}
	c.mu.Unlock()
	if wire == nil {
		return params
	}
	p["requestId"], _ = json.Marshal(wire)
	b, err := json.Marshal(p)
	if err != nil {
		return params
	}
	return b
}

// Close ends the connection: streams stop, the session is deleted on the
// server (DELETE, bounded by a timeout), background work is waited for.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		sess, version := c.current()
		c.cancel()
		if sess.id != "" {
			ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
			defer cancel()
			if req, err := c.request(ctx, http.MethodDelete, sess, version, nil); err == nil {
				if resp, err := c.opts.HTTPClient.Do(req); err == nil {
					resp.Body.Close()
				} else {
					c.log.Debug("DELETE failed", logSession, sess.id, logErr, err)
				}
			}
		}
		c.wg.Wait()
	})
	return nil
}

func mediaType(resp *http.Response) string {
	t, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return t
}

func readStatusError(resp *http.Response) error {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return &httpStatusError{status: resp.StatusCode, body: strings.TrimSpace(string(b))}
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// joinContext returns a context that ends when a or b does.
func joinContext(a, b context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(a)
	stop := context.AfterFunc(b, cancel)
	return ctx, func() { stop(); cancel() }
}
