package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/bench/load"
	"github.com/mcprelay/mcprelay/bench/peers"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/mcprelay/mcprelay/relay"
)

// target is one server under test.
type target struct {
	name      string
	desc      string
	resumable bool // resumption is worth measuring (an event store)
	external  bool // not a Go handler: served by another program (startServer), never in process
	// childPerSession: every session is a process of its own (a stdio
	// child), so the idle workload's thousands of sessions are not run:
	// they exhausted the machine's memory (see the mem workload).
	childPerSession bool
}

// baseline is the target every ratio is taken against.
const baseline = "raw"

var targets = []target{
	{name: "raw", desc: "net/http with a minimal SSE/JSON handler doing no MCP work (peers.Minimal), flushing after every event: the limit, and the baseline of every ratio", resumable: true},
	{name: "raw-batched", desc: "the same handler flushing only when its 32 KiB buffer fills and at the end of a stream", resumable: true},
	{name: "relay-example", desc: "mcprelay (memory store) in front of its in-process example server, backend.SDK(exampleserver.New(nil), nil) as in `mcprelay serve`", resumable: true},
	{name: "relay-minimal", desc: "mcprelay (memory store) in front of peers.Minimal in process (batched writes, GET answered 405): the relay's own cost", resumable: true},
	{name: "relay-disk", desc: "mcprelay as `mcprelay serve` runs by default: the example server in process, the Pebble store with --sync always", resumable: true},
	{name: "relay-stdio", desc: "mcprelay (memory store) in front of the example server as a stdio child per session (mcprelay serve -- COMMAND)", resumable: true, childPerSession: true},
	{name: "relay-redis", desc: "one mcprelay replica on a private Redis (redisstore, leases), the example server in process", resumable: true},
	{name: "relay-redis3", desc: "three mcprelay replicas on one Redis in one process, each request handed to the next replica in turn (no affinity): POSTs forwarded to the session's owner, GETs served from the shared log", resumable: true},
	{name: "gosdk", desc: "official Go SDK v1.8.0 StreamableHTTPHandler, no event store", resumable: false},
	{name: "gosdk-store", desc: "official Go SDK v1.8.0 StreamableHTTPHandler with MemoryEventStore (default limits)", resumable: true},
	{name: "mcpgo", desc: "mcp-go v1.2.1 StreamableHTTPServer, no event store", resumable: false},
	{name: "mcpgo-store", desc: "mcp-go v1.2.1 StreamableHTTPServer with InMemoryEventStore", resumable: true},
	{name: "supergateway", desc: "supergateway 4.0.0 (Node, --stateful --outputTransport streamableHttp) in front of the same stdio child as relay-stdio, one per session", external: true},
}

func findTarget(name string) (target, bool) {
	for _, t := range targets {
		if t.name == name {
			return t, true
		}
	}
	return target{}, false
}

// serverConfig is what a server process needs besides its target.
type serverConfig struct {
	relayRetainEvents int
	relayRetainBytes  int64
}

// handlerFor builds the target's handler; stop releases it.
func handlerFor(name string, cfg serverConfig) (h http.Handler, stop func(), err error) {
	stop = func() {}
	relayIn := func(up *backend.Upstream) (http.Handler, func(), error) {
		store := eventlog.NewMemory(eventlog.Retention{MaxEvents: cfg.relayRetainEvents, MaxBytes: cfg.relayRetainBytes, TerminalGrace: 5 * time.Minute})
		rh, err := relay.New(relay.Options{Backend: up, Store: store, SessionIdleTimeout: -1})
		if err != nil {
			store.Close()
			return nil, nil, err
		}
		return rh, func() { rh.Close(); store.Close() }, nil
	}
	switch name {
	case "raw":
		return peers.Minimal(peers.MinimalOptions{FlushEvery: true}), stop, nil
	case "raw-batched":
		return peers.Minimal(peers.MinimalOptions{}), stop, nil
	case "relay-example":
		return relayIn(backend.SDK(exampleserver.New(nil), nil))
	case "relay-minimal":
		return relayIn(backend.Handler(peers.Minimal(peers.MinimalOptions{NoGET: true})))
	case "relay-disk":
		return diskRelay(cfg)
	case "relay-stdio":
		return stdioRelay(cfg)
	case "relay-redis":
		return redisRelays(1, cfg)
	case "relay-redis3":
		return redisRelays(3, cfg)
	case "gosdk":
		return peers.GoSDK(false), stop, nil
	case "gosdk-store":
		return peers.GoSDK(true), stop, nil
	case "mcpgo":
		return peers.MCPGo(false), stop, nil
	case "mcpgo-store":
		return peers.MCPGo(true), stop, nil
	}
	if t, ok := findTarget(name); ok && t.external {
		return nil, nil, fmt.Errorf("mcpbench: target %q is not a Go handler: it runs as a program of its own", name)
	}
	return nil, nil, fmt.Errorf("mcpbench: unknown target %q", name)
}

// profiles names the profiles a server process writes: cpu is the CPU
// profile's file, block the prefix of the block and mutex profiles.
type profiles struct{ cpu, block string }

// listenLine prefixes the line a server process prints with its URL.
const listenLine = "mcpbench-listening "

// serveTarget is the server process: it serves target name at
// http://ADDR/mcp and its memory at /debug/mem until SIGTERM or SIGINT,
// writing the profiles prof names.
func serveTarget(name, addr string, prof profiles, cfg serverConfig) error {
	h, stop, err := handlerFor(name, cfg)
	if err != nil {
		return err
	}
	defer stop()
	if prof.block != "" {
		// Every blocking event of 10 µs or more is sampled, and shorter
		// ones in proportion; one mutex contention event in 5.
		runtime.SetBlockProfileRate(10_000)
		runtime.SetMutexProfileFraction(5)
		defer func() {
			for _, kind := range []string{"block", "mutex"} {
				if f, err := os.Create(prof.block + "." + kind + ".pprof"); err == nil {
					pprof.Lookup(kind).WriteTo(f, 0)
					f.Close()
				}
			}
		}()
	}
	if prof.cpu != "" {
		stop, err := startCPUProfile(prof.cpu)
		if err != nil {
			return err
		}
		defer stop()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	mux.Handle("/debug/mem", load.MemHandler())
	mux.HandleFunc("/debug/heap", func(w http.ResponseWriter, r *http.Request) {
		runtime.GC()
		pprof.Lookup("heap").WriteTo(w, 0)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	fmt.Printf("%shttp://%s\n", listenLine, ln.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	// Streams are long: do not wait for them.
	srv.Close()
	return nil
}

// startCPUProfile writes this process's CPU profile to path until stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
