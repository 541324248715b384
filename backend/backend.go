// Package backend provides the connectors that carry JSON-RPC messages
// between the relay and the MCP server it fronts, behind one small
// interface: a [Connector] opens a backend [Session] from the client's
// initialize request; a session's [Session.Call] returns a [Reply] with the
// messages related to the call, messages related to no call go to
// [Init.Unrelated], and a lost session is [ErrSessionLost].
//
// [Upstream] is the connector for Streamable HTTP servers, reached through
// an [http.Client]: remote ([Remote]), or an [http.Handler] in the same
// process reached without a socket ([Handler], [SDK]). An HTTP backend
// tells which client request each server message belongs to for free: each
// POST's SSE stream carries exactly that request's messages, the GET stream
// the rest. It resumes a broken POST stream from the backend's own event
// IDs, and serves stateless (2026-07-28) requests ([Stateless]).
//
//	up := backend.SDK(myServer, nil) // an official-Go-SDK *mcp.Server, both protocol eras
//	h, _ := relay.New(relay.Options{Backend: up})
//	http.Handle("/mcp", h)
package backend

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Upstream is the connector for a Streamable HTTP MCP server.
type Upstream struct {
	// URL is the server's MCP endpoint, used for session-based (legacy era)
	// traffic: initialize, POST, GET and DELETE with Mcp-Session-Id.
	URL string

	// StatelessURL receives stateless (2026-07-28) requests, which the relay
	// passes through without a session. Empty means URL: a dual-era server
	// serves both on one endpoint.
	StatelessURL string

	// Client sends the requests. Nil means a client on
	// http.DefaultTransport. It must not set a Timeout: streams are long.
	Client *http.Client

	// ResponseTimeout bounds how long a request of a session (POST, DELETE,
	// a GET that resumes a stream) waits for the backend's response
	// headers; the answer's body may then stream for as long as it needs.
	// A backend past it fails with ErrTimeout. Zero means 60s; negative
	// means no bound.
	ResponseTimeout time.Duration

	// Header is sent on every request to the server: the session's
	// (initialize, calls, GET streams, DELETE), a discarded session's
	// DELETE, and stateless requests. It carries what the server needs from
	// the relay itself, such as its own credentials for the upstream. Its
	// values replace those of the same name in Init.Header and, on
	// stateless requests, the client's. Nil sends none.
	Header http.Header

	ready readyCheck // Ready's last answer
}

// setHeader sets u.Header's values on h, replacing those of the same name.
func (u *Upstream) setHeader(h http.Header) {
	for k, vs := range u.Header {
		h[http.CanonicalHeaderKey(k)] = vs
	}
}

// ErrTimeout reports a backend that did not start its answer within
// Upstream.ResponseTimeout.
var ErrTimeout = errors.New("backend: no answer within the response timeout")

const defaultResponseTimeout = 60 * time.Second

func (u *Upstream) responseTimeout() time.Duration {
	switch {
	case u.ResponseTimeout == 0:
		return defaultResponseTimeout
	case u.ResponseTimeout < 0:
		return 0
	}
	return u.ResponseTimeout
}

// HTTPClient returns u.Client, or a default client if it is nil.
func (u *Upstream) HTTPClient() *http.Client {
	if u.Client != nil {
		return u.Client
	}
	return http.DefaultClient
}

// Stateless returns the endpoint for stateless (2026-07-28) requests.
func (u *Upstream) Stateless() string {
	if u.StatelessURL != "" {
		return u.StatelessURL
	}
	return u.URL
}

// Remote returns an upstream for the MCP server at url.
func Remote(url string) *Upstream {
	return &Upstream{URL: url}
}

// inProcessURL is the URL the in-process upstreams answer on; the host
// name is never resolved.
const inProcessURL = "http://in-process.mcprelay.invalid/mcp"

// Handler returns an upstream that serves both eras with h, in process.
func Handler(h http.Handler) *Upstream {
	return &Upstream{URL: inProcessURL, Client: &http.Client{Transport: InProcess(h)}}
}

// SDK returns an in-process upstream for an official-Go-SDK server. Session
// traffic goes to a stateful [mcp.StreamableHTTPHandler]; stateless
// (2026-07-28) requests go to a stateless one over the same server, with
// request cancellation tied to the client's connection as that revision
// requires. opts (nil for defaults) configures the stateful handler; the
// relay does its own resumption, so opts.EventStore is normally nil.
func SDK(s *mcp.Server, opts *mcp.StreamableHTTPOptions) *Upstream {
	return &Upstream{
		URL:          inProcessURL,
		StatelessURL: inProcessURL + "/stateless",
		Client:       &http.Client{Transport: InProcess(SDKHandler(s, opts))},
	}
}

// SDKHandler returns the http.Handler behind [SDK]: a stateful SDK handler
// on every path but ".../stateless", which gets a stateless one.
func SDKHandler(s *mcp.Server, opts *mcp.StreamableHTTPOptions) http.Handler {
	var o mcp.StreamableHTTPOptions
	if opts != nil {
		o = *opts
	}
	stateful := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &o)
	so := o
	so.Stateless = true
	so.EventStore = nil
	so.PropagateRequestCancellation = true
	stateless := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &so)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/stateless") {
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})
}
