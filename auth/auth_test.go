package auth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// okHandler answers 200 with the principal.
var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	p, ok := PrincipalFrom(r.Context())
	if !ok {
		http.Error(w, "no principal", http.StatusInternalServerError)
		return
	}
	io.WriteString(w, p)
})

// call sends a request with the given Authorization headers through the
// middleware.
func call(v *Verifier, authz ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	for _, a := range authz {
		r.Header.Add("Authorization", a)
	}
	w := httptest.NewRecorder()
	v.Middleware(okHandler).ServeHTTP(w, r)
	return w
}

const wantMeta = `resource_metadata="http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp"`

// compact builds an unsigned-by-library token: header.payload.signature.
func compact(header, payload any, sign func(signingInput string) []byte) string {
	h, _ := json.Marshal(header)
	p, _ := json.Marshal(payload)
	in := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(p)
	var sig []byte
	if sign != nil {
		sig = sign(in)
	}
	return in + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// TestAccepts: valid tokens pass, in every shape of aud and scope the
// verifier supports, and reach the handler with the principal.
func TestAccepts(t *testing.T) {
	is := newTestIssuer(t)
	is.addRSA("r1")
	is.addEC("e1")
	v, clk := newTestVerifier(t, is, Options{Scopes: []string{"mcp:tools"}})
	now := clk.now()
	with := func(c claims, k string, val any) claims { c[k] = val; return c }
	cases := map[string]string{
		"rs256":             is.sign("r1", is.good("alice", now)),
		"es256":             is.sign("e1", is.good("alice", now)),
		"aud_array":         is.sign("r1", with(is.good("alice", now), "aud", []string{"other", testAudience})),
		"scp_array":         is.sign("r1", with(with(is.good("alice", now), "scope", nil), "scp", []string{"mcp:tools"})),
		"expired_in_leeway": is.sign("r1", with(is.good("alice", now), "exp", now.Add(-20*time.Second).Unix())),
		"nbf_in_leeway":     is.sign("r1", with(is.good("alice", now), "nbf", now.Add(20*time.Second).Unix())),
	}
	for name, tok := range cases {
		t.Run(name, func(t *testing.T) {
			w := call(v, "Bearer "+tok)
			if w.Code != http.StatusOK {
				t.Fatalf("status %d, WWW-Authenticate %q", w.Code, w.Header().Get("WWW-Authenticate"))
			}
			if got, want := w.Body.String(), principalOf(is.URL, "alice"); got != want {
				t.Fatalf("principal %q, want %q", got, want)
			}
		})
	}
}

// TestRejects: every bad token gets 401 with error="invalid_token" and the
// exact challenge, and Verify says why.
func TestRejects(t *testing.T) {
	is := newTestIssuer(t)
	pub := is.addRSA("r1")
	v, clk := newTestVerifier(t, is, Options{})
	now := clk.now()
	with := func(c claims, k string, val any) claims { c[k] = val; return c }

	foreign := newTestIssuer(t) // same kid, another key
	foreign.addRSA("r1")

	der, err := x509.MarshalPKIXPublicKey(&pub.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	hs := func(secret []byte) func(string) []byte {
		return func(in string) []byte {
			m := hmac.New(sha256.New, secret)
			m.Write([]byte(in))
			return m.Sum(nil)
		}
	}
	goodClaims := is.good("alice", now)

	cases := []struct {
		name, token, why string
	}{
		{"garbage", "not.a.jwt", ""},
		{"expired", is.sign("r1", with(is.good("alice", now), "exp", now.Add(-time.Minute).Unix())), `"exp"`},
		{"not_yet_valid", is.sign("r1", with(is.good("alice", now), "nbf", now.Add(time.Minute).Unix())), `"nbf"`},
		{"issued_in_future", is.sign("r1", with(is.good("alice", now), "iat", now.Add(time.Minute).Unix())), `"iat"`},
		{"no_exp", is.sign("r1", with(is.good("alice", now), "exp", nil)), `exp`},
		{"no_sub", is.sign("r1", with(is.good("alice", now), "sub", nil)), `sub`},
		{"wrong_issuer", is.sign("r1", with(is.good("alice", now), "iss", is.URL+"/other")), `"iss"`},
		{"wrong_audience", is.sign("r1", with(is.good("alice", now), "aud", "http://127.0.0.1:9/other")), `"aud"`},
		{"no_audience", is.sign("r1", with(is.good("alice", now), "aud", nil)), `"aud"`},
		{"foreign_key", foreign.sign("r1", is.good("alice", now)), "verif"},
		{"unknown_kid", compact(map[string]string{"alg": "RS256", "kid": "nope"}, goodClaims, func(string) []byte { return []byte("sig") }), `no key with kid "nope"`},
		{"alg_none", compact(map[string]string{"alg": "none", "kid": "r1"}, goodClaims, nil), `algorithm "none" is not allowed`},
		{"hs256_public_key_pem", compact(map[string]string{"alg": "HS256", "kid": "r1"}, goodClaims, hs(pemBytes)), `algorithm "HS256" is not allowed`},
		{"hs256_public_key_der", compact(map[string]string{"alg": "HS256", "kid": "r1"}, goodClaims, hs(der)), `algorithm "HS256" is not allowed`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := v.Verify(context.Background(), c.token)
			if !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("Verify: %v, want ErrInvalidToken mentioning %s", err, c.why)
			}
			w := call(v, "Bearer "+c.token)
			if w.Code != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", w.Code)
			}
			if got, want := w.Header().Get("WWW-Authenticate"), `Bearer error="invalid_token", `+wantMeta; got != want {
				t.Fatalf("WWW-Authenticate:\n got %s\nwant %s", got, want)
			}
		})
	}
}

