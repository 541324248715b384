// Command mcpgo serves an mcp-go (v1.2.x) MCP server over Streamable HTTP
// with mcp-go's InMemoryEventStore (peers.MCPGo), for `mcprelay probe`.
package main

import (
	"flag"
	"log"
	"net/http"

	"github.com/mcprelay/mcprelay/bench/peers"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18942", "listen address (endpoint /mcp)")
	store := flag.Bool("store", true, "use mcp-go's InMemoryEventStore")
	flag.Parse()
	mux := http.NewServeMux()
	mux.Handle("/mcp", peers.MCPGo(*store))
	log.Printf("mcp-go peer on http://%s/mcp", *addr)
	log.Fatal(http.ListenAndServe(*addr, mux))
}
