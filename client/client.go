// Package client provides a Streamable HTTP client transport for the official
// MCP Go SDK that resumes broken streams, understands the resets and lost
// requests reported by mcprelay, re-initializes a lost session, and never
// leaves a call waiting forever.
//
//	t := client.New(client.Options{Endpoint: "http://127.0.0.1:8080/mcp"})
//	c := mcp.NewClient(&mcp.Implementation{Name: "me", Version: "1"}, nil)
//	cs, err := c.Connect(ctx, t, nil)
//	if err != nil {
//		return err
//	}
//	defer cs.Close() // sends DELETE
//	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "long_job"})
//	if client.IsLost(err) {
//		// the server lost the request: its outcome is unknown
//	}
//
// What the transport does, for any Streamable HTTP server (legacy era,
// protocol 2025-03-26 to 2025-11-25):
//
//   - It keeps a cursor (the last event ID) per stream and resumes a broken
//     POST or GET stream by GET with Last-Event-ID, waiting as the server's
//     "retry:" says, else with capped exponential backoff and jitter, at most
//     [Options.MaxRetries] times per break.
//   - It refuses cursors it cannot attribute: a cursor received under
//     another session ID, or a bare integer ID (such counters restart with
//     the server process and would select the wrong events). The stream is
//     then started afresh and the reason logged; a request stream that
//     cannot be resumed is reported lost (or re-sent, see below).
//   - It hands each event to the SDK once: events repeated by an overlapping
//     replay are dropped, and a second response to the same request is
//     never delivered.
//   - It understands mcprelay's "reset" event and the JSON-RPC error
//     (code -32001, data {"reason":"backend_lost"}) that accompanies a lost
//     request, and reports every reset to [Options.OnReset]: a gap says
//     events were lost to eviction, not delayed.
//   - On 404 for its session it re-initializes with the recorded initialize
//     request (same client info and capabilities) and sends
//     notifications/initialized, then re-sends in-flight requests that are
//     safe to repeat (see [Options.Idempotent] and [Idempotent]) under new
//     request IDs, mapping their responses back to the SDK's IDs; every other
//     in-flight request fails with an error matching [ErrRequestLost].
//   - Close sends DELETE.
//
// A lost request surfaces from the SDK (for example from
// mcp.ClientSession.CallTool) as an error for which
// errors.Is(err, client.ErrRequestLost) holds: the transport hands the SDK a
// response whose error is a [*LostError], and the SDK wraps it with %w. [IsLost]
// also recognizes the bare JSON-RPC error code -32001, should an error reach
// the caller by another route.
//
// The transport does not use the stateless 2026-07-28 revision: the SDK's
// server/discover probe is answered locally with "method not found", so the
// SDK falls back to initialize at [Options.ProtocolVersion].
package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/mcprelay/mcprelay/resume"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ErrRequestLost is matched (errors.Is) by the error a call returns when its
// request was lost: its response can no longer come, and whether the server
// acted on it is unknown.
var ErrRequestLost = errors.New("client: request lost")

// CodeRequestLost is the JSON-RPC error code mcprelay uses for a request
// whose response can no longer come, and the code of the [*LostError]'s
// JSON-RPC form: [resume.CodeRequestLost], the relay's own constant.
const CodeRequestLost = resume.CodeRequestLost

// Reasons a request is reported lost ([LostError.Reason]).
const (
	ReasonSessionLost     = "session_lost"                   // the server answered 404: the session is gone
	ReasonBackendLost     = string(resume.ReasonBackendLost) // the server (mcprelay) said the backend lost it
	ReasonStreamFinished  = "stream_finished"                // the stream ended (204, or after a reset) without its response
	ReasonCursorRejected  = "cursor_rejected"                // the resume was refused (400, 409, 405, ...)
	ReasonUnattributable  = "unattributable_cursor"          // no cursor this client may send (none, bare integer, other session)
	ReasonRetriesExceeded = "retries_exhausted"              // Options.MaxRetries resume attempts failed
	ReasonSendFailed      = "send_failed"                    // the POST itself failed
)

// LostError is the error of a request that was lost. It matches
// [ErrRequestLost] and, when the server sent one, its JSON-RPC error
// (errors.As with *jsonrpc.Error).
type LostError struct {
	Method string         // the request's method
	Reason string         // one of the Reason constants
	Detail string         // what happened, for people
	Wire   *jsonrpc.Error // the server's error response, if there was one
}

