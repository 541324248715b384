package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/lestrrat-go/jwx/v3/jwt"
)

// testIssuer is an authorization server on loopback: RFC 8414 metadata at
// /.well-known/oauth-authorization-server and its keys at /jwks.
type testIssuer struct {
	t   *testing.T
	srv *httptest.Server
	URL string // the issuer identifier

	mu      sync.Mutex
	public  jwk.Set            // what /jwks serves
	private map[string]jwk.Key // signing keys by kid
	fetches atomic.Int64       // GET /jwks count
	failing atomic.Bool        // GET /jwks answers 500
}

func newTestIssuer(t *testing.T) *testIssuer {
	t.Helper()
	is := &testIssuer{t: t, public: jwk.NewSet(), private: map[string]jwk.Key{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/oauth-authorization-server", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]string{"issuer": is.URL, "jwks_uri": is.URL + "/jwks"})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, r *http.Request) {
		is.fetches.Add(1)
		if is.failing.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		is.mu.Lock()
		defer is.mu.Unlock()
		json.NewEncoder(w).Encode(is.public)
	})
	is.srv = httptest.NewServer(mux)
	t.Cleanup(is.srv.Close)
	is.URL = is.srv.URL
	return is
}

// addRSA generates an RSA key named kid and publishes it.
func (is *testIssuer) addRSA(kid string) *rsa.PrivateKey {
	is.t.Helper()
	raw, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		is.t.Fatal(err)
	}
	is.add(kid, raw)
	return raw
}

// addEC generates a P-256 key named kid and publishes it.
func (is *testIssuer) addEC(kid string) {
	is.t.Helper()
	raw, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		is.t.Fatal(err)
	}
	is.add(kid, raw)
}

// add publishes raw's public key as kid, with the given extra JWK
// parameters (such as "use" or "alg").
func (is *testIssuer) add(kid string, raw any, params ...string) {
	is.t.Helper()
	priv, err := jwk.Import(raw)
	if err != nil {
		is.t.Fatal(err)
	}
	priv.Set(jwk.KeyIDKey, kid)
	pub, err := priv.PublicKey()
	if err != nil {
		is.t.Fatal(err)
	}
	for i := 0; i+1 < len(params); i += 2 {
		if err := pub.Set(params[i], params[i+1]); err != nil {
			is.t.Fatal(err)
		}
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	is.private[kid] = priv
	is.public.AddKey(pub)
}

// remove withdraws kid from the JWKS (the signing key stays usable here).
func (is *testIssuer) remove(kid string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	if k, ok := is.public.LookupKeyID(kid); ok {
		is.public.RemoveKey(k)
	}
}

// claims are a token's claims; nil values are left out.
type claims map[string]any

// sign signs c with the key kid (RS256 for RSA, ES256 for EC).
func (is *testIssuer) sign(kid string, c claims) string {
	is.t.Helper()
	is.mu.Lock()
	key := is.private[kid]
	is.mu.Unlock()
	if key == nil {
		is.t.Fatalf("no key %q", kid)
	}
	return signWith(is.t, key, c)
}

func signWith(t *testing.T, key jwk.Key, c claims) string {
	t.Helper()
	tok := jwt.New()
	for k, v := range c {
		if v == nil {
			continue
		}
		if err := tok.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	alg := jwa.RS256()
	if key.KeyType() == jwa.EC() {
		alg = jwa.ES256()
	}
	b, err := jwt.Sign(tok, jwt.WithKey(alg, key))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// good returns the claims of a valid token for sub at now.
func (is *testIssuer) good(sub string, now time.Time) claims {
	return claims{
		"iss":   is.URL,
		"aud":   testAudience,
		"sub":   sub,
		"iat":   now.Unix(),
		"exp":   now.Add(5 * time.Minute).Unix(),
		"jti":   rand.Text(),
		"scope": "mcp:tools other",
	}
}

const testAudience = "http://127.0.0.1:9/mcp"

// fakeClock is a settable clock for the verifier.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}
func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// newTestVerifier returns a verifier for is (keys fetched at creation) on a
// fake clock that starts now.
func newTestVerifier(t *testing.T, is *testIssuer, opts Options) (*Verifier, *fakeClock) {
	t.Helper()
	opts.Issuer = is.URL
	if opts.Audience == "" {
		opts.Audience = testAudience
	}
	v, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	c := newFakeClock()
	v.mu.Lock()
	v.now = c.now
	v.tried, v.fetched = c.now(), c.now()
	v.mu.Unlock()
	return v, c
}
