// Package load provides the client side of mcpbench: a lean Streamable HTTP
// MCP client (initialize, tools/call, SSE streams counted event by event,
// resumption with Last-Event-ID, idle GET streams) and the workloads built on
// it, each returning plain numbers. It speaks to any server offering the
// stream_progress and test_simple_text tools of package peers.
//
//	c := load.NewClient("http://127.0.0.1:8080/mcp")
//	res, err := load.Streams(ctx, c, 1, 100_000) // one call, 100,000 notifications
//	fmt.Println(res.EventsPerSec, res.Lost)
package load

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Errors the workloads report.
var (
	// ErrStatus reports an HTTP status the workload did not expect.
	ErrStatus = errors.New("load: unexpected HTTP status")
	// ErrNoResponse reports a stream that ended before the JSON-RPC
	// response of its request.
	ErrNoResponse = errors.New("load: stream ended without the response")
	// ErrRPC reports a JSON-RPC error response.
	ErrRPC = errors.New("load: JSON-RPC error response")
)

// ProtocolVersion is what the client asks for in initialize.
const ProtocolVersion = "2025-11-25"

// Tool names the workloads call (see package peers).
const (
	ToolStream = "stream_progress"
	ToolSimple = "test_simple_text"
)

// Client talks to one MCP endpoint.
type Client struct {
	// URL is the MCP endpoint.
	URL string
	// HTTP sends the requests; it must not set a Timeout.
	HTTP *http.Client
}

// NewClient returns a client for url with its own transport, which keeps
// up to 512 idle connections to the host.
func NewClient(url string) *Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
		ReadBufferSize:      64 << 10,
	}
	return &Client{URL: url, HTTP: &http.Client{Transport: tr}}
}

// CloseIdle closes the client's idle connections.
func (c *Client) CloseIdle() { c.HTTP.CloseIdleConnections() }

// Session is an initialized MCP session.
type Session struct {
	c *Client
	// ID is the server's Mcp-Session-Id ("" for a stateless server).
	ID string
	// Version is the negotiated protocol version.
	Version string
	next    atomic.Int64
}

func (c *Client) request(ctx context.Context, method, sid, version string, body []byte) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header["Content-Type"] = []string{"application/json"}
		req.Header["Accept"] = []string{"application/json, text/event-stream"}
	} else {
		req.Header["Accept"] = []string{"text/event-stream"}
	}
	if sid != "" {
		req.Header["Mcp-Session-Id"] = []string{sid}
	}
	if version != "" {
		req.Header["Mcp-Protocol-Version"] = []string{version}
	}
	return req, nil
}

func (c *Client) do(req *http.Request, want ...int) (*http.Response, error) {
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	for _, w := range want {
		if resp.StatusCode == w {
			return resp, nil
		}
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	return nil, fmt.Errorf("%w: %s %s: %s: %s", ErrStatus, req.Method, req.URL, resp.Status, bytes.TrimSpace(b))
}

// Initialize opens a session: initialize, then notifications/initialized.
func (c *Client) Initialize(ctx context.Context) (*Session, error) {
	body := []byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"` + ProtocolVersion +
		`","capabilities":{},"clientInfo":{"name":"mcpbench","version":"1"}}}`)
	req, err := c.request(ctx, http.MethodPost, "", "", body)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req, http.StatusOK)
	if err != nil {
		return nil, err
	}
	var data []byte
	_, err = readAnswer(resp, func(d []byte) { data = append(data[:0], d...) })
	resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("load: initialize: %w", err)
	}
	var res struct {
		Result struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
	}
	if err := json.Unmarshal(data, &res); err != nil || res.Result.ProtocolVersion == "" {
		return nil, fmt.Errorf("%w: initialize: %s", ErrRPC, data)
	}
	s := &Session{c: c, ID: resp.Header.Get("Mcp-Session-Id"), Version: res.Result.ProtocolVersion}
	req, err = c.request(ctx, http.MethodPost, s.ID, s.Version, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	if err != nil {
		return nil, err
	}
	resp, err = c.do(req, http.StatusAccepted, http.StatusOK, http.StatusNoContent)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return s, nil
}

// Call calls tool with no arguments and waits for its result.
func (s *Session) Call(ctx context.Context, tool string) error {
	id := s.next.Add(1)
	body := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":{}}}`, id, tool)
	req, err := s.c.request(ctx, http.MethodPost, s.ID, s.Version, body)
	if err != nil {
		return err
	}
	resp, err := s.c.do(req, http.StatusOK)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	isErr := false
	st, err := readAnswer(resp, func(d []byte) { isErr = !bytes.Contains(d, []byte(`"result"`)) })
	if err != nil {
		return err
	}
	if !st.Response {
		return ErrNoResponse
	}
	if isErr {
		return ErrRPC
	}
	return nil
}

// StreamStats counts what one SSE stream delivered.
type StreamStats struct {
	Progress int  // notifications/progress received
	Resets   int  // "reset" events (mcprelay's explicit loss signal)
	Response bool // the JSON-RPC response arrived
	// FirstEvent is the time from sending the request to the first event
	// carrying data (priming events have none).
	FirstEvent time.Duration
	// Elapsed is the time from sending the request to the response, or to
	// the end of the stream.
	Elapsed time.Duration
	// KeptID is the event ID of the progress notification number keep
	// (counted from 1), if asked for.
	KeptID string
}

