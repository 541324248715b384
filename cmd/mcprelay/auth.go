package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/mcprelay/mcprelay/auth"
)

// authFlags are serve's flags for OAuth and session identity.
type authFlags struct {
	issuer, audience, jwks, scopes, identityHeader *string
	fs                                             *flag.FlagSet
}

func addAuthFlags(fs *flag.FlagSet) *authFlags {
	return &authFlags{
		fs:             fs,
		issuer:         fs.String("auth-issuer", "", "OAuth issuer URL: when set, /mcp requires a bearer access token (a JWT) from it, and sessions are bound to the token's subject"),
		audience:       fs.String("auth-audience", "", "this resource's identifier, required in the tokens' aud (default: http://<addr>/mcp)"),
		jwks:           fs.String("auth-jwks", "", "URL of the issuer's JWKS (default: discovered from the issuer's metadata)"),
		scopes:         fs.String("auth-scopes", "", "comma-separated scopes every token must carry"),
		identityHeader: fs.String("identity-header", "Authorization", "without --auth-issuer: the request header whose value (hashed) a session is bound to"),
	}
}

// authSetup is what the flags make of the relay's endpoint.
type authSetup struct {
	// identity is relay.Options.Identity (nil: the relay's default).
	identity func(*http.Request) string
	verifier *auth.Verifier // nil when auth is off
	metadata []string       // paths of the metadata document
}

// setup checks the flags and, with --auth-issuer, builds the verifier
// (fetching the issuer's metadata and keys). addr is --addr.
func (f *authFlags) setup(addr string, log *slog.Logger) (*authSetup, error) {
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if *f.issuer == "" {
		for _, name := range []string{"auth-audience", "auth-jwks", "auth-scopes"} {
			if set[name] {
				return nil, fmt.Errorf("serve: --%s needs --auth-issuer", name)
			}
		}
		return &authSetup{identity: headerIdentity(*f.identityHeader)}, nil
	}
	if set["identity-header"] {
		return nil, fmt.Errorf("serve: --identity-header does not apply with --auth-issuer (sessions are bound to the token's issuer and subject)")
	}
	aud := *f.audience
	if aud == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil || host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
			return nil, fmt.Errorf("serve: --auth-audience is required when --addr %q names no host", addr)
		}
		aud = "http://" + addr + "/mcp"
	}
	u, err := url.Parse(aud)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("serve: --auth-audience must be the endpoint's http(s) URL, got %q", aud)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := auth.New(ctx, auth.Options{
		Issuer:   *f.issuer,
		Audience: aud,
		JWKSURL:  *f.jwks,
		Scopes:   splitList(*f.scopes),
		Logger:   log.With("component", "auth"),
	})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	paths := []string{auth.MetadataPath, auth.MetadataPath + "/mcp"}
	if p := strings.TrimSuffix(u.EscapedPath(), "/"); p != "" && p != "/mcp" {
		paths = append(paths, auth.MetadataPath+p)
	}
	return &authSetup{identity: auth.Identity, verifier: v, metadata: paths}, nil
}

// protect wraps the endpoint in the token check when auth is on.
func (a *authSetup) protect(h http.Handler) http.Handler {
	if a.verifier == nil {
		return h
	}
	return a.verifier.Middleware(h)
}

// mount serves the protected-resource metadata when auth is on.
func (a *authSetup) mount(mux *http.ServeMux) {
	if a.verifier == nil {
		return
	}
	for _, p := range a.metadata {
		mux.Handle(p, a.verifier.MetadataHandler())
	}
}

// headerIdentity binds sessions to a hash of header's value. Authorization
// is the relay's own default (nil).
func headerIdentity(header string) func(*http.Request) string {
	if header == "" || http.CanonicalHeaderKey(header) == "Authorization" {
		return nil
	}
	return func(r *http.Request) string {
		v := r.Header.Get(header)
		if v == "" {
			return ""
		}
		sum := sha256.Sum256([]byte(v))
		return hex.EncodeToString(sum[:16])
	}
}
