// Package relay provides mcprelay's front end: an [http.Handler] that
// serves the MCP Streamable HTTP transport in front of any MCP server, with
// sessions and stream cursors scoped to their session and generation, and a
// resume decision that always answers replay, explicit reset, or clear
// rejection (the contract is in docs/design.md).
//
//	h, err := relay.New(relay.Options{Backend: backend.SDK(server, nil)})
//	if err != nil { ... }
//	defer h.Close()
//	http.Handle("/mcp", h)
//
// The relay owns everything the client sees: session IDs, streams, event
// IDs, the event log, the resume decision, polling (retry), Origin checks
// and limits. The backend connector (package backend) only moves JSON-RPC
// messages and says which call each belongs to.
package relay

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/resume"
)

// Options configures a [Handler]. The zero value of every field but
// Backend works.
type Options struct {
	// Backend connects to the MCP server behind the relay: an HTTP server
	// (backend.Remote), an official-Go-SDK server in process (backend.SDK),
	// a stdio program. Required.
	Backend backend.Connector

	// Store holds sessions and the event log. Nil means an in-memory store
	// with default retention (eventlog.NewMemory).
	Store eventlog.Store

	// Secret keys the MAC carried by every event ID. It must be at least 32
	// bytes and shared by all replicas. Nil means a random secret for this
	// process only: event IDs then do not survive a restart (a resume after
	// one is rejected as forged, never misattributed).
	Secret []byte

	// PollInterval, when positive, makes the relay close a connection
	// that opens a stream (a POST's response, a GET without
	// Last-Event-ID) of a client at protocol 2025-11-25 or later after
	// this long, sending "retry" first, so the client resumes by GET. A
	// connection that resumes (Last-Event-ID) is never closed for polling:
	// a client that resumes once gets the rest. A stdio server, which
	// cannot close an HTTP stream, is polled this way (SEP-1699). Zero
	// never closes early (the relay still relays an upstream's own
	// server-initiated close).
	PollInterval time.Duration

	// AllowedOrigins lists the Origin header values accepted (exact match,
	// e.g. "https://app.example.com"). Requests without Origin are always
	// accepted. Empty means: loopback origins, and the origin of the host
	// the request was sent to.
	AllowedOrigins []string

	// AllowedHosts lists Host header values accepted (host or host:port).
	// Empty means any host, except that a request arriving on a loopback
	// address must name a loopback host (DNS-rebinding protection).
	AllowedHosts []string

	// MaxBodyBytes bounds a POST body. Zero means 4 MiB.
	MaxBodyBytes int64

	// SessionIdleTimeout expires a session that has seen no request and has
	// no open stream for this long. Zero means one hour; negative never.
	SessionIdleTimeout time.Duration

	// Logger receives the relay's logs. Nil discards them.
	Logger *slog.Logger

	// AccessLog, when set, makes the relay log one line per request to the
	// MCP endpoint through Logger at this level ("request": HTTP method,
	// JSON-RPC methods, a short tag of the session ID, status, duration,
	// bytes). A streamed answer is logged when its stream ends. Nil: no
	// access log.
	AccessLog slog.Leveler

	// Cluster, when set, makes this relay one replica of several that
	// share Store (which must then be shared, for example Redis) and
	// Secret: any replica answers any request for any session. The
	// replica that owns a session's backend side holds its lease; POSTs
	// and DELETEs reaching another replica are forwarded to the owner,
	// GETs are served by whichever replica receives them, from the log.
	// Nil: one process owns every session.
	Cluster Cluster

	// LeaseTTL is how long a session's lease lasts without renewal: the
	// longest a session waits for a new owner after its owner dies. Zero
	// means 2s. Used with Cluster.
	LeaseTTL time.Duration

	// LeasePatience is how long a replica keeps a session whose lease it
	// cannot renew (the store out of reach, not another replica holding
	// it): its backend side and calls in flight carry on, and its requests
	// get 503, so that a short outage of the store costs nothing. Past it
	// the replica lets the session go as if it had been taken over: its
	// backend side stops (a replica cut off from the store must not keep
	// running tools for sessions another replica may have re-created),
	// and the next request restores it once the store is back. Zero means
	// 15 × LeaseTTL.
	LeasePatience time.Duration

	// Identity returns the principal a session is bound to: a request whose
	// identity differs from the one that created the session gets 404 for
	// it. Nil means a hash of the Authorization header ("" when there is
	// none), so that a client whose token changes loses its sessions; set it
	// (for example from an authenticating middleware's verified subject) so
	// that a refreshed token keeps them. It must be cheap and deterministic.
	Identity func(*http.Request) string

	// ForwardAuthorization sends the client's Authorization header to the
	// backend: on every request of a session, the header of the request
	// that created the session (or restored it after a restart or on
	// another replica); on a stateless request, its own. Discouraged: a
	// token issued for the relay is then replayed to another service (the
	// MCP authorization specification forbids token passthrough), and a
	// client that refreshes its token keeps sending the old one upstream.
	// False (the default): the backend never sees the client's
	// Authorization; give it credentials of its own with
	// backend.Upstream.Header.
	ForwardAuthorization bool

	// Limits bounds session creation: sessions in all and per principal, a
	// creation rate per principal, the store's size. The zero value sets no
	// bound.
	Limits Limits
}

