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

// serveFlags are serve's flags.
type serveFlags struct {
	addr          *string
	upstream      *string
	statelessURL  *string
	upTimeout     *time.Duration
	storeKind     *string
	dataDir       *string
	syncPolicy    *string
	retainEvents  *int
	retainBytes   *int64
	grace         *time.Duration
	poll          *time.Duration
	origins       *string
	hosts         *string
	idle          *time.Duration
	maxBody       *int64
	logFormat     *string
	logLevel      *string
	accessLog     *string
	metricsAddr   *string
	shutdownGrace *time.Duration
	advertise     *string
	secretFile    *string
	leaseTTL      *time.Duration
	leasePatience *time.Duration
	maxChildren   *int
	envFile       *string
	cwd           *string
	forwardAuthz  *bool
	auth          *authFlags
	limits        *limitFlags
	envs          envList
	upHeaders     headerList
}

// newServeFlags defines serve's flags on a new FlagSet.
func newServeFlags() (*flag.FlagSet, *serveFlags) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	f := &serveFlags{
		addr:          fs.String("addr", "127.0.0.1:8080", "listen address (the endpoint is /mcp)"),
		upstream:      fs.String("upstream", "", "URL of the Streamable HTTP MCP server to front (default: the built-in example server, in process)"),
		statelessURL:  fs.String("upstream-stateless", "", "URL for stateless 2026-07-28 requests, if the upstream serves them elsewhere (default: --upstream)"),
		upTimeout:     fs.Duration("upstream-timeout", 60*time.Second, "how long a request to the upstream waits for its response to start (the answer may then stream longer); negative: no bound"),
		storeKind:     fs.String("store", "disk", "event log: disk (survives restarts, in --data-dir), memory, or redis://HOST:PORT/DB or rediss://... (shared by replicas; password in the URL or $MCPRELAY_REDIS_PASSWORD)"),
		dataDir:       fs.String("data-dir", defaultDataDir(), "directory of the disk store and the relay secret"),
		syncPolicy:    fs.String("sync", "always", "disk store fsync policy: always (durable before a client sees it), interval or none"),
		retainEvents:  fs.Int("retain-events", 10000, "events kept per session, across its streams"),
		retainBytes:   fs.Int64("retain-bytes", 8<<20, "bytes of event data kept per session"),
		grace:         fs.Duration("terminal-grace", 5*time.Minute, "how long a finished stream stays resumable"),
		poll:          fs.Duration("poll-interval", 0, "close a POST's stream or a GET without Last-Event-ID of a 2025-11-25 client after this long with retry, so it resumes by GET; resumed GETs are not closed (0: never)"),
		origins:       fs.String("allowed-origins", "", "comma-separated Origin values accepted (default: loopback and same-host origins)"),
		hosts:         fs.String("allowed-hosts", "", "comma-separated Host values accepted (default: any; loopback names only on a loopback listener)"),
		idle:          fs.Duration("session-idle-timeout", time.Hour, "expire sessions idle this long, and remove those left in the store by a relay that stopped (negative: never)"),
		maxBody:       fs.Int64("max-body-bytes", 4<<20, "largest POST body accepted"),
		logFormat:     fs.String("log-format", "text", "log format: text or json"),
		logLevel:      fs.String("log-level", "info", "log level: debug, info, warn or error"),
		accessLog:     fs.String("access-log", "debug", "one log line per /mcp request (method, JSON-RPC method, session tag, status, duration, bytes) at this level: off, debug or info"),
		metricsAddr:   fs.String("metrics-addr", "", "serve /metrics (and /healthz, /readyz) on this address of their own instead of on --addr"),
		shutdownGrace: fs.Duration("shutdown-timeout", 10*time.Second, "how long to wait for streams to close on SIGINT/SIGTERM"),
		advertise:     fs.String("advertise", "", "with --store redis://: the URL at which other replicas reach this one's MCP endpoint (default: http://ADDR/mcp from the listener)"),
		secretFile:    fs.String("secret-file", "", "with --store redis://: read the relay secret (at least 32 bytes, mode 0600) from this file instead of sharing one through Redis"),
		leaseTTL:      fs.Duration("lease-ttl", 2*time.Second, "with --store redis://: how long a session's owner lease lasts unrenewed (the longest a session waits for a new owner after a replica dies)"),
		leasePatience: fs.Duration("lease-patience", 0, "with --store redis://: how long a replica that cannot reach Redis keeps its sessions' backend sides before letting them go (0: 15 × --lease-ttl)"),
		maxChildren:   fs.Int("max-children", 0, "with -- COMMAND: the most stdio children at once (one per session); beyond it new sessions get 503 (0: 64)"),
		envFile:       fs.String("env-file", "", "with -- COMMAND: K=V lines added to the children's environment"),
		cwd:           fs.String("cwd", "", "with -- COMMAND: the children's working directory"),
		forwardAuthz:  fs.Bool("forward-authorization", false, "send the client's Authorization header to the upstream (discouraged: the upstream gets the client's token, and after a refresh still the old one; prefer --upstream-header)"),
		auth:          addAuthFlags(fs),
		limits:        addLimitFlags(fs),
	}
	fs.Var(&f.envs, "env", "with -- COMMAND: K=V added to the children's environment (repeatable; wins over --env-file)")
	fs.Var(&f.upHeaders, "upstream-header", "'Name: value' sent on every request to the upstream; the value may be $VAR (from the environment) or @file:PATH (a file's contents) to keep secrets out of the process list (repeatable)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: mcprelay serve [flags] [-- COMMAND ARGS...]\n\n"+
			"Every flag can also be set by the environment (MCPRELAY_DATA_DIR for --data-dir: dashes to underscores, upper case)\n"+
			"or by the file --config names; the command line wins over the environment, which wins over the file.\n\n")
		fs.PrintDefaults()
	}
	return fs, f
}

