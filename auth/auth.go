// Package auth makes mcprelay an OAuth 2.1 resource server, as the MCP
// authorization specification asks of a protected MCP server: it verifies
// the bearer access tokens (JWTs) an authorization server issued for this
// resource, answers 401/403 with the WWW-Authenticate challenges MCP clients
// follow, serves RFC 9728 protected-resource metadata, and tells the relay
// who the caller is, so that a session is bound to its (issuer, subject) and
// survives a token refresh.
//
//	v, err := auth.New(ctx, auth.Options{
//		Issuer:   "https://auth.example.com",
//		Audience: "https://mcp.example.com/mcp",
//	})
//	if err != nil { ... }
//	h, err := relay.New(relay.Options{Upstream: up, Identity: auth.Identity})
//	mux.Handle("/mcp", v.Middleware(h))
//	mux.Handle(auth.MetadataPath, v.MetadataHandler())
//	mux.Handle(auth.MetadataPath+"/mcp", v.MetadataHandler())
//
// Signatures are checked by github.com/lestrrat-go/jwx/v3; this package
// chooses the key (from the issuer's JWKS, by kid) and the algorithm (an
// asymmetric allow-list), and checks the claims.
package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// Errors. A verification error wraps ErrInvalidToken or
// ErrInsufficientScope (and says why); New's errors wrap ErrConfig or
// ErrDiscovery.
var (
	ErrNoToken           = errors.New("auth: no bearer token")
	ErrInvalidToken      = errors.New("auth: invalid token")
	ErrInsufficientScope = errors.New("auth: insufficient scope")
	ErrConfig            = errors.New("auth: bad options")
	ErrDiscovery         = errors.New("auth: discovering the issuer's keys")
)

// MetadataPath is where RFC 9728 puts protected-resource metadata. A
// resource with a path (https://host/mcp) has it at MetadataPath followed by
// that path (https://host/.well-known/oauth-protected-resource/mcp).
const MetadataPath = "/.well-known/oauth-protected-resource"

// Defaults of Options.
const (
	DefaultLeeway          = 30 * time.Second
	DefaultRefreshInterval = 10 * time.Second
	DefaultKeysMaxAge      = 15 * time.Minute
)

// Options configures a [Verifier]. Issuer and Audience are required; the
// zero value of every other field works.
type Options struct {
	// Issuer is the authorization server's issuer identifier (a URL), as
	// it appears in the tokens' "iss" claim: compared exactly.
	Issuer string

	// Audience is this resource's identifier (RFC 8707), normally the
	// public URL of the MCP endpoint, e.g. "https://mcp.example.com/mcp".
	// A token is accepted only if its "aud" (a string or an array)
	// contains it. It is also the "resource" of the metadata document.
	Audience string

	// JWKSURL is where the issuer publishes its signing keys. Empty means
	// discovered from the issuer's metadata: RFC 8414
	// /.well-known/oauth-authorization-server, then OpenID Connect
	// /.well-known/openid-configuration (with the issuer's path inserted
	// after, then appended to the host, as the MCP specification orders
	// them). The issuer and the JWKS must be https, except on a loopback
	// host.
	JWKSURL string

	// Scopes lists the scopes every token must carry (in "scope", a
	// space-separated string, or "scp", an array). Empty requires none.
	// They are also announced in challenges and in scopes_supported.
	Scopes []string

	// Leeway is the clock skew allowed on "exp", "nbf" and "iat". Zero
	// means DefaultLeeway (30 s); negative means none.
	Leeway time.Duration

	// RefreshInterval is the least time between two fetches of the JWKS
	// caused by tokens (an unknown kid, or keys older than KeysMaxAge), so
	// that a flood of tokens with made-up kids cannot hammer the issuer.
	// Zero means DefaultRefreshInterval (10 s).
	RefreshInterval time.Duration

	// KeysMaxAge is how long fetched keys are used before they are fetched
	// again (so that a key the issuer withdrew stops being accepted). If
	// the fetch fails the old keys are kept. Zero means DefaultKeysMaxAge
	// (15 min).
	KeysMaxAge time.Duration

	// ResourceMetadataURL is the URL of this resource's RFC 9728 metadata,
	// sent in every challenge. Empty means derived from Audience (which
	// must then be an http(s) URL): scheme://host + MetadataPath + path.
	ResourceMetadataURL string

	// HTTPClient fetches the issuer's metadata and keys. Nil means a client
	// with a 10 s timeout.
	HTTPClient *http.Client

	// Logger receives the verifier's logs. Nil discards them.
	Logger *slog.Logger
}