// Handler is the relay's http.Handler. Create it with [New]; it is safe for
// concurrent use. Close releases its goroutines.
type Handler struct {
	opts Options
	conn backend.Connector
	// With a Cluster: the lease TTL, the key of forwarded-request MACs,
	// the client that forwards, and the lease keeper's end.
	cluster    Cluster
	leaseTTL   time.Duration
	fwdKey     []byte
	peers      *http.Client
	keeperDone chan struct{}
	store      eventlog.Store
	limits     *sessionLimits
	codec      *resume.Codec
	log        *slog.Logger
	ctx        context.Context // cancelled by Close: ends pumps
	cancel     context.CancelFunc

	// With a Cluster: see Options.LeasePatience; failed renewals since the
	// lease keeper's last report.
	leasePatience time.Duration
	renewFails    renewFailures
	// callCtx are children of ctx that calls' contexts derive from, taken
	// in turn (callSeq), so that concurrent calls do not all register
	// with, and lock, one parent context.
	callCtx    [16]context.Context
	callCancel [16]context.CancelFunc
	callSeq    atomic.Uint32

	mu       sync.RWMutex
	sessions map[string]*session
	streams  streamIndex // live (non-terminal) streams by key, for wake-ups and takeover (locks of its own)
	// restoring has a channel per session being restored from the store,
	// closed when done.
	restoring map[string]chan struct{}

	shutdown     chan struct{} // closed by Shutdown: open streams get retry and end
	shutdownOnce sync.Once
	janitorDone  chan struct{}
	closing      sync.WaitGroup // backend sessions being closed by dropLocal; Close waits
	closed       bool           // Close waits for closing (guarded by mu)

	metrics  *metrics
	notReady atomic.Bool // the last readiness check failed

	// Sessions whose creation failed, to be removed from the store
	// (unmade.go), and whether removeUnmade runs.
	unmadeMu   sync.Mutex
	unmade     []string
	unmaking   bool
	unmadeLost int // forgotten past maxUnmade since the store last answered
}

const (
	headerSessionID       = "Mcp-Session-Id"
	headerProtocolVersion = "Mcp-Protocol-Version"
	headerLastEventID     = "Last-Event-ID"
)

// Protocol revisions.
const (
	version20250326 = "2025-03-26"
	version20250618 = "2025-06-18"
	version20251125 = "2025-11-25"
	version20260728 = "2026-07-28"
)

var legacyVersions = []string{version20250326, version20250618, version20251125}

// Log attribute keys.
const (
	logSession = "session"
	logStream  = "stream"
	logCursor  = "cursor"
	logRow     = "row"
	logReason  = "reason"
	logStatus  = "status"
)