// TestChallenges: the exact WWW-Authenticate of each refusal, with and
// without required scopes.
func TestChallenges(t *testing.T) {
	is := newTestIssuer(t)
	is.addRSA("r1")
	plain, _ := newTestVerifier(t, is, Options{})
	scoped, clk := newTestVerifier(t, is, Options{Scopes: []string{"mcp:tools", "mcp:admin"}})
	tok := is.sign("r1", is.good("alice", clk.now())) // scope "mcp:tools other"

	cases := []struct {
		name   string
		v      *Verifier
		authz  []string
		status int
		want   string
	}{
		{"none", plain, nil, 401, `Bearer ` + wantMeta},
		{"basic_scheme", plain, []string{"Basic YWxpY2U6cHc="}, 401, `Bearer ` + wantMeta},
		{"none_scoped", scoped, nil, 401, `Bearer ` + wantMeta + `, scope="mcp:tools mcp:admin"`},
		{"empty_bearer", plain, []string{"Bearer "}, 401, `Bearer error="invalid_token", ` + wantMeta},
		{"two_headers", plain, []string{"Bearer " + tok, "Bearer " + tok}, 401, `Bearer error="invalid_token", ` + wantMeta},
		{"garbage_scoped", scoped, []string{"Bearer x.y.z"}, 401, `Bearer error="invalid_token", ` + wantMeta + `, scope="mcp:tools mcp:admin"`},
		{"missing_scope", scoped, []string{"Bearer " + tok}, 403, `Bearer error="insufficient_scope", scope="mcp:tools mcp:admin", ` + wantMeta},
		{"lowercase_scheme_ok", plain, []string{"bearer " + tok}, 200, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := call(c.v, c.authz...)
			if w.Code != c.status {
				t.Fatalf("status %d, want %d (%s)", w.Code, c.status, w.Body)
			}
			if got := w.Header().Get("WWW-Authenticate"); got != c.want {
				t.Fatalf("WWW-Authenticate:\n got %s\nwant %s", got, c.want)
			}
		})
	}
}

// TestKeyRotation: a token signed by a key added to the JWKS after start is
// accepted once the keys are fetched again; a key withdrawn from the JWKS
// stops being accepted when the keys age out.
func TestKeyRotation(t *testing.T) {
	is := newTestIssuer(t)
	is.addRSA("old")
	v, clk := newTestVerifier(t, is, Options{})
	if w := call(v, "Bearer "+is.sign("old", is.good("alice", clk.now()))); w.Code != 200 {
		t.Fatalf("old key: %d", w.Code)
	}
	is.addEC("new")
	clk.advance(DefaultRefreshInterval) // the last fetch is not recent
	before := is.fetches.Load()
	if w := call(v, "Bearer "+is.sign("new", is.good("alice", clk.now()))); w.Code != 200 {
		t.Fatalf("rotated key: %d %s", w.Code, w.Header().Get("WWW-Authenticate"))
	}
	if n := is.fetches.Load() - before; n != 1 {
		t.Fatalf("%d JWKS fetches for the new kid, want 1", n)
	}
	// "old" withdrawn; the cache is fresh: still accepted, without a fetch.
	is.remove("old")
	clk.advance(DefaultRefreshInterval)
	if w := call(v, "Bearer "+is.sign("old", is.good("alice", clk.now()))); w.Code != 200 {
		t.Fatalf("old key, cache fresh: %d", w.Code)
	}
	if n := is.fetches.Load() - before; n != 1 {
		t.Fatalf("%d JWKS fetches, want still 1", n)
	}
	clk.advance(DefaultKeysMaxAge)
	if w := call(v, "Bearer "+is.sign("old", is.good("alice", clk.now()))); w.Code != 401 {
		t.Fatalf("withdrawn key after max age: %d, want 401", w.Code)
	}
	if w := call(v, "Bearer "+is.sign("new", is.good("alice", clk.now()))); w.Code != 200 {
		t.Fatalf("new key after max age: %d", w.Code)
	}
}

