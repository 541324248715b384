package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// exampleServer serves the built-in example server directly, without the
// relay, over a socket: a stand-in for any remote MCP server, to put
// behind "mcprelay serve --upstream". With --stdio it serves one session
// on stdin and stdout instead (newline-delimited JSON-RPC), a stand-in for
// any stdio MCP server; logs then go to stderr only.
func exampleServer(args []string) error {
	fs := flag.NewFlagSet("example-server", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8081", "listen address; session traffic on /mcp, stateless (2026-07-28) on /mcp/stateless")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level")
	stdio := fs.Bool("stdio", false, "serve one session over stdin/stdout (newline-delimited JSON-RPC) instead of HTTP; logs go to stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(*logFormat, *logLevel)
	if err != nil {
		return err
	}
	srv := exampleserver.New(&exampleserver.Options{Logger: log})
	if *stdio {
		return serveStdio(srv)
	}
	h := backend.SDKHandler(srv, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil), Logger: log})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("example MCP server listening", "url", fmt.Sprintf("http://%s/mcp", ln.Addr()))
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}

// serveStdio runs srv on stdin and stdout until stdin ends or a signal
// comes. newLogger writes to stderr, so stdout carries messages only.
func serveStdio(srv *mcp.Server) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := srv.Run(ctx, &mcp.StdioTransport{})
	if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
