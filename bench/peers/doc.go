// Package peers provides the MCP servers mcpbench and scripts/probe-results
// measure mcprelay against, as [http.Handler] values: the official Go SDK
// (v1.8.x) and mcp-go (v1.2.x) Streamable HTTP handlers, each with or without
// its in-memory event store, and [Minimal], a hand-written Streamable HTTP
// handler that does almost no work (the raw net/http limit, and the minimal
// backend behind the relay). bench is a separate Go module so that these SDKs
// never become dependencies of mcprelay itself.
//
//	http.Handle("/mcp", peers.GoSDK(true)) // Go SDK + MemoryEventStore
//
// Every server offers the same two tools:
//
//   - stream_progress(count, interval_ms): sends count (default 20, at most
//     [MaxCount]) notifications/progress on the request's progressToken, then
//     returns "streamed <count> events";
//   - test_simple_text: returns "This is a simple text response for testing."
//
// The commands ./gosdk and ./mcpgo serve them on a TCP address:
//
//	go run ./peers/gosdk -addr 127.0.0.1:18941   # official Go SDK + MemoryEventStore
//	go run ./peers/mcpgo -addr 127.0.0.1:18942   # mcp-go + InMemoryEventStore
package peers

// Tool names and bounds shared by every server here.
const (
	ToolStream = "stream_progress"
	ToolSimple = "test_simple_text"

	// MaxCount bounds stream_progress's count.
	MaxCount = 1_000_000

	// DefaultCount is stream_progress's count when none is given.
	DefaultCount = 20

	// SimpleText is what test_simple_text returns.
	SimpleText = "This is a simple text response for testing."
)

func clampCount(n int) int {
	if n <= 0 {
		return DefaultCount
	}
	return min(n, MaxCount)
}