// New returns a relay handler.
func New(opts Options) (*Handler, error) {
	if opts.Backend == nil {
		return nil, errors.New("relay: Options.Backend is required")
	}
	secret := opts.Secret
	if secret == nil {
		secret = make([]byte, 32)
		rand.Read(secret)
	}
	codec, err := resume.NewCodec(secret)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 4 << 20
	}
	if opts.SessionIdleTimeout == 0 {
		opts.SessionIdleTimeout = time.Hour
	}
	store := opts.Store
	if store == nil {
		store = eventlog.NewMemory(eventlog.Retention{})
	}
	limits, err := newSessionLimits(opts.Limits, store)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Handler{
		opts:        opts,
		conn:        opts.Backend,
		store:       store,
		limits:      limits,
		codec:       codec,
		log:         log,
		ctx:         ctx,
		cancel:      cancel,
		sessions:    make(map[string]*session),
		restoring:   make(map[string]chan struct{}),
		shutdown:    make(chan struct{}),
		janitorDone: make(chan struct{}),
	}
	for i := range h.callCtx {
		h.callCtx[i], h.callCancel[i] = context.WithCancel(ctx)
	}
	h.metrics = newMetrics(h)
	if opts.Cluster != nil {
		h.cluster = opts.Cluster
		h.leaseTTL = opts.LeaseTTL
		if h.leaseTTL <= 0 {
			h.leaseTTL = defaultLeaseTTL
		}
		if h.leaseTTL <= 2*leaseMargin {
			return nil, fmt.Errorf("relay: LeaseTTL %v is too short (at least %v)", h.leaseTTL, 2*leaseMargin)
		}
		h.leasePatience = opts.LeasePatience
		if h.leasePatience <= 0 {
			h.leasePatience = 15 * h.leaseTTL
		}
		if h.leasePatience < h.leaseTTL {
			return nil, fmt.Errorf("relay: LeasePatience %v is shorter than LeaseTTL %v", h.leasePatience, h.leaseTTL)
		}
		if opts.Secret == nil {
			return nil, errors.New("relay: a Cluster needs the Secret all replicas share")
		}
		h.fwdKey = forwardKey(secret)
		h.peers = &http.Client{}
		h.keeperDone = make(chan struct{})
		go h.leaseKeeper()
	}
	go h.janitor()
	return h, nil
}

// Shutdown asks every open stream to end: each gets a "retry" field and is
// closed, so that its client resumes (here after a restart, or on another
// replica). It returns when it has signalled them; pair it with
// http.Server.Shutdown, which waits for the handlers to return.
//
// With a Cluster it then drains: calls in flight get until ctx is done to
// finish, and every session lease this replica holds is released so that
// the next request for the session re-homes it on another replica at once.
func (h *Handler) Shutdown(ctx context.Context) error {
	first := false
	h.shutdownOnce.Do(func() { close(h.shutdown); first = true })
	if first && h.cluster != nil {
		h.releaseAll(ctx)
	}
	return nil
}

// callContext returns a context for one call's backend request and pump,
// cancelled by Close, and its cancel function.
func (h *Handler) callContext() (context.Context, context.CancelFunc) {
	return context.WithCancel(h.callCtx[h.callSeq.Add(1)%uint32(len(h.callCtx))])
}

// Close ends streams (as Shutdown does) and stops the relay's background
// work and backend calls, and closes the backend sessions it holds: their
// GET streams end. Without a Cluster the sessions themselves stay in the
// store (a later relay on it re-creates their backend side), and Close
// does not wait for their backend sessions' DELETEs. It does not close the
// Store or the backend connector.
func (h *Handler) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no draining
	h.Shutdown(ctx)
	h.cancel()
	for _, c := range h.callCancel {
		c()
	}
	<-h.janitorDone
	if h.keeperDone != nil {
		<-h.keeperDone
	}
	// Backend sessions given up by this replica are closed before Close
	// returns, so that nothing of theirs (a GET stream, a liveness ping
	// under the client's credentials) reaches the backend after it; a
	// backend that does not answer is waited for a few seconds at most.
	if h.cluster == nil {
		// Without replicas the sessions stay in the store for the next
		// process, which re-creates their backend side; what this one
		// opened on the backend ends with it, as at its exit. Their GET
		// streams stop at once; Close does not wait for the DELETEs (a
		// backend may hold one until a call that ignores its cancellation
		// ends, and this process's sessions are not the next one's).
		h.mu.RLock()
		live := slices.Collect(maps.Values(h.sessions))
		h.mu.RUnlock()
		for _, s := range live {
			if _, bs := s.current(); bs != nil {
				go bs.Close()
			}
		}
	}
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	done := make(chan struct{})
	go func() { h.closing.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(closeWait):
	}
	return nil
}

// closeWait bounds how long Close waits for backend sessions to close.
const closeWait = 5 * time.Second