// TestKeyConstraints: a JWK published for encryption, or for another
// algorithm than the token's, does not verify it.
func TestKeyConstraints(t *testing.T) {
	is := newTestIssuer(t)
	v, clk := newTestVerifier(t, is, Options{})
	for _, c := range []struct {
		name   string
		params []string
		status int
	}{
		{"plain", nil, 200},
		{"use_sig", []string{"use", "sig"}, 200},
		{"alg_rs256", []string{"alg", "RS256"}, 200},
		{"use_enc", []string{"use", "enc"}, 401},
		{"alg_rs512", []string{"alg", "RS512"}, 401},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				t.Fatal(err)
			}
			is.add(c.name, raw, c.params...)
			clk.advance(DefaultRefreshInterval) // let the new kid be fetched
			if w := call(v, "Bearer "+is.sign(c.name, is.good("alice", clk.now()))); w.Code != c.status {
				t.Fatalf("status %d, want %d", w.Code, c.status)
			}
		})
	}
}

// TestRefreshFailureKeepsKeys: when the JWKS cannot be fetched again, the
// keys already fetched keep working.
func TestRefreshFailureKeepsKeys(t *testing.T) {
	is := newTestIssuer(t)
	is.addRSA("r1")
	v, clk := newTestVerifier(t, is, Options{})
	is.failing.Store(true)
	clk.advance(DefaultKeysMaxAge)
	before := is.fetches.Load()
	if w := call(v, "Bearer "+is.sign("r1", is.good("alice", clk.now()))); w.Code != 200 {
		t.Fatalf("status %d after a failed refresh, want 200", w.Code)
	}
	if is.fetches.Load() != before+1 {
		t.Fatalf("%d fetches, want 1 (the failed one)", is.fetches.Load()-before)
	}
}

// TestRefreshRateLimit: a flood of tokens with unknown kids causes at most
// one JWKS fetch per RefreshInterval, and none when the last is recent.
func TestRefreshRateLimit(t *testing.T) {
	is := newTestIssuer(t)
	is.addRSA("r1")
	v, clk := newTestVerifier(t, is, Options{})
	goodClaims := is.good("alice", clk.now())
	flood := func() {
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() {
				tok := compact(map[string]string{"alg": "RS256", "kid": rand.Text()}, goodClaims, func(string) []byte { return []byte("sig") })
				if w := call(v, "Bearer "+tok); w.Code != 401 {
					t.Errorf("unknown kid: %d", w.Code)
				}
			})
		}
		wg.Wait()
	}
	start := is.fetches.Load()
	flood() // just fetched at start
	if n := is.fetches.Load() - start; n != 0 {
		t.Fatalf("%d fetches right after the first, want 0", n)
	}
	clk.advance(DefaultRefreshInterval)
	flood()
	if n := is.fetches.Load() - start; n != 1 {
		t.Fatalf("%d fetches after one interval, want 1", n)
	}
	clk.advance(DefaultRefreshInterval / 2)
	flood()
	if n := is.fetches.Load() - start; n != 1 {
		t.Fatalf("%d fetches half an interval later, want still 1", n)
	}
}

// TestPrincipal: a refreshed token of the same subject has the same
// principal; another subject, or the same subject of another issuer, not.
func TestPrincipal(t *testing.T) {
	is := newTestIssuer(t)
	is.addRSA("r1")
	v, clk := newTestVerifier(t, is, Options{})
	a1, err := v.Verify(context.Background(), is.sign("r1", is.good("alice", clk.now())))
	if err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Minute)
	a2, err := v.Verify(context.Background(), is.sign("r1", is.good("alice", clk.now())))
	if err != nil {
		t.Fatal(err)
	}
	b, err := v.Verify(context.Background(), is.sign("r1", is.good("bob", clk.now())))
	if err != nil {
		t.Fatal(err)
	}
	if a1.Principal != a2.Principal || a1.Principal == b.Principal || a1.Principal == "" {
		t.Fatalf("alice %q then %q, bob %q", a1.Principal, a2.Principal, b.Principal)
	}
	if principalOf("https://x", "alice") == principalOf("https://y", "alice") {
		t.Fatal("the same subject of two issuers has one principal")
	}
}

