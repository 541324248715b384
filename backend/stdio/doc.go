// Package stdio provides a [backend.Connector] that runs a stdio MCP server:
// one child process per session, speaking newline-delimited JSON-RPC on its
// stdin and stdout.
//
//	c, err := stdio.New(stdio.Options{Command: []string{"npx", "-y", "some-mcp-server"}})
//	defer c.Close() // stops every child
//	s, resp, err := c.Open(ctx, backend.Init{Request: initialize, Unrelated: log, Lost: recreate})
//
// # Children
//
// Open starts the command, writes the client's initialize request (its id
// rewritten, see below) and waits, bounded by its context, for the
// response, which it returns under the client's id. Each child runs in a
// process group of its own. On Linux it also gets a parent-death signal
// (SIGKILL), so that a relay killed with SIGKILL leaves no child: since the
// kernel sends that signal when the forking thread exits, children are
// forked from one goroutine locked to an OS thread that never exits.
// Session.Close and Connector.Close stop a child: its stdin is closed and
// its group gets SIGTERM, then SIGKILL after Options.StopGrace; the child is
// reaped before Close returns. When a child exits on its own, the rest of
// its group is killed too.
//
// At most Options.MaxChildren children run at once; beyond, Open fails with
// a *backend.UnavailableError. A command that exits before it answers
// initialize (or cannot be started) counts as a failed start: the connector
// (not the session) backs off exponentially between Options.StartBackoff.Min
// and Max, Open fails meanwhile with a *backend.UnavailableError whose
// RetryAfter is the time left and whose message holds the last exit status
// and stderr line, and after the backoff one start at a time is tried until
// one succeeds. There is never a fork loop.
//
// The child's stderr goes to backend.Init.Logger line by line, each line cut
// to 4 KiB, at most 50 lines a second (the number dropped is logged). A line
// on stdout over Options.MaxMessage (16 MiB) breaks the protocol and loses
// the session; a line that is not a JSON-RPC message is logged and skipped;
// a JSON array is taken as a batch and its messages routed one by one.
//
// # Relating messages to calls
//
// Toward the child, the id of every request the relay sends (through Open
// and Call; in a batch, each request's) is replaced by a number unique in
// the connector, so that the client's ids, the relay's own ("mcprelay-init")
// and two calls in flight with the same id never collide. The child's
// response to that number is handed back with the client's id spelled
// exactly as the client sent it (1.0 stays 1.0); every other byte is the
// child's. The child's messages go as follows, in the order it wrote them:
//
//  1. A response goes to the reply of the call that sent its request. A
//     response to no call in flight (an abandoned one) is dropped. The reply
//     ends (io.EOF) after the responses to all of its call's requests.
//  2. notifications/progress goes to the call in flight whose request
//     declared its params.progressToken (as params._meta.progressToken;
//     tokens compare as JSON values, so 7 and 7.0 are one token). If two
//     calls in flight declared one token, the later call gets it.
//  3. A request of the server (sampling/createMessage, elicitation/create,
//     roots/list, ping, ...) and notifications/message (logging) go to the
//     call in flight when exactly one call is in flight.
//  4. Everything else, and what rules 2 and 3 leave (no call declared the
//     token; no call or several calls in flight), goes to
//     backend.Init.Unrelated: list-changed, resources/updated, progress on a
//     token no call in flight declared, requests and logging outside a call
//     or while calls overlap.
//
// A call is in flight from Call until its reply has every response or is
// abandoned (Reply.Close, or its context ends). Notify sends client
// notifications and the client's responses to the server's requests
// unchanged (the server's ids are the server's own), except
// notifications/cancelled, whose params.requestId is rewritten to the
// child's id of each call in flight that the client's id names (none: it
// is not sent).
//
// Unrelated is called from the goroutine that reads the child's stdout: while
// it blocks, nothing more is read from the child.
//
// # Losing a session
//
// When the child exits, closes its stdout or breaks the protocol, every
// reply in flight ends with an error wrapping backend.ErrSessionLost (after
// the messages already queued for it), Init.Lost is called once (from a
// goroutine of the connector's, after the child is reaped), and later Call
// and Notify fail with backend.ErrSessionLost. After Session.Close they fail
// with ErrSessionClosed instead, replies in flight end with it, and Lost is
// not called.
//
// # What it does not do
//
// Sessions have no handle (Handle returns "" and Discard does nothing): a
// child does not outlive the relay's process. The connector does not
// implement [backend.Stateless]: the relay answers stateless (2026-07-28)
// requests for a stdio backend with an error. Replies queue without bound:
// a reader that does not keep up costs memory, not the child's progress.
package stdio
