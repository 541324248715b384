package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/mcprelay/mcprelay/relay"
)

// testIssuer serves RFC 8414 metadata and a one-key JWKS on loopback.
func testIssuer(t *testing.T) string {
	t.Helper()
	raw, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := jwk.Import(raw.Public())
	if err != nil {
		t.Fatal(err)
	}
	pub.Set(jwk.KeyIDKey, "k1")
	set := jwk.NewSet()
	set.AddKey(pub)
	var url string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/.well-known/oauth-authorization-server":
			json.NewEncoder(w).Encode(map[string]string{"issuer": url, "jwks_uri": url + "/jwks"})
		case "/jwks":
			json.NewEncoder(w).Encode(set)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	url = srv.URL
	return url
}

func parseAuthFlags(t *testing.T, args ...string) *authFlags {
	t.Helper()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	f := addAuthFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestAuthFlags: which combinations of flags are refused.
func TestAuthFlags(t *testing.T) {
	iss := testIssuer(t)
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		name    string
		addr    string
		args    []string
		wantErr string
	}{
		{"off", "127.0.0.1:8080", nil, ""},
		{"off_identity_header", "127.0.0.1:8080", []string{"--identity-header", "X-User"}, ""},
		{"audience_without_issuer", "127.0.0.1:8080", []string{"--auth-audience", "http://x/mcp"}, "--auth-audience needs --auth-issuer"},
		{"scopes_without_issuer", "127.0.0.1:8080", []string{"--auth-scopes", "a"}, "--auth-scopes needs --auth-issuer"},
		{"on", "127.0.0.1:8080", []string{"--auth-issuer", iss}, ""},
		{"on_identity_header", "127.0.0.1:8080", []string{"--auth-issuer", iss, "--identity-header", "X-User"}, "--identity-header does not apply"},
		{"on_no_host", ":8080", []string{"--auth-issuer", iss}, "--auth-audience is required"},
		{"on_unspecified_host", "0.0.0.0:8080", []string{"--auth-issuer", iss}, "--auth-audience is required"},
		{"on_no_host_with_audience", ":8080", []string{"--auth-issuer", iss, "--auth-audience", "https://mcp.example.com/mcp"}, ""},
		{"on_bad_audience", "127.0.0.1:8080", []string{"--auth-issuer", iss, "--auth-audience", "urn:x"}, "--auth-audience must be"},
		{"on_bad_issuer", "127.0.0.1:8080", []string{"--auth-issuer", iss + "/nope"}, "discovering"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseAuthFlags(t, c.args...).setup(c.addr, log)
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("setup: %v, want %q", err, c.wantErr)
			}
		})
	}
}

// TestAuthServe: with --auth-issuer, /mcp answers 401 with a challenge that
// points at the metadata, served at both well-known paths, whose resource is
// the default audience http://<addr>/mcp.
func TestAuthServe(t *testing.T) {
	iss := testIssuer(t)
	a, err := parseAuthFlags(t, "--auth-issuer", iss, "--auth-scopes", "mcp:tools, mcp:read").setup("127.0.0.1:8080", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if a.identity == nil {
		t.Fatal("no identity with auth on")
	}
	const origin = "http://127.0.0.1:5173"
	h, err := relay.New(relay.Options{Backend: backend.SDK(exampleserver.New(nil), nil), AllowedOrigins: []string{origin}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	srv := httptest.NewServer(routes(h, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("unauthenticated request reached the relay")
	}), a, true))
	defer srv.Close()

	// A browser on an allowed origin: the preflight is answered before the
	// token check, the 401 is readable by its script.
	req, _ := http.NewRequest("OPTIONS", srv.URL+"/mcp", nil)
	req.Header.Set("Origin", origin)
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "authorization,content-type")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != origin {
		t.Fatalf("preflight: %s, Access-Control-Allow-Origin %q", resp.Status, resp.Header.Get("Access-Control-Allow-Origin"))
	}
	req, _ = http.NewRequest("POST", srv.URL+"/mcp", strings.NewReader(`{}`))
	req.Header.Set("Origin", origin)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != 401 || resp.Header.Get("Access-Control-Allow-Origin") != origin ||
		!strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "WWW-Authenticate") {
		t.Fatalf("401 to a browser: %s, headers %v", resp.Status, resp.Header)
	}

	resp, err := http.Post(srv.URL+"/mcp", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := `Bearer resource_metadata="http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp", scope="mcp:tools mcp:read"`
	if got := resp.Header.Get("WWW-Authenticate"); resp.StatusCode != 401 || got != want {
		t.Fatalf("%s, WWW-Authenticate:\n got %s\nwant %s", resp.Status, got, want)
	}
	for _, p := range []string{"/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"} {
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantBody := `{"resource":"http://127.0.0.1:8080/mcp","authorization_servers":["` + iss + `"],"scopes_supported":["mcp:tools","mcp:read"],"bearer_methods_supported":["header"]}`
		if resp.StatusCode != 200 || string(body) != wantBody {
			t.Fatalf("%s: %s\n got %s\nwant %s", p, resp.Status, body, wantBody)
		}
	}
}

// TestHeaderIdentity: --identity-header binds sessions to a hash of that
// header; Authorization is left to the relay's default.
func TestHeaderIdentity(t *testing.T) {
	if headerIdentity("Authorization") != nil || headerIdentity("authorization") != nil {
		t.Fatal("Authorization should be the relay's default (nil)")
	}
	id := headerIdentity("X-User")
	req := func(v string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		if v != "" {
			r.Header.Set("X-User", v)
		}
		r.Header.Set("Authorization", "Bearer "+rand.Text()) // ignored
		return r
	}
	a1, a2, b := id(req("alice")), id(req("alice")), id(req("bob"))
	if a1 == "" || a1 != a2 || a1 == b || strings.Contains(a1, "alice") {
		t.Fatalf("alice %q %q, bob %q", a1, a2, b)
	}
	if got := id(req("")); got != "" {
		t.Fatalf("no header: %q", got)
	}
}