// ServeHTTP serves the MCP endpoint: POST, GET and DELETE.
func (h *Handler) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	w := &exchange{ResponseWriter: rw}
	defer h.finish(w, r, time.Now())
	if r.Header.Get(headerForwarded) != "" {
		// From another replica (its client's Origin and Host were checked
		// there), or from a client posing as one.
		body, ok := h.readBody(w, r)
		if !ok {
			return
		}
		if _, err := h.checkForwarded(r, body); err != nil {
			h.log.Warn("refused a request posing as a replica", "remote", r.RemoteAddr, "err", err)
			httpError(w, http.StatusForbidden, "Forbidden: "+err.Error())
			return
		}
		r = withForwarded(r)
		r.Body = io.NopCloser(bytes.NewReader(body))
	} else if status, msg := h.checkOrigin(r); status != 0 {
		http.Error(w, msg, status)
		return
	}
	switch r.Method {
	case http.MethodPost:
		h.servePOST(w, r)
	case http.MethodGet:
		h.serveGET(w, r)
	case http.MethodDelete:
		h.serveDELETE(w, r)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

// checkOrigin enforces the Host and Origin rules (DNS-rebinding
// protection): 403 when either is not allowed.
func (h *Handler) checkOrigin(r *http.Request) (int, string) {
	if len(h.opts.AllowedHosts) > 0 {
		if !hostAllowed(r.Host, h.opts.AllowedHosts) {
			return http.StatusForbidden, fmt.Sprintf("Forbidden: Host %q is not allowed", r.Host)
		}
	} else if status, msg := checkLoopbackHost(r); status != 0 {
		return status, msg
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return 0, ""
	}
	if len(h.opts.AllowedOrigins) > 0 {
		if slices.Contains(h.opts.AllowedOrigins, origin) {
			return 0, ""
		}
		return http.StatusForbidden, fmt.Sprintf("Forbidden: Origin %q is not allowed", origin)
	}
	u, err := url.Parse(origin)
	if err == nil && u.Host != "" && (isLoopbackHost(u.Host) || strings.EqualFold(u.Host, r.Host)) {
		return 0, ""
	}
	return http.StatusForbidden, fmt.Sprintf("Forbidden: Origin %q is not allowed", origin)
}

// checkLoopbackHost refuses (403) a request that arrived on a loopback
// address naming a host that is not loopback: a page reached through DNS
// rebinding.
func checkLoopbackHost(r *http.Request) (int, string) {
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && la != nil {
		loopback := false
		if ta, ok := la.(*net.TCPAddr); ok {
			loopback = ta.IP.IsLoopback()
		} else {
			loopback = isLoopbackAddr(la.String())
		}
		if loopback && !isLoopbackHost(r.Host) {
			return http.StatusForbidden, fmt.Sprintf("Forbidden: Host %q is not a loopback name", r.Host)
		}
	}
	return 0, ""
}

func hostAllowed(host string, allowed []string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	for _, a := range allowed {
		if strings.EqualFold(a, host) || strings.EqualFold(a, name) {
			return true
		}
	}
	return false
}

func isLoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// principal returns the identity a session is bound to: Options.Identity's
// answer, or by default principal(r).
func (h *Handler) principal(r *http.Request) string {
	if h.opts.Identity != nil {
		return h.opts.Identity(r)
	}
	return principal(r)
}

// principal returns the identity a session is bound to: a hash of the
// Authorization header ("" when there is none).
func principal(r *http.Request) string {
	a := r.Header.Get("Authorization")
	if a == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(a))
	return hex.EncodeToString(sum[:16])
}

// newSessionID mints a session ID: 128 random bits, base64url (visible ASCII).
func newSessionID() string {
	var b [16]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// httpError writes a plain-text error.
func httpError(w http.ResponseWriter, status int, msg string) {
	http.Error(w, msg, status)
}

// readBody reads a POST body within the configured limit.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if n := r.ContentLength; n > 0 && n <= h.opts.MaxBodyBytes {
		// The length is known: one buffer of that size (net/http's body
		// ends there).
		body := make([]byte, n)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			httpError(w, http.StatusBadRequest, "reading body: "+err.Error())
			return nil, false
		}
		return body, true
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", mbe.Limit))
		} else {
			httpError(w, http.StatusBadRequest, "reading body: "+err.Error())
		}
		return nil, false
	}
	return body, true
}

// acceptsBoth reports whether Accept lists application/json and
// text/event-stream (wildcards count).
func accepts(r *http.Request) (jsonOK, sseOK bool) {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			mt, _, _ := strings.Cut(part, ";")
			mt = strings.TrimSpace(mt)
			switch {
			case strings.EqualFold(mt, "application/json"), strings.EqualFold(mt, "application/*"):
				jsonOK = true
			case strings.EqualFold(mt, "text/event-stream"), strings.EqualFold(mt, "text/*"):
				sseOK = true
			case mt == "*/*":
				jsonOK, sseOK = true, true
			}
		}
	}
	return
}

// clip bounds a client-supplied value in a log line (a 1 MB header must not
// make a 1 MB line).
func clip(v string) string {
	const max = 64
	if len(v) <= max {
		return v
	}
	return fmt.Sprintf("%s…(%d bytes)", v[:max], len(v))
}