// Verifier verifies access tokens for one resource. Create it with [New]; it
// is safe for concurrent use.
type Verifier struct {
	opts     Options
	client   *http.Client
	log      *slog.Logger
	jwksURL  string
	metadata string // ResourceMetadataURL
	now      func() time.Time

	fetchMu sync.Mutex // serializes JWKS fetches
	mu      sync.Mutex // guards the fields below
	keys    keySet
	fetched time.Time // when keys were fetched
	tried   time.Time // when a fetch was last attempted
	fetches int       // fetches attempted, for tests
}

// New checks opts, discovers the JWKS URL if needed, and fetches the keys
// once, so that a misconfiguration shows at start.
func New(ctx context.Context, opts Options) (*Verifier, error) {
	if opts.Issuer == "" {
		return nil, fmt.Errorf("%w: Issuer is required", ErrConfig)
	}
	if err := checkFetchURL(opts.Issuer); err != nil {
		return nil, fmt.Errorf("%w: Issuer: %v", ErrConfig, err)
	}
	if opts.Audience == "" {
		return nil, fmt.Errorf("%w: Audience is required", ErrConfig)
	}
	for _, s := range opts.Scopes {
		if s == "" || strings.ContainsAny(s, " \"\\") {
			return nil, fmt.Errorf("%w: scope %q", ErrConfig, s)
		}
	}
	switch {
	case opts.Leeway == 0:
		opts.Leeway = DefaultLeeway
	case opts.Leeway < 0:
		opts.Leeway = 0
	}
	if opts.RefreshInterval <= 0 {
		opts.RefreshInterval = DefaultRefreshInterval
	}
	if opts.KeysMaxAge <= 0 {
		opts.KeysMaxAge = DefaultKeysMaxAge
	}
	v := &Verifier{opts: opts, client: opts.HTTPClient, log: opts.Logger, now: time.Now}
	if v.client == nil {
		v.client = &http.Client{Timeout: 10 * time.Second}
	}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	v.metadata = opts.ResourceMetadataURL
	if v.metadata == "" {
		m, err := metadataURL(opts.Audience)
		if err != nil {
			return nil, fmt.Errorf("%w: ResourceMetadataURL is required when Audience is not an http(s) URL: %v", ErrConfig, err)
		}
		v.metadata = m
	}
	v.jwksURL = opts.JWKSURL
	if v.jwksURL == "" {
		u, err := discover(ctx, v.client, opts.Issuer)
		if err != nil {
			return nil, err
		}
		v.jwksURL = u
	}
	if err := checkFetchURL(v.jwksURL); err != nil {
		return nil, fmt.Errorf("%w: JWKS URL: %v", ErrConfig, err)
	}
	if err := v.refresh(ctx); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDiscovery, err)
	}
	v.log.Info("verifying access tokens", "issuer", opts.Issuer, "audience", opts.Audience, "jwks", v.jwksURL)
	return v, nil
}

// ResourceMetadataURL returns the URL of the metadata document that
// challenges point to.
func (v *Verifier) ResourceMetadataURL() string { return v.metadata }

// metadataURL derives the RFC 9728 metadata URL of a resource identifier.
func metadataURL(resource string) (string, error) {
	u, err := url.Parse(resource)
	if err != nil {
		return "", err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%q is not an http(s) URL", resource)
	}
	p := strings.TrimSuffix(u.EscapedPath(), "/")
	return u.Scheme + "://" + u.Host + MetadataPath + p, nil
}

// checkFetchURL accepts https URLs, and http ones on a loopback host.
func checkFetchURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	switch {
	case u.Host == "":
		return fmt.Errorf("%q has no host", s)
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && isLoopback(u.Hostname()):
		return nil
	}
	return fmt.Errorf("%q must be https (http only on a loopback host)", s)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

type principalKey struct{}

// PrincipalFrom returns the principal that [Verifier.Middleware] put in a
// request's context: a stable string derived from the token's issuer and
// subject (the same for every token of that subject, refreshed or not). ok
// is false when the request was not authenticated.
func PrincipalFrom(ctx context.Context) (principal string, ok bool) {
	p, ok := ctx.Value(principalKey{}).(string)
	return p, ok
}

// Identity is PrincipalFrom for a request ("" when unauthenticated), in the
// shape of relay.Options.Identity.
func Identity(r *http.Request) string {
	p, _ := PrincipalFrom(r.Context())
	return p
}

// principalOf hashes issuer and subject into a principal.
func principalOf(iss, sub string) string {
	h := sha256.New()
	h.Write([]byte(iss))
	h.Write([]byte{0})
	h.Write([]byte(sub))
	return "oauth:" + hex.EncodeToString(h.Sum(nil)[:16])
}

// hasAll reports whether have contains every scope of want.
func hasAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
