package backend

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
	"sync"
	"time"

	"github.com/mcprelay/mcprelay/internal/wire"
	"github.com/mcprelay/mcprelay/sse"
)

// Header names of the Streamable HTTP transport.
const (
	headerSessionID       = "Mcp-Session-Id"
	headerProtocolVersion = "Mcp-Protocol-Version"
	headerLastEventID     = "Last-Event-ID"
)

// MaxMessageBytes bounds one message read from an HTTP backend, as a JSON
// body or as one SSE event. A larger one is an error, never cut short.
const MaxMessageBytes = 16 << 20

// ErrMessageTooLarge reports a backend message over MaxMessageBytes.
var ErrMessageTooLarge = errors.New("backend: message larger than 16 MiB")

// StatusError is a backend's refusal of a message with an HTTP status other
// than 200 or 202 (and other than 404 for its session, which is
// ErrSessionLost). The relay passes it to its client.
type StatusError struct {
	Code        int
	ContentType string
	Body        []byte // at most 1 MiB of the backend's answer
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("backend: HTTP %d: %s", e.Code, bytes.TrimSpace(e.Body[:min(len(e.Body), 200)]))
}

var (
	_ Connector = (*Upstream)(nil)
	_ Stateless = (*Upstream)(nil)
)

// Open starts a backend session: it POSTs the client's initialize request
// and returns the backend's response. The backend's GET stream is opened
// once the caller has sent notifications/initialized and called Listen.
func (u *Upstream) Open(ctx context.Context, init Init) (Session, []byte, error) {
	id, err := requestID(init.Request)
	if err != nil {
		return nil, nil, err
	}
	s := &httpSession{u: u, header: init.Header, unrelated: init.Unrelated, lost: init.Lost, log: init.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	resp, err := s.do(ctx, http.MethodPost, init.Request, "")
	if err != nil {
		return nil, nil, &UnavailableError{Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, statusError(resp)
	}
	res, err := firstResponse(resp, id)
	if err != nil {
		return nil, nil, fmt.Errorf("backend: initialize: %w", err)
	}
	// Under the client's id, byte for byte (a backend may re-encode it).
	res, _ = wire.ReplaceID(res, id)
	var out struct {
		Result *struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
	}
	if err := json.Unmarshal(res, &out); err != nil || out.Result == nil {
		return nil, res, nil // a JSON-RPC error: no session
	}
	s.version = out.Result.ProtocolVersion
	s.handle = resp.Header.Get(headerSessionID)
	s.handleVal, s.versionVal = []string{s.handle}, []string{s.version}
	return s, res, nil
}

// Discard DELETEs a backend session known by its handle.
func (u *Upstream) Discard(ctx context.Context, handle string) error {
	if handle == "" {
		return nil
	}
	s := &httpSession{u: u, handle: handle}
	return s.delete(ctx)
}

// httpSession is one session of a Streamable HTTP backend.
type httpSession struct {
	u       *Upstream
	handle  string      // the backend's Mcp-Session-Id
	version string      // negotiated protocol version, sent as MCP-Protocol-Version
	header  http.Header // Init.Header
	// handleVal and versionVal are handle and version as header values,
	// shared by the session's requests once it is open.
	handleVal, versionVal []string
	unrelated             func([]byte)
	lost                  func(error)
	log                   *slog.Logger

	mu          sync.Mutex
	closed      bool
	initialized bool // notifications/initialized was sent
	listen      bool // Listen was called
	pumping     bool
	stopPump    context.CancelFunc
	lostOnce    sync.Once
	nextID      uint64
	calls       map[*httpReply]struct{}    // replies in flight, ended by Close
	inflightIDs map[string]string          // client id (match key) → the backend's id, for calls in flight
	clientIDs   map[string]json.RawMessage // the backend's id → the client's, for calls in flight
}

func (s *httpSession) Handle() string { return s.handle }

// Header values every request of a session carries, shared by all of them
// (never changed in place).
var (
	valJSON       = []string{"application/json"}
	valAcceptBoth = []string{"application/json, text/event-stream"}
	valAcceptSSE  = []string{"text/event-stream"}
)

// setSessionHeader sets on h what every request of the session carries
// besides its content headers: Init.Header, Upstream.Header, and, once the
// session is open, its Mcp-Session-Id and MCP-Protocol-Version.
func (s *httpSession) setSessionHeader(h http.Header) {
	for k, vs := range s.header {
		h[k] = vs
	}
	s.u.setHeader(h)
	if s.handle != "" {
		if s.handleVal == nil {
			h[headerSessionID] = []string{s.handle}
		} else {
			h[headerSessionID] = s.handleVal
		}
	}
	if s.version != "" {
		if s.versionVal == nil {
			h[headerProtocolVersion] = []string{s.version}
		} else {
			h[headerProtocolVersion] = s.versionVal
		}
	}
}

// do sends one request of the session.
func (s *httpSession) do(ctx context.Context, method string, body []byte, lastEventID string) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	c := s.u.HTTPClient()
	ip, direct := directly(c)
	var cancel context.CancelCauseFunc
	if direct {
		// The request is the handler's own: no copy of it is made.
		ctx, cancel = handlerContext(ctx)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.u.URL, rd)
	if err != nil {
		if cancel != nil {
			cancel(err)
		}
		return nil, err
	}
	h := make(http.Header, len(s.header)+len(s.u.Header)+4)
	s.setSessionHeader(h)
	if body != nil {
		h["Content-Type"] = valJSON
		h["Accept"] = valAcceptBoth
	} else {
		h["Accept"] = valAcceptSSE
	}
	if lastEventID != "" {
		h[http.CanonicalHeaderKey(headerLastEventID)] = []string{lastEventID}
	}
	req.Header = h
	if direct {
		return ip.serve(req, req, ctx, cancel, max(s.u.responseTimeout(), 0))
	}
	return doBounded(c, req, s.u.responseTimeout())
}

// directly returns the in-process handler behind c when it can be called
// without c ([Handler], [SDK]): without a socket there are no redirects,
// cookies or client timeouts for http.Client to apply, only its cost per
// request.
func directly(c *http.Client) (inProcess, bool) {
	t, ok := c.Transport.(inProcess)
	return t, ok && c.Jar == nil && c.CheckRedirect == nil && c.Timeout == 0
}

// doBounded sends req and fails with ErrTimeout if the response headers do
// not come within d (0: no bound). The body, once it comes, is not bounded.
func doBounded(c *http.Client, req *http.Request, d time.Duration) (*http.Response, error) {
	if d <= 0 {
		return c.Do(req)
	}
	ctx, cancel := context.WithCancelCause(req.Context())
	t := time.AfterFunc(d, func() { cancel(ErrTimeout) })
	resp, err := c.Do(req.WithContext(ctx))
	if !t.Stop() {
		if err == nil {
			resp.Body.Close()
		}
		cancel(nil)
		return nil, fmt.Errorf("%w (%v, %s %s)", ErrTimeout, d, req.Method, "backend")
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelBody releases its request's context when closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

func (s *httpSession) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Notify POSTs notifications or responses and expects 202 (or 200). The
// first notifications/initialized puts the session in operation: the
// backend's GET stream is opened.
func (s *httpSession) Notify(ctx context.Context, msg []byte) error {
	if s.isClosed() {
		return ErrSessionLost
	}
	msg = s.rewriteCancel(msg)
	resp, err := s.do(ctx, http.MethodPost, msg, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound && s.handle != "":
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return ErrSessionLost
	case resp.StatusCode >= 300:
		return statusError(resp)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if isInitialized(msg) {
		s.mu.Lock()
		s.initialized = true
		s.mu.Unlock()
		s.startPump()
	}
	return nil
}

// Listen implements [Session]: the backend's GET stream is opened once the
// session is initialized.
func (s *httpSession) Listen() {
	s.mu.Lock()
	s.listen = true
	s.mu.Unlock()
	s.startPump()
}

// isInitialized reports whether msg is the notifications/initialized
// notification (read once per session, not per event).
func isInitialized(msg []byte) bool {
	if !bytes.Contains(msg, []byte("notifications/initialized")) {
		return false
	}
	var m struct {
		Method string `json:"method"`
	}
	return json.Unmarshal(msg, &m) == nil && m.Method == "notifications/initialized"
}

// Call POSTs requests and returns the backend's answer as a Reply. Each
// request goes under an id of the connector's own, unique in the session,
// so that the client's ids never collide with each other or with the
// relay's own requests (a server refuses an id already in flight); the
// responses come back under the client's ids, byte for byte. A 404 for the
// session is ErrSessionLost.
func (s *httpSession) Call(ctx context.Context, msg []byte, ids []json.RawMessage) (Reply, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrSessionLost
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &httpReply{ctx: ctx, cancel: cancel, s: s}
	r.orig, r.ownIDs, r.keys = r.oneOrig[:0], r.oneOwn[:0], r.oneKey[:0]
	out, err := s.rewriteLocked(msg, r)
	if s.calls == nil {
		s.calls = make(map[*httpReply]struct{})
	}
	s.calls[r] = struct{}{}
	s.mu.Unlock()
	if err != nil {
		r.finish()
		return nil, err
	}
	resp, err := s.do(ctx, http.MethodPost, out, "")
	if err != nil {
		r.finish()
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && s.handle != "":
		resp.Body.Close()
		r.finish()
		return nil, ErrSessionLost
	case resp.StatusCode != http.StatusOK:
		defer resp.Body.Close()
		r.finish()
		return nil, statusError(resp)
	}
	r.open(resp)
	return r, nil
}

// rewriteLocked gives each request of msg (one message or a batch) an id
// of the connector's, recording the client's in r. s.mu is held.
func (s *httpSession) rewriteLocked(msg []byte, r *httpReply) ([]byte, error) {
	one := func(m []byte) ([]byte, error) {
		head, ok := wire.ReadHead(m)
		if !ok {
			return nil, errors.New("backend: call: not a JSON-RPC message it can read")
		}
		client := wire.IDKey(head.ID(m))
		if !head.Method || len(client) == 0 {
			return m, nil // a notification, or a response to a server's request
		}
		s.nextID++
		var buf [32]byte
		own := string(append(strconv.AppendUint(append(buf[:0], `"mcprelay-`...), s.nextID, 10), '"'))
		out := head.ReplaceID(m, []byte(own))
		r.orig = append(r.orig, idPair{own: own, client: client})
		r.ownIDs = append(r.ownIDs, own)
		if s.inflightIDs == nil {
			s.inflightIDs = make(map[string]string)
		}
		k := wire.MatchKey(client)
		s.inflightIDs[k] = own
		if s.clientIDs == nil {
			s.clientIDs = make(map[string]json.RawMessage)
		}
		s.clientIDs[own] = client
		r.keys = append(r.keys, k)
		return out, nil
	}
	t := bytes.TrimSpace(msg)
	if len(t) == 0 || t[0] != '[' {
		return one(t)
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(t, &batch); err != nil {
		return nil, fmt.Errorf("backend: call: %w", err)
	}
	for i, m := range batch {
		out, err := one(m)
		if err != nil {
			return nil, err
		}
		batch[i] = out
	}
	return json.Marshal(batch)
}

// rewriteCancel gives a notifications/cancelled the backend's id of the
// request it names, while that request is in flight.
func (s *httpSession) rewriteCancel(msg []byte) []byte {
	if !bytes.Contains(msg, []byte("notifications/cancelled")) {
		return msg
	}
	var m struct {
		Method string `json:"method"`
		Params struct {
			RequestID json.RawMessage `json:"requestId"`
		} `json:"params"`
	}
	if json.Unmarshal(msg, &m) != nil || m.Method != "notifications/cancelled" {
		return msg
	}
	s.mu.Lock()
	own, ok := s.inflightIDs[wire.MatchKey(wire.IDKey(m.Params.RequestID))]
	s.mu.Unlock()
	if !ok {
		return msg
	}
	var full map[string]json.RawMessage
	var params map[string]json.RawMessage
	if json.Unmarshal(msg, &full) != nil || json.Unmarshal(full["params"], &params) != nil {
		return msg
	}
	params["requestId"] = json.RawMessage(own)
	full["params"], _ = json.Marshal(params)
	out, err := json.Marshal(full)
	if err != nil {
		return msg
	}
	return out
}

// Close DELETEs the backend session and stops its GET stream.
func (s *httpSession) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	stop := s.stopPump
	calls := s.calls
	s.calls = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for r := range calls {
		// The calls in flight end with the session: their replies end
		// here, not on the backend's time, and the backend is told (a
		// server may hold the session's end until its calls finish).
		r.Close()
		for _, own := range r.ownIDs {
			if resp, err := s.do(ctx, http.MethodPost, []byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":`+own+`,"reason":"session closed"}}`), ""); err == nil {
				io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
				resp.Body.Close()
			}
		}
	}
	if s.handle == "" {
		return nil
	}
	return s.delete(ctx)
}

func (s *httpSession) delete(ctx context.Context) error {
	resp, err := s.do(ctx, http.MethodDelete, nil, "")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
		return fmt.Errorf("backend: DELETE: HTTP %d", resp.StatusCode)
	}
	return nil
}

// sessionLost reports the loss once, outside any call.
func (s *httpSession) sessionLost() {
	if s.isClosed() {
		return
	}
	s.lostOnce.Do(func() {
		if s.lost != nil {
			s.lost(ErrSessionLost)
		}
	})
}

// confirmLost asks the backend whether the session still exists (a ping):
// only a 404 to a POST says it is gone. A GET answered 404 does not: many
// servers define only POST on their endpoint.
func (s *httpSession) confirmLost(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := s.do(ctx, http.MethodPost, []byte(`{"jsonrpc":"2.0","id":"mcprelay-ping","method":"ping"}`), "")
	if err != nil {
		return false
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode == http.StatusNotFound
}

// startPump opens the GET stream once the session is initialized and
// Listen was called.
func (s *httpSession) startPump() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pumping || s.closed || !s.initialized || !s.listen {
		return
	}
	s.pumping = true
	ctx, cancel := context.WithCancel(context.Background())
	s.stopPump = cancel
	go s.pump(ctx)
}

// pump keeps the backend's GET stream open and hands what arrives on it to
// the unrelated callback. It stops for good when the backend offers no GET
// stream (405, or 404 while a POST finds the session alive), and reports a
// lost session when a POST confirms it.
func (s *httpSession) pump(ctx context.Context) {
	lastID := ""
	for failures := 0; ctx.Err() == nil; {
		resp, err := s.do(ctx, http.MethodGet, nil, lastID)
		wait := time.Duration(1<<min(failures, 6)) * 100 * time.Millisecond
		if err == nil {
			switch resp.StatusCode {
			case http.StatusMethodNotAllowed:
				resp.Body.Close()
				return // the server offers no GET stream
			case http.StatusNotFound:
				resp.Body.Close()
				if s.confirmLost(ctx) {
					s.sessionLost()
				} else {
					s.log.Debug("backend answers GET with 404 but the session is alive: no GET stream")
				}
				return
			case http.StatusOK:
				failures = 0
				id, retry, _ := readMessages(resp, func(data []byte) bool {
					if s.unrelated != nil {
						s.unrelated(s.clientID(data))
					}
					return true
				})
				resp.Body.Close()
				if id != "" {
					lastID = id
				}
				if retry > 0 {
					wait = retry
				}
			default:
				resp.Body.Close()
			}
		}
		failures++
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(wait, 10*time.Second)):
		}
	}
}

// statusError reads a refused answer.
func statusError(resp *http.Response) *StatusError {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return &StatusError{Code: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Body: b}
}

// requestID returns the id of a JSON-RPC request.
func requestID(msg []byte) (json.RawMessage, error) {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal(msg, &m); err != nil || len(m.ID) == 0 {
		return nil, errors.New("backend: initialize request without an id")
	}
	return m.ID, nil
}

// readMessages calls fn with each JSON-RPC payload of a backend answer, a
// JSON body or an SSE stream, until fn returns false or the body ends. It
// returns the last SSE event ID and retry seen; err is nil at a clean end
// of the body, ErrMessageTooLarge for a message over MaxMessageBytes.
func readMessages(resp *http.Response, fn func(data []byte) bool) (lastID string, retry time.Duration, err error) {
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if ct != "text/event-stream" {
		data, err := io.ReadAll(io.LimitReader(resp.Body, MaxMessageBytes+1))
		if err != nil {
			return "", 0, err
		}
		if len(data) > MaxMessageBytes {
			return "", 0, ErrMessageTooLarge
		}
		if len(bytes.TrimSpace(data)) > 0 {
			fn(data)
		}
		return "", 0, nil
	}
	sc := sse.NewScanner(resp.Body)
	sc.MaxEventBytes = MaxMessageBytes
	sc.SkipEventIDs = true // returned once, at the end
	for {
		ev, err := sc.Next()
		if ev.Retry > 0 {
			retry = ev.Retry
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			} else if errors.Is(err, sse.ErrTooLarge) {
				err = ErrMessageTooLarge
			}
			return sc.LastEventID(), retry, err
		}
		if len(ev.Data) == 0 || (ev.Type != "" && ev.Type != "message") {
			continue
		}
		if !fn(ev.Data) {
			return sc.LastEventID(), retry, nil
		}
	}
}

// firstResponse reads a backend answer until the response with id.
func firstResponse(resp *http.Response, id json.RawMessage) ([]byte, error) {
	var out []byte
	_, _, err := readMessages(resp, func(data []byte) bool {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(data, &m) == nil && m.Method == "" && wire.MatchKey(wire.IDKey(m.ID)) == wire.MatchKey(wire.IDKey(id)) {
			out = data
			return false
		}
		return true
	})
	if out == nil && err == nil {
		err = errors.New("backend ended its answer without a response")
	}
	return out, err
}

// clientID gives a response that a backend sent on its GET stream (which
// only a server resuming a request stream should do) the client's id back,
// so that the relay can still relate it to its call.
func (s *httpSession) clientID(data []byte) []byte {
	ids := wire.ResponseIDs(data, nil)
	if len(ids) != 1 {
		return data
	}
	s.mu.Lock()
	client, ok := s.clientIDs[string(ids[0])]
	s.mu.Unlock()
	if !ok {
		return data
	}
	out, _ := wire.ReplaceID(data, client)
	return out
}
