package auth

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/lestrrat-go/jwx/v3/jws"
	"github.com/lestrrat-go/jwx/v3/jwt"
)

// Token is what a verified access token says.
type Token struct {
	Issuer    string
	Subject   string
	Scopes    []string
	Expiry    time.Time
	Principal string // see PrincipalFrom
}

// clock adapts Verifier.now to jwt.Clock.
type clock func() time.Time

func (c clock) Now() time.Time { return c() }

// Verify checks a compact JWS access token: its signature (by the issuer's
// key named by kid, with an allowed asymmetric algorithm), "iss", "aud",
// "exp" (required), "nbf" and "iat" (with Leeway), "sub" (required) and
// the required scopes. The error is ErrNoToken for "", or wraps
// ErrInvalidToken or ErrInsufficientScope; with the latter the token is
// returned too.
func (v *Verifier) Verify(ctx context.Context, raw string) (*Token, error) {
	if raw == "" {
		return nil, ErrNoToken
	}
	tok, err := jwt.ParseString(raw,
		jwt.WithContext(ctx),
		jwt.WithKeyProvider(jws.KeyProviderFunc(v.fetchKeys)),
		jwt.WithValidate(true),
		jwt.WithClock(clock(v.now)),
		jwt.WithAcceptableSkew(v.opts.Leeway),
		jwt.WithIssuer(v.opts.Issuer),
		jwt.WithAudience(v.opts.Audience),
		jwt.WithRequiredClaim("exp"),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	t := &Token{}
	t.Issuer, _ = tok.Issuer()
	t.Subject, _ = tok.Subject()
	t.Expiry, _ = tok.Expiration()
	if t.Subject == "" {
		return nil, fmt.Errorf("%w: no sub", ErrInvalidToken)
	}
	t.Principal = principalOf(t.Issuer, t.Subject)
	t.Scopes = scopes(tok)
	if !hasAll(t.Scopes, v.opts.Scopes) {
		return t, fmt.Errorf("%w: token has scopes %q, %q required", ErrInsufficientScope, t.Scopes, v.opts.Scopes)
	}
	return t, nil
}

// scopes reads "scope" (a space-separated string, RFC 8693 and RFC 9068)
// or, without it, "scp" (an array, or a string, as some issuers send).
func scopes(tok jwt.Token) []string {
	for _, name := range []string{"scope", "scp"} {
		var v any
		if tok.Get(name, &v) != nil {
			continue
		}
		switch v := v.(type) {
		case string:
			return strings.Fields(v)
		case []any:
			var out []string
			for _, s := range v {
				if s, ok := s.(string); ok {
					out = append(out, s)
				}
			}
			return out
		}
	}
	return nil
}
