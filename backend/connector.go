package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"
)

// ErrSessionLost reports that the backend no longer has the session: an
// HTTP backend answered 404 for it, a stdio child exited. Whatever was in
// flight on it will not be answered. The relay re-creates the backend side
// as a new incarnation; the client keeps its session.
var ErrSessionLost = errors.New("backend: session lost")

// UnavailableError reports that a backend session cannot be opened now
// (too many children, a child that keeps dying at start, an upstream that
// refuses connections). The relay answers 503 with Retry-After; the client
// keeps its session and tries again.
type UnavailableError struct {
	RetryAfter time.Duration // how long the caller should wait; 0 means "soon"
	Err        error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("backend: unavailable (retry after %v): %v", e.RetryAfter, e.Err)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// Poll is the error a [Reply] returns when the backend closed its stream
// asking to be polled (a server-initiated close with an SSE retry field,
// 2025-11-25): the relay closes its own client stream the same way. The
// reply goes on: the next call of Next resumes the backend's stream.
type Poll struct {
	Retry time.Duration
}

func (p *Poll) Error() string {
	return fmt.Sprintf("backend: stream closed for polling, retry %v", p.Retry)
}

// Connector opens backend sessions. It is the seam between the relay, which
// owns everything the client sees (sessions, streams, event IDs, the log),
// and the MCP server, which a connector reaches: in process, over HTTP, or
// as a stdio child. Implementations are safe for concurrent use; package
// connectortest holds the suite every connector passes.
type Connector interface {
	// Open starts a backend session with init.Request, the client's
	// initialize request (its own id), and returns the session and the
	// backend's response to that request, under the same id. The session
	// is not yet in operation: the caller sends notifications/initialized
	// through Notify. An error wrapping *UnavailableError means "not now".
	// When the backend answers initialize with a JSON-RPC error, Open
	// returns that response, a nil Session and a nil error.
	Open(ctx context.Context, init Init) (Session, []byte, error)

	// Discard ends a backend session this process no longer holds, known
	// by its handle (Session.Handle, recorded before a restart). Backends
	// without handles do nothing.
	Discard(ctx context.Context, handle string) error
}

// Init is what Open needs to start one backend session.
type Init struct {
	// Request is the client's initialize request, a whole JSON-RPC message.
	Request []byte

	// Header holds HTTP headers an HTTP backend sends on every request of
	// the session: the client's Authorization when the relay forwards it
	// (relay.Options.ForwardAuthorization), else nothing. Others ignore
	// it.
	Header http.Header

	// Unrelated receives, in order, the backend's messages that belong to
	// no call (list-changed, logging with no call in flight, requests of
	// the server outside a call), from the session's first Listen on
	// (a connector that receives them anyway may pass them on before). It
	// is called from one goroutine of the
	// connector's and may block (the relay logs durably): the connector
	// waits. Nil drops them.
	Unrelated func(msg []byte)

	// Lost is called at most once, from a goroutine of the connector's,
	// when the connector learns outside any call that the session is lost
	// (the child exited, the backend's GET stream answered 404 and a
	// check confirmed it). Calls in flight also fail with ErrSessionLost.
	Lost func(err error)

	// Logger receives the connector's logs for this session (a stdio
	// child's stderr, tagged); nil discards them.
	Logger *slog.Logger
}

// Session is one backend session. Its methods are safe for concurrent use.
type Session interface {
	// Handle is the backend's own name for the session (an HTTP backend's
	// Mcp-Session-Id), recorded so that Discard can end it after a
	// restart; "" if it has none.
	Handle() string

	// Call sends client requests, msg being one JSON-RPC request or a
	// 2025-03-26 batch whose requests have the given ids, and returns the
	// backend's messages related to them. The reply lives as long as ctx:
	// cancelling ctx abandons it (legacy era: only notifications/cancelled
	// cancels a request, so the relay's ctx outlives the client's
	// connection). ErrSessionLost if the session is gone before the call
	// was sent.
	Call(ctx context.Context, msg []byte, ids []json.RawMessage) (Reply, error)

	// Notify sends client notifications or responses (answers to the
	// server's requests): msg is one message or a batch. ErrSessionLost if
	// the session is gone.
	Notify(ctx context.Context, msg []byte) error

	// Listen asks for the backend's unrelated messages (Init.Unrelated)
	// from now on, once the session is in operation. A connector that
	// must hold something open per session to receive them (an HTTP
	// backend's GET stream: a goroutine and a connection) does so only
	// from the first Listen on, so a session whose client never listens
	// costs nothing for it; a stdio child's messages arrive anyway.
	// Listen is idempotent and does not block.
	Listen()

	// Close ends the backend session (an HTTP DELETE, a child stopped).
	// Replies in flight end. Close is idempotent.
	Close() error
}

// Reply is the stream of backend messages related to one Call: progress,
// logging and server requests made for it, and the responses to its
// requests. It is read by one goroutine.
type Reply interface {
	// Next returns the next related message. It returns io.EOF once the
	// backend has sent everything it will send for the call: for a
	// well-behaved backend, right after the responses to all of the call's
	// ids (the relay checks that each came; one that did not is lost).
	// *Poll asks the relay to carry a server-initiated close to its
	// client; Next may be called again. ErrSessionLost: the session is
	// gone and the call with it. Other errors: the call is lost.
	Next() ([]byte, error)

	// Close abandons the reply and releases what it holds.
	Close() error
}

// Buffered is implemented by replies that may already hold the backend's
// next message (an in-process handler that had finished its answer before
// Call returned, a stdio child that had answered). TryNext returns it
// without waiting on the backend, or ok false: then Next must be called,
// and may wait. The relay logs a quick call's answer from the client's own
// goroutine that way, with no goroutine of its own.
type Buffered interface {
	TryNext() (msg []byte, ok bool)
}

// Stateless is implemented by connectors that serve stateless (2026-07-28)
// requests, which carry no session: the connector answers w itself. The
// client closing its connection (r's context) cancels the request, as that
// revision requires. A connector without it makes the relay answer such
// requests with a clear error. It returns what went wrong with the backend
// (never shown to the client, whose answer names no internal address):
// wrapping ErrAnswerBroken when the answer broke off after it began.
type Stateless interface {
	ServeStateless(w http.ResponseWriter, r *http.Request, body []byte) error
}
