// Package peers holds small MCP servers built on other Streamable HTTP
// implementations, for scripts/probe-results to audit with `mcprelay probe`.
// It is a separate Go module so that these SDKs never become dependencies of
// mcprelay itself.
//
//	go run ./gosdk -addr 127.0.0.1:18941   # official Go SDK + MemoryEventStore
//	go run ./mcpgo -addr 127.0.0.1:18942   # mcp-go + InMemoryEventStore
//
// Each serves one tool, stream_progress(count, interval_ms), that sends count
// notifications/progress on the request's progressToken and then returns,
// at http://ADDR/mcp.
package peers
