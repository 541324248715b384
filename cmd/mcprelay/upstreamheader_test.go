package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseUpstreamHeader: the --upstream-header syntax, row by row.
func TestParseUpstreamHeader(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "token")
	if err := os.WriteFile(secret, []byte("Bearer from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	env := map[string]string{"UP_TOKEN": "Bearer from-env", "EMPTY": "", "BAD": "a\nb"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, tc := range []struct {
		in, name, value string
		err             string // a part of the error; "" for none
	}{
		{in: "X-Api-Key: k1", name: "X-Api-Key", value: "k1"},
		{in: "authorization:Bearer abc def", name: "Authorization", value: "Bearer abc def"},
		{in: "Authorization: $UP_TOKEN", name: "Authorization", value: "Bearer from-env"},
		{in: "Authorization: @file:" + secret, name: "Authorization", value: "Bearer from-file"},
		{in: "X-Url: http://a:1/b", name: "X-Url", value: "http://a:1/b"},
		{in: "no colon", err: "want 'Name: value'"},
		{in: "X-Empty:", err: "want 'Name: value'"},
		{in: ": v", err: "want 'Name: value'"},
		{in: "Bad Name: v", err: "not a valid header name"},
		{in: "Host: example.com", err: "set by the relay itself"},
		{in: "mcp-session-id: x", err: "set by the relay itself"},
		{in: "X: $MISSING", err: "MISSING is not set"},
		{in: "X: $EMPTY", err: "EMPTY is not set"},
		{in: "X: $1A", err: "not an environment variable name"},
		{in: "X: $BAD", err: "control character"},
		{in: "X: @file:", err: "needs a path"},
		{in: "X: @file:" + filepath.Join(dir, "nope"), err: "no such file"},
		{in: "X: @file:" + empty, err: "is empty"},
	} {
		name, value, err := parseUpstreamHeader(tc.in, lookup, os.ReadFile)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.err)
		case tc.err == "" && (name != tc.name || value != tc.value):
			t.Errorf("%q: got %q %q, want %q %q", tc.in, name, value, tc.name, tc.value)
		}
	}
}

// TestUpstreamHeaderFlags: a header given twice, and the combinations serve
// refuses before it starts anything.
func TestUpstreamHeaderFlags(t *testing.T) {
	var l headerList
	if err := l.Set("X-A: 1"); err != nil {
		t.Fatal(err)
	}
	if err := l.Set("x-a: 2"); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a header given twice: %v", err)
	}
	if s := l.String(); strings.Contains(s, "1") {
		t.Fatalf("String shows a value: %q", s)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--forward-authorization", "--upstream-header", "Authorization: Bearer x"}, "contradict"},
		{[]string{"--upstream-header", "X-A: 1", "--", "true"}, "go with an HTTP upstream"},
		{[]string{"--forward-authorization", "--", "true"}, "go with an HTTP upstream"},
		{[]string{"--upstream-header", "X-A"}, "want 'Name: value'"},
	} {
		// An unknown store: were the check missing, serve would still
		// stop before it listens.
		err := serve(append([]string{"--store", "nowhere"}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serve %q: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