// TestMetadata: the RFC 9728 document and its URL.
func TestMetadata(t *testing.T) {
	is := newTestIssuer(t)
	is.addRSA("r1")
	v, _ := newTestVerifier(t, is, Options{Scopes: []string{"mcp:tools"}})
	for _, path := range []string{MetadataPath, MetadataPath + "/mcp"} {
		w := httptest.NewRecorder()
		v.MetadataHandler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("%s: %d %q", path, w.Code, w.Header().Get("Content-Type"))
		}
		var got map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{
			"resource":                 testAudience,
			"authorization_servers":    []any{is.URL},
			"scopes_supported":         []any{"mcp:tools"},
			"bearer_methods_supported": []any{"header"},
		}
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(want)
		if string(gb) != string(wb) {
			t.Fatalf("%s:\n got %s\nwant %s", path, gb, wb)
		}
	}
	w := httptest.NewRecorder()
	v.MetadataHandler().ServeHTTP(w, httptest.NewRequest(http.MethodPost, MetadataPath, nil))
	if w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", w.Code)
	}
	for aud, want := range map[string]string{
		"https://mcp.example.com/mcp":        "https://mcp.example.com/.well-known/oauth-protected-resource/mcp",
		"https://mcp.example.com":            "https://mcp.example.com/.well-known/oauth-protected-resource",
		"https://mcp.example.com/":           "https://mcp.example.com/.well-known/oauth-protected-resource",
		"http://127.0.0.1:8080/a/b/":         "http://127.0.0.1:8080/.well-known/oauth-protected-resource/a/b",
		"https://mcp.example.com/mcp?x=1#yz": "https://mcp.example.com/.well-known/oauth-protected-resource/mcp",
	} {
		if got, err := metadataURL(aud); err != nil || got != want {
			t.Errorf("metadataURL(%q) = %q, %v; want %q", aud, got, err, want)
		}
	}
}

// TestDiscovery: the JWKS URL is found through RFC 8414 or OpenID Connect
// metadata, at the locations the MCP specification orders, and a document
// naming another issuer is not trusted.
func TestDiscovery(t *testing.T) {
	for _, c := range []struct {
		name, issuerPath, docPath string
		lie                       bool
		wantErr                   bool
	}{
		{"rfc8414", "", "/.well-known/oauth-authorization-server", false, false},
		{"openid", "", "/.well-known/openid-configuration", false, false},
		{"rfc8414_path_inserted", "/tenant", "/.well-known/oauth-authorization-server/tenant", false, false},
		{"openid_path_inserted", "/tenant", "/.well-known/openid-configuration/tenant", false, false},
		{"openid_path_appended", "/tenant", "/tenant/.well-known/openid-configuration", false, false},
		{"issuer_mismatch", "", "/.well-known/oauth-authorization-server", true, true},
		{"nothing", "", "/elsewhere", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var srv *httptest.Server
			srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != c.docPath {
					http.NotFound(w, r)
					return
				}
				iss := srv.URL + c.issuerPath
				if c.lie {
					iss = "https://evil.example"
				}
				json.NewEncoder(w).Encode(map[string]string{"issuer": iss, "jwks_uri": "http://127.0.0.1/keys"})
			}))
			defer srv.Close()
			got, err := discover(context.Background(), srv.Client(), srv.URL+c.issuerPath)
			if c.wantErr {
				if !errors.Is(err, ErrDiscovery) {
					t.Fatalf("got %q, %v; want ErrDiscovery", got, err)
				}
				return
			}
			if err != nil || got != "http://127.0.0.1/keys" {
				t.Fatalf("got %q, %v", got, err)
			}
		})
	}
}

// TestNewOptions: required options, https, and the zero values' defaults.
func TestNewOptions(t *testing.T) {
	is := newTestIssuer(t)
	is.addRSA("r1")
	ctx := context.Background()
	for name, o := range map[string]Options{
		"no_issuer":           {Audience: testAudience},
		"no_audience":         {Issuer: is.URL},
		"http_issuer":         {Issuer: "http://auth.example.com", Audience: testAudience},
		"http_jwks":           {Issuer: is.URL, Audience: testAudience, JWKSURL: "http://auth.example.com/jwks"},
		"urn_audience_no_url": {Issuer: is.URL, Audience: "urn:mcp"},
		"bad_scope":           {Issuer: is.URL, Audience: testAudience, Scopes: []string{`a"b`}},
	} {
		if _, err := New(ctx, o); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	if _, err := New(ctx, Options{Issuer: is.URL, Audience: testAudience, JWKSURL: is.URL + "/missing"}); !errors.Is(err, ErrDiscovery) {
		t.Errorf("missing JWKS: %v, want ErrDiscovery", err)
	}
	v, err := New(ctx, Options{Issuer: is.URL, Audience: "urn:mcp", ResourceMetadataURL: "https://m.example/meta"})
	if err != nil {
		t.Fatal(err)
	}
	if v.opts.Leeway != DefaultLeeway || v.opts.RefreshInterval != DefaultRefreshInterval || v.opts.KeysMaxAge != DefaultKeysMaxAge || v.jwksURL != is.URL+"/jwks" || v.ResourceMetadataURL() != "https://m.example/meta" {
		t.Fatalf("defaults: %+v jwks %q meta %q", v.opts, v.jwksURL, v.ResourceMetadataURL())
	}
}
