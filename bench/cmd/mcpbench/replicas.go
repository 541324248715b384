package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/backend/stdio"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/relay/redisreplicas"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// diskRelay is mcprelay as `mcprelay serve` runs it by default: the
// example server in process, the Pebble store with --sync always.
func diskRelay(cfg serverConfig) (http.Handler, func(), error) {
	dir, err := os.MkdirTemp("", "mcpbench-disk-")
	if err != nil {
		return nil, nil, err
	}
	st, err := pebblestore.Open(filepath.Join(dir, "events"), pebblestore.Options{
		Retention: eventlog.Retention{MaxEvents: cfg.relayRetainEvents, MaxBytes: cfg.relayRetainBytes, TerminalGrace: 5 * time.Minute},
		Sync:      pebblestore.SyncAlways,
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	rh, err := relay.New(relay.Options{Backend: backend.SDK(exampleserver.New(nil), nil), Store: st, Secret: secret, SessionIdleTimeout: -1})
	if err != nil {
		st.Close()
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return rh, func() { rh.Close(); st.Close(); os.RemoveAll(dir) }, nil
}

// redisServer starts a private redis-server on a free loopback port (no
// persistence), for the redis targets.
func redisServer() (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, err := os.MkdirTemp("", "mcpbench-redis-")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("mcpbench: redis targets need redis-server (apt-get install -y redis-server): %w", err)
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(dir) }
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.New("mcpbench: redis-server did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "redis://" + addr + "/0", stop, nil
}

// redisRelays runs n mcprelay replicas on one private Redis, each with the
// example server in process, each on its own loopback listener (where the
// others forward a session's POSTs to its owner), and returns them behind a
// round-robin balancer that pins nothing (n == 1: the replica alone).
func redisRelays(n int, cfg serverConfig) (http.Handler, func(), error) {
	url, stopRedis, err := redisServer()
	if err != nil {
		return nil, nil, err
	}
	var stops []func()
	stopAll := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		stopRedis()
	}
	ctx := context.Background()
	var replicas []http.Handler
	for range n {
		st, err := redisstore.Open(ctx, redisstore.Options{URL: url, Retention: eventlog.Retention{MaxEvents: cfg.relayRetainEvents, MaxBytes: cfg.relayRetainBytes, TerminalGrace: 5 * time.Minute}})
		if err != nil {
			stopAll()
			return nil, nil, err
		}
		secret, err := st.LoadOrCreateSecret(ctx)
		if err != nil {
			st.Close()
			stopAll()
			return nil, nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			st.Close()
			stopAll()
			return nil, nil, err
		}
		self := "http://" + ln.Addr().String() + "/mcp"
		rh, err := relay.New(relay.Options{Backend: backend.SDK(exampleserver.New(nil), nil), Store: st, Secret: secret,
			Cluster: redisreplicas.New(st, self), SessionIdleTimeout: -1})
		if err != nil {
			ln.Close()
			st.Close()
			stopAll()
			return nil, nil, err
		}
		mux := http.NewServeMux()
		mux.Handle("/mcp", rh)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln)
		stops = append(stops, func() { srv.Close(); rh.Close(); st.Close() })
		replicas = append(replicas, rh)
	}
	if n == 1 {
		return replicas[0], stopAll, nil
	}
	return &roundRobin{replicas: replicas}, stopAll, nil
}

// roundRobin hands each request to the next replica in turn: a load balancer
// without affinity. It calls the replica's handler directly rather than
// through a second connection, so that a client's stream costs one file
// descriptor in this process, not three (the idle workload holds 10,000
// streams; the container's hard limit is 20,000 descriptors).
type roundRobin struct {
	replicas []http.Handler
	next     atomic.Uint64
}

func (p *roundRobin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.replicas[p.next.Add(1)%uint64(len(p.replicas))].ServeHTTP(w, r)
}

// stdioChild is the internal -serve value of a relay-stdio child: the
// example server over stdin and stdout.
const stdioChild = "stdio-child"

func serveStdioChild() error {
	return exampleserver.New(nil).Run(context.Background(), &mcp.StdioTransport{})
}

// stdioRelay is mcprelay in front of the example server as a stdio child
// per session (this binary with -serve stdio-child), memory store.
func stdioRelay(cfg serverConfig) (http.Handler, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	c, err := stdio.New(stdio.Options{Command: []string{exe, "-serve", stdioChild}, MaxChildren: 20_000})
	if err != nil {
		return nil, nil, err
	}
	store := eventlog.NewMemory(eventlog.Retention{MaxEvents: cfg.relayRetainEvents, MaxBytes: cfg.relayRetainBytes, TerminalGrace: 5 * time.Minute})
	rh, err := relay.New(relay.Options{Backend: c, Store: store, SessionIdleTimeout: -1})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return rh, func() { rh.Close(); c.Close(); store.Close() }, nil
}
