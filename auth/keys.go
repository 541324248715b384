package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/lestrrat-go/jwx/v3/jws"
)

// maxDocBytes bounds a metadata document or a JWKS.
const maxDocBytes = 1 << 20

// allowedAlgs are the signature algorithms accepted: asymmetric only, so
// that a public key can never be used as an HMAC secret, and never "none".
var allowedAlgs = map[string]bool{
	"RS256": true, "RS384": true, "RS512": true,
	"PS256": true, "PS384": true, "PS512": true,
	"ES256": true, "ES384": true, "ES512": true,
	"EdDSA": true, "Ed25519": true,
}

// keySet is the issuer's keys as last fetched.
type keySet = jwk.Set

// discover finds the issuer's jwks_uri in its RFC 8414 or OpenID Connect
// metadata, trying the locations in the order the MCP specification gives.
// A document whose "issuer" is not exactly the issuer is ignored (RFC 8414
// section 3.3).
func discover(ctx context.Context, client *http.Client, issuer string) (string, error) {
	u, err := url.Parse(issuer)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrDiscovery, err)
	}
	origin := u.Scheme + "://" + u.Host
	p := strings.TrimSuffix(u.EscapedPath(), "/")
	candidates := []string{
		origin + "/.well-known/oauth-authorization-server" + p,
		origin + "/.well-known/openid-configuration" + p,
	}
	if p != "" {
		candidates = append(candidates, origin+p+"/.well-known/openid-configuration")
	}
	var errs []error
	for _, c := range candidates {
		var doc struct {
			Issuer  string `json:"issuer"`
			JWKSURI string `json:"jwks_uri"`
		}
		body, err := get(ctx, client, c)
		if err == nil {
			err = json.Unmarshal(body, &doc)
		}
		switch {
		case err != nil:
		case doc.Issuer != issuer:
			err = fmt.Errorf("its issuer is %q", doc.Issuer)
		case doc.JWKSURI == "":
			err = errors.New("it has no jwks_uri")
		default:
			return doc.JWKSURI, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", c, err))
	}
	return "", fmt.Errorf("%w: %w", ErrDiscovery, errors.Join(errs...))
}

// get fetches a JSON document.
func get(ctx context.Context, client *http.Client, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxDocBytes))
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDocBytes+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxDocBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxDocBytes)
	}
	return body, nil
}

// refresh fetches the JWKS now and, if it parses, replaces the keys.
func (v *Verifier) refresh(ctx context.Context) error {
	v.mu.Lock()
	v.tried = v.now()
	v.fetches++
	v.mu.Unlock()
	body, err := get(ctx, v.client, v.jwksURL)
	if err != nil {
		return fmt.Errorf("fetching JWKS %s: %w", v.jwksURL, err)
	}
	set, err := jwk.Parse(body)
	if err != nil {
		return fmt.Errorf("parsing JWKS %s: %w", v.jwksURL, err)
	}
	v.mu.Lock()
	v.keys, v.fetched = set, v.now()
	v.mu.Unlock()
	return nil
}

// keysFor returns the keys a token signed with kid may be verified with,
// fetching the JWKS again first when they are older than KeysMaxAge or kid
// is unknown, but not more often than every RefreshInterval. Concurrent
// callers share one fetch.
func (v *Verifier) keysFor(ctx context.Context, kid string) keySet {
	v.mu.Lock()
	keys, fresh := v.keys, v.now().Sub(v.fetched) < v.opts.KeysMaxAge
	v.mu.Unlock()
	if fresh && known(keys, kid) {
		return keys
	}
	v.fetchMu.Lock() // callers that wait here find the fetch done: not due
	defer v.fetchMu.Unlock()
	v.mu.Lock()
	keys, due := v.keys, v.now().Sub(v.tried) >= v.opts.RefreshInterval
	v.mu.Unlock()
	if !due {
		return keys
	}
	if err := v.refresh(ctx); err != nil {
		v.log.Warn("refreshing the issuer's keys; keeping the previous ones", "err", err)
		return keys
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.keys
}

// known reports whether kid names a key of keys ("" is known when there is
// any key: a token without kid is tried against them all).
func known(keys keySet, kid string) bool {
	if keys == nil {
		return false
	}
	if kid == "" {
		return keys.Len() > 0
	}
	_, ok := keys.LookupKeyID(kid)
	return ok
}

// fetchKeys is the jws.KeyProvider of Verify: it refuses algorithms off the
// allow-list and hands jws the issuer's key(s) for the token's kid.
func (v *Verifier) fetchKeys(ctx context.Context, sink jws.KeySink, sig *jws.Signature, _ *jws.Message) error {
	h := sig.ProtectedHeaders()
	alg, ok := h.Algorithm()
	if !ok || !allowedAlgs[alg.String()] {
		return fmt.Errorf("algorithm %q is not allowed", alg.String())
	}
	kid, _ := h.KeyID()
	keys := v.keysFor(ctx, kid)
	if keys == nil {
		return errors.New("no keys")
	}
	found := false
	for i := range keys.Len() {
		k, _ := keys.Key(i)
		if id, _ := k.KeyID(); kid != "" && id != kid {
			continue
		}
		if use, ok := k.KeyUsage(); ok && use != "sig" {
			continue
		}
		if ka, ok := k.Algorithm(); ok && ka.String() != alg.String() {
			continue
		}
		sink.Key(alg, k)
		found = true
	}
	if !found {
		return fmt.Errorf("no key with kid %q for %s", kid, alg)
	}
	return nil
}