func (e *LostError) Error() string {
	s := "client: request lost: " + e.Method + ": " + e.Reason
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns ErrRequestLost and the server's error, if any.
func (e *LostError) Unwrap() []error {
	if e.Wire != nil {
		return []error{ErrRequestLost, e.Wire}
	}
	return []error{ErrRequestLost}
}

// IsLost reports whether err says a request was lost: it matches
// [ErrRequestLost], or it is a JSON-RPC error with code [CodeRequestLost].
func IsLost(err error) bool {
	if errors.Is(err, ErrRequestLost) {
		return true
	}
	var w *jsonrpc.Error
	return errors.As(err, &w) && w.Code == CodeRequestLost
}

// Options configures a [Transport]. The zero value, with Endpoint set, works.
type Options struct {
	// Endpoint is the server's MCP endpoint URL. Required.
	Endpoint string

	// HTTPClient sends the requests. Nil means http.DefaultClient. Its
	// Timeout, if any, bounds whole streams; leave it zero and rely on
	// contexts.
	HTTPClient *http.Client

	// MaxRetries is how many times one break of a stream (or one session
	// re-initialization) is retried before giving up. Zero means 10;
	// negative means no retries.
	MaxRetries int

	// MinBackoff and MaxBackoff bound the capped exponential backoff
	// (with jitter) between attempts. Zero means 100ms and 10s. A "retry:"
	// sent by the server sets the next wait instead.
	MinBackoff, MaxBackoff time.Duration

	// Idempotent reports whether requests of a method may be sent again
	// after their session was lost. Nil means [ReadOnly]. A single call can
	// also be marked with [Idempotent].
	Idempotent func(method string) bool

	// Logger receives the transport's logs (resumes, resets, refused
	// cursors, re-initialization). Nil discards them.
	Logger *slog.Logger

	// ProtocolVersion is sent in initialize and in MCP-Protocol-Version
	// until the server's answer fixes the version. Empty means "2025-11-25".
	ProtocolVersion string

	// OnReset, if set, is called with each reset event a server such as
	// mcprelay sends on one of the transport's streams, as it arrives and
	// before the events after it are handed on: for example a gap (events
	// of the stream were evicted before the client came back for them:
	// they will not come) or a generation change. It is called from the
	// transport's reading goroutines and must not block. Nil: resets are
	// only logged.
	OnReset func(resume.Reset)
}

// ReadOnly is the default [Options.Idempotent]: ping, resources/read,
// prompts/get, and every method ending in "/list".
func ReadOnly(method string) bool {
	switch method {
	case "ping", "resources/read", "prompts/get":
		return true
	}
	return strings.HasSuffix(method, "/list")
}

// Transport is an mcp.Transport for one connection to a Streamable HTTP
// server. Create it with [New]; like every SDK transport it is used for one
// Connect.
type Transport struct {
	opts Options
}

var _ mcp.Transport = (*Transport)(nil)

// New returns a transport with opts, defaults filled in.
func New(opts Options) *Transport {
	if opts.HTTPClient == nil {
		opts.HTTPClient = http.DefaultClient
	}
	switch {
	case opts.MaxRetries == 0:
		opts.MaxRetries = 10
	case opts.MaxRetries < 0:
		opts.MaxRetries = 0
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 10 * time.Second
	}
	opts.MaxBackoff = max(opts.MaxBackoff, opts.MinBackoff)
	if opts.Idempotent == nil {
		opts.Idempotent = ReadOnly
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ProtocolVersion == "" {
		opts.ProtocolVersion = "2025-11-25"
	}
	return &Transport{opts: opts}
}

// ErrNoEndpoint is returned by Connect when Options.Endpoint is empty.
var ErrNoEndpoint = errors.New("client: no endpoint")

// Connect returns the logical connection. Nothing is sent until the SDK
// writes its first message.
func (t *Transport) Connect(ctx context.Context) (mcp.Connection, error) {
	if t.opts.Endpoint == "" {
		return nil, ErrNoEndpoint
	}
	return newConn(t.opts), nil
}

type idempotentKey struct{}

// Idempotent returns a context that marks the request sent with it as safe
// to repeat: if its session is lost (or the server reports it lost), the
// transport sends it again instead of failing it with [ErrRequestLost].
//
//	res, err := cs.CallTool(client.Idempotent(ctx), params)
//
// The SDK passes a call's context to the transport, so the mark reaches it.
func Idempotent(ctx context.Context) context.Context {
	return context.WithValue(ctx, idempotentKey{}, true)
}

func markedIdempotent(ctx context.Context) bool {
	v, _ := ctx.Value(idempotentKey{}).(bool)
	return v
}

// Log attribute keys.
const (
	logSession = "session"
	logMethod  = "method"
	logCursor  = "cursor"
	logReason  = "reason"
	logStatus  = "status"
	logAttempt = "attempt"
	logWait    = "wait"
	logErr     = "err"
)

// httpStatusError is a non-success HTTP answer.
type httpStatusError struct {
	status int
	body   string
}

func (e *httpStatusError) Error() string {
	return fmt.Sprintf("client: HTTP %d: %s", e.status, e.body)
}
