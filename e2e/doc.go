// Package e2e provides mcprelay's end-to-end tests: real clients driving a
// relay in front of a real MCP server, and stress runs that try to make each
// never-event of docs/design.md happen. It holds no library code; run it with
//
//	go test -race ./e2e/...
//
// What the tests cover:
//
//   - TestSDKClientEveryTool: the official Go SDK client, through the relay
//     in front of the example server (exampleserver.New), lists and calls
//     every tool (sampling and elicitation answered by the client), reads
//     every resource and gets every prompt, at protocol 2025-11-25 and at
//     the client's default revision (2026-07-28, the stateless path).
//   - TestSDKClientResumesCutStream: an http.RoundTripper cuts the SDK
//     client's stream_progress response mid-stream, once or several times
//     at random offsets; the client must resume with Last-Event-ID and see
//     every progress notification exactly once, in order, then the result.
//   - TestNoCrossSessionDelivery, TestNoSilentGap,
//     TestFinishedStreamsNeverHang, TestEventIDsNeverRepeat and
//     TestNoRequestLostSilently (never-events 1–5 of docs/design.md): many concurrent
//     sessions with distinct bearer tokens run long streaming calls whose
//     progress tokens name their session, over raw HTTP clients that cut
//     their connections at random points and resume with Last-Event-ID,
//     with a backend restart in the middle of the run and, in one variant,
//     a tiny per-session retention.
//
// Every wait is bounded, so that a relay bug fails a test rather than
// hanging it.
package e2e