// Stream calls stream_progress with count n and a progress token and reads
// the answer to its end, counting notifications. keep > 0 asks for the event
// ID of the keep-th notification in the result.
func (s *Session) Stream(ctx context.Context, n, keep int) (StreamStats, error) {
	id := s.next.Add(1)
	body := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":{"count":%d,"interval_ms":0},"_meta":{"progressToken":"p%d"}}}`, id, ToolStream, n, id)
	req, err := s.c.request(ctx, http.MethodPost, s.ID, s.Version, body)
	if err != nil {
		return StreamStats{}, err
	}
	start := time.Now()
	resp, err := s.c.do(req, http.StatusOK)
	if err != nil {
		return StreamStats{}, err
	}
	defer resp.Body.Close()
	var rpcErr []byte
	st, err := readSSE(resp.Body, start, keep, func(d []byte) {
		if !bytes.Contains(d, []byte(`"result"`)) {
			rpcErr = bytes.Clone(d)
		}
	})
	switch {
	case err != nil:
	case !st.Response:
		err = ErrNoResponse
	case rpcErr != nil:
		err = fmt.Errorf("%w: %s", ErrRPC, rpcErr)
	}
	return st, err
}

// Resume opens a GET with Last-Event-ID lastEventID and reads until the
// JSON-RPC response (the end of a replayed request stream) or the end of
// the stream.
func (s *Session) Resume(ctx context.Context, lastEventID string) (StreamStats, error) {
	req, err := s.c.request(ctx, http.MethodGet, s.ID, s.Version, nil)
	if err != nil {
		return StreamStats{}, err
	}
	req.Header["Last-Event-Id"] = []string{lastEventID}
	start := time.Now()
	resp, err := s.c.do(req, http.StatusOK)
	if err != nil {
		return StreamStats{}, err
	}
	defer resp.Body.Close()
	return readSSE(resp.Body, start, 0, nil)
}

// OpenGET opens the session's standalone stream and returns once the
// response header arrived; closing the result closes the stream.
func (s *Session) OpenGET(ctx context.Context) (io.Closer, error) {
	ctx, cancel := context.WithCancel(ctx)
	req, err := s.c.request(ctx, http.MethodGet, s.ID, s.Version, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := s.c.do(req, http.StatusOK)
	if err != nil {
		cancel()
		return nil, err
	}
	return closerFunc(func() error { cancel(); return resp.Body.Close() }), nil
}

// Delete ends the session (DELETE); errors are ignored.
func (s *Session) Delete(ctx context.Context) {
	req, err := s.c.request(ctx, http.MethodDelete, s.ID, s.Version, nil)
	if err != nil {
		return
	}
	if resp, err := s.c.HTTP.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// readAnswer reads a POST answer, a JSON body or an SSE stream, calling
// onResponse with the JSON-RPC response's data.
func readAnswer(resp *http.Response, onResponse func([]byte)) (StreamStats, error) {
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if ct == "text/event-stream" {
		return readSSE(resp.Body, time.Now(), 0, onResponse)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return StreamStats{}, err
	}
	if onResponse != nil {
		onResponse(b)
	}
	return StreamStats{Response: len(bytes.TrimSpace(b)) > 0}, nil
}

var (
	prefixData   = []byte("data:")
	prefixID     = []byte("id:")
	prefixEvent  = []byte("event:")
	markMethod   = []byte(`"method"`)
	markProgress = []byte(`"notifications/progress"`)
)

// readers holds the SSE readers' buffers: a new 64 KiB buffer per answer
// made the client pay for SSE answers in zeroing and GC (a quarter of its
// CPU in a round-trip run), which JSON answers did not.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

// readSSE reads SSE events until the JSON-RPC response (a data payload
// without "method") or the end of r. Each event is expected to carry its
// JSON in one data line, as every server measured here writes it.
func readSSE(r io.Reader, start time.Time, keep int, onResponse func([]byte)) (StreamStats, error) {
	var st StreamStats
	br := readers.Get().(*bufio.Reader)
	br.Reset(r)
	defer func() {
		br.Reset(nil)
		readers.Put(br)
	}()
	var (
		id, data []byte
		evType   []byte
		hasData  bool
	)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long := append([]byte(nil), line...) // line is only valid until the next read
			rest, err2 := br.ReadBytes('\n')
			line, err = append(long, rest...), err2
		}
		if n := len(line); n > 0 && line[n-1] == '\n' {
			line = line[:n-1]
			if n := len(line); n > 0 && line[n-1] == '\r' {
				line = line[:n-1]
			}
			switch {
			case len(line) == 0: // dispatch
				if string(evType) == "reset" {
					st.Resets++
				} else if hasData && len(data) > 0 {
					if st.FirstEvent == 0 {
						st.FirstEvent = time.Since(start)
					}
					if bytes.Contains(data, markMethod) {
						if bytes.Contains(data, markProgress) {
							st.Progress++
							if st.Progress == keep {
								st.KeptID = string(id)
							}
						}
					} else {
						st.Response = true
						st.Elapsed = time.Since(start)
						if onResponse != nil {
							onResponse(data)
						}
						return st, nil
					}
				}
				evType, hasData, data = evType[:0], false, data[:0]
			case bytes.HasPrefix(line, prefixData):
				hasData = true
				data = append(data, bytes.TrimPrefix(line[len(prefixData):], []byte(" "))...)
			case bytes.HasPrefix(line, prefixID):
				id = append(id[:0], bytes.TrimPrefix(line[len(prefixID):], []byte(" "))...)
			case bytes.HasPrefix(line, prefixEvent):
				evType = append(evType[:0], bytes.TrimSpace(line[len(prefixEvent):])...)
			}
		}
		if err != nil {
			st.Elapsed = time.Since(start)
			if errors.Is(err, io.EOF) {
				return st, nil
			}
			return st, err
		}
	}
}