func serve(args []string) error {
	fs, f := newServeFlags()
	if err := parseFlags(fs, args, fromEnvAndConfig(fs, false)...); err != nil {
		return err
	}
	command := fs.Args() // after "--": a stdio server to run per session
	if len(command) > 0 && *f.upstream != "" {
		return errors.New("serve: give --upstream or -- COMMAND, not both")
	}
	if len(command) > 0 && (f.upHeaders.h != nil || *f.forwardAuthz) {
		return errors.New("serve: --upstream-header and --forward-authorization go with an HTTP upstream, not -- COMMAND")
	}
	if *f.forwardAuthz && f.upHeaders.h.Get("Authorization") != "" {
		return errors.New("serve: --forward-authorization and --upstream-header 'Authorization: ...' contradict each other")
	}
	if len(command) == 0 && (*f.maxChildren != 0 || len(f.envs) > 0 || *f.envFile != "" || *f.cwd != "") {
		return errors.New("serve: --max-children, --env, --env-file and --cwd go with -- COMMAND")
	}
	limits, err := f.limits.limits()
	if err != nil {
		return err
	}
	log, err := newLogger(*f.logFormat, *f.logLevel)
	if err != nil {
		return err
	}
	accessLevel, err := parseAccessLog(*f.accessLog)
	if err != nil {
		return err
	}

	var conn backend.Connector
	target := "the built-in example server"
	switch {
	case len(command) > 0:
		opts, err := stdioOptions(command, *f.maxChildren, f.envs, *f.envFile, *f.cwd, log.With("component", "stdio"))
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
	case *f.upstream == "":
		// The example server keeps a small event store of its own so that
		// its test_reconnection tool can close its stream mid-call (polling);
		// the relay resumes that upstream stream and carries the close to
		// the client.
		srv := exampleserver.New(&exampleserver.Options{Logger: log.With("component", "example-server")})
		up := backend.SDK(srv, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
		up.Header = f.upHeaders.h
		conn = up
	default:
		u, err := url.Parse(*f.upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("serve: --upstream must be an http(s) URL, got %q", *f.upstream)
		}
		up := backend.Remote(*f.upstream)
		up.StatelessURL = *f.statelessURL
		up.ResponseTimeout = *f.upTimeout
		up.Header = f.upHeaders.h
		conn = up
		target = *f.upstream
		go warnIfUnreachable(context.Background(), u, log)
	}
	authn, err := f.auth.setup(*f.addr, log)
	if err != nil {
		return err
	}
	store, secret, err := openStore(*f.storeKind, *f.dataDir, *f.syncPolicy, eventlog.Retention{MaxEvents: *f.retainEvents, MaxBytes: *f.retainBytes, TerminalGrace: *f.grace}, log)
	if err != nil {
		return err
	}
	defer store.Close()
	ln, err := net.Listen("tcp", *f.addr)
	if err != nil {
		return err
	}
	var cluster relay.Cluster
	if rs, ok := store.(*redisstore.Store); ok {
		self, err := advertiseURL(*f.advertise, ln.Addr())
		if err != nil {
			return err
		}
		if *f.secretFile != "" {
			if secret, err = loadSecretFile(*f.secretFile); err != nil {
				return err
			}
		}
		cluster = redisreplicas.New(rs, self)
	} else if *f.advertise != "" || *f.secretFile != "" {
		return errors.New("serve: --advertise and --secret-file go with --store redis://")
	}
	h, err := relay.New(relay.Options{
		Cluster:              cluster,
		LeaseTTL:             *f.leaseTTL,
		LeasePatience:        *f.leasePatience,
		Backend:              conn,
		Store:                store,
		Secret:               secret,
		PollInterval:         *f.poll,
		AllowedOrigins:       splitList(*f.origins),
		AllowedHosts:         splitList(*f.hosts),
		MaxBodyBytes:         *f.maxBody,
		SessionIdleTimeout:   *f.idle,
		Logger:               log,
		AccessLog:            accessLevel,
		Identity:             authn.identity,
		ForwardAuthorization: *f.forwardAuthz,
		Limits:               limits,
	})
	if err != nil {
		return err
	}
	defer h.Close()

	mux := routes(h, h, authn, *f.metricsAddr == "")
	servers := []*http.Server{newServer(mux, bodyTimeout)}
	listeners := []net.Listener{ln}
	if *f.metricsAddr != "" {
		mln, err := net.Listen("tcp", *f.metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		servers = append(servers, newServer(opsRoutes(h), bodyTimeout))
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
	case *f.storeKind == "disk":
		where = *f.dataDir
	case cluster != nil:
		where = "redis, replica " + cluster.Self()
	}
	log.Info("mcprelay listening", "url", "http://"+ln.Addr().String()+"/mcp", "upstream", target, "store", where)

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: open streams get retry and are closed")
	sctx, cancel := context.WithTimeout(context.Background(), *f.shutdownGrace)
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

// routes serves the MCP endpoint mcp (the relay h) with authn's token
// check and metadata, h's health endpoints and, with metrics, its metrics.
// CORS comes before the token check: a preflight carries no token, and a
// browser script must be able to read a 401's challenge.
func routes(h *relay.Handler, mcp http.Handler, authn *authSetup, metrics bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/mcp", h.CORS(authn.protect(mcp)))
	authn.mount(mux) // its metadata answers any origin (Access-Control-Allow-Origin: *)
	mux.Handle("/healthz", relay.Healthz())
	mux.Handle("/readyz", h.Readyz())
	if metrics {
		mux.Handle("/metrics", h.Metrics())
	}
	return mux
}

// opsRoutes serves h's metrics and health endpoints on --metrics-addr.
func opsRoutes(h *relay.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", h.OpsMetrics())
	mux.Handle("/healthz", relay.Healthz())
	mux.Handle("/readyz", h.Readyz())
	return mux
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
