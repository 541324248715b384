package auth

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
)

// Middleware lets through requests that carry a valid access token in
// "Authorization: Bearer ...", with the principal in their context (see
// PrincipalFrom). Others get a challenge (RFC 6750 section 3, RFC 9728
// section 5.1):
//
//   - no bearer token: 401, WWW-Authenticate: Bearer resource_metadata="..."
//     (and scope="..." when Options.Scopes is set);
//   - a bad, expired or foreign token: 401, with error="invalid_token";
//   - a valid token without the required scopes: 403, with
//     error="insufficient_scope" and scope="...".
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, err := bearer(r)
		var tok *Token
		if err == nil {
			tok, err = v.Verify(r.Context(), raw)
		}
		if err != nil {
			v.challenge(w, r, err)
			return
		}
		ctx := context.WithValue(r.Context(), principalKey{}, tok.Principal)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// bearer extracts the token of "Authorization: Bearer <token>". Another
// scheme, or no header, is ErrNoToken; more than one header, or an empty
// token, is ErrInvalidToken.
func bearer(r *http.Request) (string, error) {
	vals := r.Header.Values("Authorization")
	switch len(vals) {
	case 0:
		return "", ErrNoToken
	case 1:
	default:
		return "", ErrInvalidToken
	}
	scheme, tok, _ := strings.Cut(vals[0], " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", ErrNoToken
	}
	if tok = strings.TrimSpace(tok); tok == "" {
		return "", ErrInvalidToken
	}
	return tok, nil
}

// challenge answers a request that failed authentication.
func (v *Verifier) challenge(w http.ResponseWriter, r *http.Request, err error) {
	scope := strings.Join(v.opts.Scopes, " ")
	meta := `resource_metadata="` + v.metadata + `"`
	var status int
	var h string
	switch {
	case errors.Is(err, ErrInsufficientScope):
		status, h = http.StatusForbidden, `Bearer error="insufficient_scope", scope="`+scope+`", `+meta
	case errors.Is(err, ErrNoToken):
		status, h = http.StatusUnauthorized, `Bearer `+meta
		if scope != "" {
			h += `, scope="` + scope + `"`
		}
	default:
		status, h = http.StatusUnauthorized, `Bearer error="invalid_token", `+meta
		if scope != "" {
			h += `, scope="` + scope + `"`
		}
	}
	level := slog.LevelInfo
	if errors.Is(err, ErrNoToken) {
		level = slog.LevelDebug // every client's first request
	}
	v.log.Log(r.Context(), level, "request refused", "status", status, "err", err)
	w.Header().Set("WWW-Authenticate", h)
	http.Error(w, http.StatusText(status), status)
}

// Metadata is an RFC 9728 protected-resource metadata document.
type Metadata struct {
	Resource               string   `json:"resource"`
	AuthorizationServers   []string `json:"authorization_servers"`
	ScopesSupported        []string `json:"scopes_supported,omitempty"`
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
}

// Metadata returns this resource's protected-resource metadata.
func (v *Verifier) Metadata() Metadata {
	return Metadata{
		Resource:               v.opts.Audience,
		AuthorizationServers:   []string{v.opts.Issuer},
		ScopesSupported:        v.opts.Scopes,
		BearerMethodsSupported: []string{"header"},
	}
}

// MetadataHandler serves the protected-resource metadata document to GET
// (and HEAD), whatever the path: mount it at MetadataPath and at
// MetadataPath followed by the endpoint's path. It is public, so it allows
// any origin.
func (v *Verifier) MetadataHandler() http.Handler {
	body, _ := json.Marshal(v.Metadata())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Access-Control-Allow-Origin", "*")
		w.Header().Set("Cache-Control", "max-age=3600")
		w.Write(body)
	})
}
