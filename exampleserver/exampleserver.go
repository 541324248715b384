// Package exampleserver provides mcprelay's built-in example MCP server: the
// fixed set of tools, resources and prompts that the official MCP conformance
// suite (@modelcontextprotocol/conformance 0.1.16) expects of a server under
// test, plus one long-running streaming tool for resume demos.
//
// Serve it over Streamable HTTP with the official Go SDK, for example behind
// the relay:
//
//	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server {
//		return exampleserver.New(nil)
//	}, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
//	http.ListenAndServe("127.0.0.1:8080", h)
//
// Each call to [New] returns a fresh, independent *mcp.Server (tests call it
// again to simulate a backend restart). The server holds no goroutines of its
// own, so there is nothing to close.
//
// # Capabilities
//
// tools, prompts, resources (with subscribe), logging and completions;
// logging/setLevel, completion/complete, resources/subscribe,
// resources/unsubscribe and ping are answered.
//
// # Tools
//
//   - test_simple_text: text "This is a simple text response for testing."
//   - test_image_content: a 1×1 red PNG (image/png).
//   - test_audio_content: a short silent WAV (audio/wav).
//   - test_embedded_resource: resource test://embedded-resource (text/plain,
//     "This is an embedded resource content.").
//   - test_multiple_content_types: text "Multiple content types test:", the
//     PNG, and resource test://mixed-content-resource (application/json,
//     {"test":"data","value":123}).
//   - test_tool_with_logging: info log messages "Tool execution started",
//     "Tool processing data", "Tool execution completed", 50 ms apart.
//   - test_tool_with_progress: progress 0, 50, 100 of 100, 50 ms apart, on the
//     request's progressToken (none are sent without one).
//   - test_error_handling: isError result, "This tool intentionally returns an
//     error for testing".
//   - test_sampling(prompt): sampling/createMessage with maxTokens 100, then
//     "LLM response: <text>".
//   - test_elicitation(message): elicitation/create for username and email,
//     then "User response: action=<action>, content=<json>".
//   - test_elicitation_sep1034_defaults: elicitation whose schema carries
//     defaults for string, integer, number, enum and boolean fields.
//   - test_elicitation_sep1330_enums: elicitation with the five SEP-1330 enum
//     shapes.
//   - json_schema_2020_12_tool: input schema with $schema, $defs and
//     additionalProperties: false, advertised verbatim.
//   - test_reconnection: over Streamable HTTP, closes the request's SSE stream
//     (RequestExtra.CloseSSEStream, with a retry hint) shortly after it starts,
//     then returns its result later, so that the result can only reach the
//     client on a GET resume with Last-Event-ID.
//   - stream_progress(count=20, interval_ms=100): sends count progress
//     notifications (progress i of total count) on the request's
//     progressToken, or info log lines "step i of count" without one, then
//     returns "streamed <count> events". It stops with the context's error
//     when the request is cancelled. Like every log message here, the log
//     lines obey logging/setLevel: the SDK sends none until the client has set
//     a level.
//
// # Resources and prompts
//
// Resources test://static-text, test://static-binary (PNG) and
// test://watched-resource (subscribable); template test://template/{id}/data.
// Subscriptions are accepted for the fixed resources and recorded by the SDK,
// but the server never changes a resource on its own: call
// [mcp.Server.ResourceUpdated] to notify subscribers.
// Prompts test_simple_prompt, test_prompt_with_arguments(arg1, arg2),
// test_prompt_with_embedded_resource(resourceUri) and test_prompt_with_image.
//
// The server is built for the legacy (2025-xx) protocol era the conformance
// suite speaks. Sampling, elicitation and logging are the SDK's deprecated
// server-to-client features; the suite still requires them.
//
//lint:file-ignore SA1019 the conformance suite requires the deprecated sampling and logging features.
package exampleserver

import (
	"log/slog"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Name and Version identify the server in its initialize result.
const (
	Name    = "mcprelay-exampleserver"
	Version = "0.1.0"
)

// Options configures [New]. The zero value (or nil) is ready to use.
type Options struct {
	// Logger receives the server's own diagnostic records (tool progress,
	// early stops) and is passed to the SDK server. Nil discards them.
	Logger *slog.Logger
}

// Attribute keys used in log records.
const (
	keyTool  = "tool"
	keySent  = "sent"
	keyCount = "count"
	keyErr   = "err"
)

// New returns a new example server. Every call builds a fresh *mcp.Server
// with no state shared with earlier ones.
func New(opts *Options) *mcp.Server {
	var logger *slog.Logger
	if opts != nil && opts.Logger != nil {
		logger = opts.Logger
	} else {
		logger = slog.New(slog.DiscardHandler)
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: Name, Version: Version}, &mcp.ServerOptions{
		Logger:             logger,
		CompletionHandler:  complete,
		SubscribeHandler:   subscribe,
		UnsubscribeHandler: unsubscribe,
		Capabilities: &mcp.ServerCapabilities{
			Logging: &mcp.LoggingCapabilities{},
		},
	})
	addTools(srv, logger)
	addResources(srv)
	addPrompts(srv)
	return srv
}
