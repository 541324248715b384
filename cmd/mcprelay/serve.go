package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/backend/stdio"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/relay/redisreplicas"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var (
		addr          = fs.String("addr", "127.0.0.1:8080", "listen address (the endpoint is /mcp)")
		upstream      = fs.String("upstream", "", "URL of the Streamable HTTP MCP server to front (default: the built-in example server, in process)")
		statelessURL  = fs.String("upstream-stateless", "", "URL for stateless 2026-07-28 requests, if the upstream serves them elsewhere (default: --upstream)")
		upTimeout     = fs.Duration("upstream-timeout", 60*time.Second, "how long a request to the upstream waits for its response to start (the answer may then stream longer); negative: no bound")
		storeKind     = fs.String("store", "disk", "event log: disk (survives restarts, in --data-dir), memory, or redis://HOST:PORT/DB or rediss://... (shared by replicas; password in the URL or $MCPRELAY_REDIS_PASSWORD)")
		dataDir       = fs.String("data-dir", defaultDataDir(), "directory of the disk store and the relay secret")
		syncPolicy    = fs.String("sync", "always", "disk store fsync policy: always (durable before a client sees it), interval or none")
		retainEvents  = fs.Int("retain-events", 10000, "events kept per session, across its streams")
		retainBytes   = fs.Int64("retain-bytes", 8<<20, "bytes of event data kept per session")
		grace         = fs.Duration("terminal-grace", 5*time.Minute, "how long a finished stream stays resumable")
		poll          = fs.Duration("poll-interval", 0, "close streams of 2025-11-25 clients after this long with retry, so they resume by GET (0: never)")
		origins       = fs.String("allowed-origins", "", "comma-separated Origin values accepted (default: loopback and same-host origins)")
		hosts         = fs.String("allowed-hosts", "", "comma-separated Host values accepted (default: any; loopback names only on a loopback listener)")
		idle          = fs.Duration("session-idle-timeout", time.Hour, "expire sessions idle this long (negative: never)")
		maxBody       = fs.Int64("max-body-bytes", 4<<20, "largest POST body accepted")
		logFormat     = fs.String("log-format", "text", "log format: text or json")
		logLevel      = fs.String("log-level", "info", "log level: debug, info, warn or error")
		accessLog     = fs.String("access-log", "debug", "one log line per /mcp request (method, JSON-RPC method, session tag, status, duration, bytes) at this level: off, debug or info")
		metricsAddr   = fs.String("metrics-addr", "", "serve /metrics (and /healthz, /readyz) on this address of their own instead of on --addr")
		shutdownGrace = fs.Duration("shutdown-timeout", 10*time.Second, "how long to wait for streams to close on SIGINT/SIGTERM")
		advertise     = fs.String("advertise", "", "with --store redis://: the URL at which other replicas reach this one's MCP endpoint (default: http://ADDR/mcp from the listener)")
		secretFile    = fs.String("secret-file", "", "with --store redis://: read the relay secret (at least 32 bytes, mode 0600) from this file instead of sharing one through Redis")
		leaseTTL      = fs.Duration("lease-ttl", 2*time.Second, "with --store redis://: how long a session's owner lease lasts unrenewed (the longest a session waits for a new owner after a replica dies)")
		maxChildren   = fs.Int("max-children", 0, "with -- COMMAND: the most stdio children at once (one per session); beyond it new sessions get 503 (0: 64)")
		envFile       = fs.String("env-file", "", "with -- COMMAND: K=V lines added to the children's environment")
		cwd           = fs.String("cwd", "", "with -- COMMAND: the children's working directory")
		authOpts      = addAuthFlags(fs)
		envs          envList
	)
	fs.Var(&envs, "env", "with -- COMMAND: K=V added to the children's environment (repeatable; wins over --env-file)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	command := fs.Args() // after "--": a stdio server to run per session
	if len(command) > 0 && *upstream != "" {
		return errors.New("serve: give --upstream or -- COMMAND, not both")
	}
	if len(command) == 0 && (*maxChildren != 0 || len(envs) > 0 || *envFile != "" || *cwd != "") {
		return errors.New("serve: --max-children, --env, --env-file and --cwd go with -- COMMAND")
	}
	log, err := newLogger(*logFormat, *logLevel)
	if err != nil {
		return err
	}
	accessLevel, err := parseAccessLog(*accessLog)
	if err != nil {
		return err
	}

	var conn backend.Connector
	target := "the built-in example server"
	switch {
	case len(command) > 0:
		opts, err := stdioOptions(command, *maxChildren, envs, *envFile, *cwd, log.With("component", "stdio"))
		if err != nil {
			return err
		}
		sc, err := stdio.New(opts)
		if err != nil {
			return err
		}
		defer sc.Close() // after the relay: every child is stopped
		conn = sc
		target = strings.Join(command, " ")
	case *upstream == "":
		// The example server keeps a small event store of its own so that
		// its test_reconnection tool can close its stream mid-call (polling);
		// the relay resumes that upstream stream and carries the close to
		// the client.
		srv := exampleserver.New(&exampleserver.Options{Logger: log.With("component", "example-server")})
		conn = backend.SDK(srv, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	default:
		u, err := url.Parse(*upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("serve: --upstream must be an http(s) URL, got %q", *upstream)
		}
		up := backend.Remote(*upstream)
		up.StatelessURL = *statelessURL
		up.ResponseTimeout = *upTimeout
		conn = up
		target = *upstream
	}
	authn, err := authOpts.setup(*addr, log)
	if err != nil {
		return err
	}
	store, secret, err := openStore(*storeKind, *dataDir, *syncPolicy, eventlog.Retention{MaxEvents: *retainEvents, MaxBytes: *retainBytes, TerminalGrace: *grace}, log)
	if err != nil {
		return err
	}
	defer store.Close()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	var cluster relay.Cluster
	if rs, ok := store.(*redisstore.Store); ok {
		self, err := advertiseURL(*advertise, ln.Addr())
		if err != nil {
			return err
		}
		if *secretFile != "" {
			if secret, err = loadSecretFile(*secretFile); err != nil {
				return err
			}
		}
		cluster = redisreplicas.New(rs, self)
	} else if *advertise != "" || *secretFile != "" {
		return errors.New("serve: --advertise and --secret-file go with --store redis://")
	}
	h, err := relay.New(relay.Options{
		Cluster:            cluster,
		LeaseTTL:           *leaseTTL,
		Backend:            conn,
		Store:              store,
		Secret:             secret,
		PollInterval:       *poll,
		AllowedOrigins:     splitList(*origins),
		AllowedHosts:       splitList(*hosts),
		MaxBodyBytes:       *maxBody,
		SessionIdleTimeout: *idle,
		Logger:             log,
		AccessLog:          accessLevel,
		Identity:           authn.identity,
	})
	if err != nil {
		return err
	}
	defer h.Close()

	mux := http.NewServeMux()
	mux.Handle("/mcp", authn.protect(h))
	authn.mount(mux)
	mux.Handle("/healthz", relay.Healthz())
	mux.Handle("/readyz", h.Readyz())
	servers := []*http.Server{newServer(mux, bodyTimeout)}
	listeners := []net.Listener{ln}
	if *metricsAddr == "" {
		mux.Handle("/metrics", h.Metrics())
	} else {
		mln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		ops := http.NewServeMux()
		ops.Handle("/metrics", h.OpsMetrics())
		ops.Handle("/healthz", relay.Healthz())
		ops.Handle("/readyz", h.Readyz())
		servers = append(servers, newServer(ops, bodyTimeout))
		listeners = append(listeners, mln)
		log.Info("metrics listening", "url", "http://"+mln.Addr().String()+"/metrics")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, len(servers))
	for i, srv := range servers {
		go func() { errc <- srv.Serve(listeners[i]) }()
	}
	where := "memory"
	switch {
	case *storeKind == "disk":
		where = *dataDir
	case cluster != nil:
		where = "redis, replica " + cluster.Self()
	}
	log.Info("mcprelay listening", "url", "http://"+ln.Addr().String()+"/mcp", "upstream", target, "store", where)
	h.Ready(ctx) // logs why, if not (an upstream that cannot be reached)

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: open streams get retry and are closed")
	sctx, cancel := context.WithTimeout(context.Background(), *shutdownGrace)
	defer cancel()
	h.Shutdown(sctx)
	for _, srv := range servers {
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("shutdown", "err", err)
		}
	}
	return nil
}

// parseAccessLog reads --access-log: off (nil), debug or info.
func parseAccessLog(v string) (slog.Leveler, error) {
	switch v {
	case "off":
		return nil, nil
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	}
	return nil, fmt.Errorf("--access-log must be off, debug or info, got %q", v)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	o := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, o)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, got %q", format)
}

// advertiseURL is --advertise, or the MCP endpoint's URL on the listener's
// address when it names a host other replicas can reach.
func advertiseURL(flagValue string, addr net.Addr) (string, error) {
	if flagValue != "" {
		u, err := url.Parse(flagValue)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", fmt.Errorf("serve: --advertise must be an http(s) URL, got %q", flagValue)
		}
		return flagValue, nil
	}
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || tcp.IP.IsUnspecified() {
		return "", fmt.Errorf("serve: listening on %s: give --advertise, the URL other replicas reach this one at", addr)
	}
	return "http://" + tcp.String() + "/mcp", nil
}
