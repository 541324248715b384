// Command gosdk serves an official-Go-SDK (v1.8.0) MCP server over Streamable
// HTTP with the SDK's MemoryEventStore (peers.GoSDK), for `mcprelay probe`.
package main

import (
	"flag"
	"log"
	"net/http"

	"github.com/mcprelay/mcprelay/bench/peers"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18941", "listen address (endpoint /mcp)")
	store := flag.Bool("store", true, "use the SDK's MemoryEventStore")
	flag.Parse()
	mux := http.NewServeMux()
	mux.Handle("/mcp", peers.GoSDK(*store))
	log.Printf("gosdk peer on http://%s/mcp", *addr)
	log.Fatal(http.ListenAndServe(*addr, mux))
}
