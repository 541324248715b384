package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// headerList is serve's repeatable --upstream-header 'Name: value'. The
// value is taken as written, except:
//
//	Name: $VAR        the value of environment variable VAR (set, not empty)
//	Name: @file:PATH  the contents of the file PATH, one trailing newline removed
//
// so that secrets stay out of the process list. The value is resolved when
// the flag is parsed.
type headerList struct {
	h http.Header
}

func (l *headerList) String() string {
	if l == nil || l.h == nil {
		return ""
	}
	names := make([]string, 0, len(l.h))
	for k := range l.h {
		names = append(names, k)
	}
	return strings.Join(names, ",") // never the values: they may be secrets
}

func (l *headerList) Set(v string) error {
	name, value, err := parseUpstreamHeader(v, os.LookupEnv, os.ReadFile)
	if err != nil {
		return err
	}
	if l.h == nil {
		l.h = make(http.Header)
	}
	if l.h.Get(name) != "" {
		return fmt.Errorf("header %s given twice", name)
	}
	l.h.Set(name, value)
	return nil
}

// reservedUpstreamHeaders are set by the relay or the transport itself.
var reservedUpstreamHeaders = []string{
	"Accept", "Connection", "Content-Length", "Content-Type", "Host", "Keep-Alive", "Last-Event-Id",
	"Mcp-Protocol-Version", "Mcp-Session-Id", "Mcprelay-Forwarded", "Proxy-Connection", "Te",
	"Trailer", "Transfer-Encoding", "Upgrade",
}

// parseUpstreamHeader reads one --upstream-header value; lookupEnv and
// readFile resolve $VAR and @file:PATH.
func parseUpstreamHeader(v string, lookupEnv func(string) (string, bool), readFile func(string) ([]byte, error)) (name, value string, err error) {
	name, value, ok := strings.Cut(v, ":")
	name, value = strings.TrimSpace(name), strings.TrimSpace(value)
	if !ok || name == "" || value == "" {
		return "", "", fmt.Errorf("want 'Name: value' (value, $VAR or @file:PATH), got %q", v)
	}
	if !validHeaderName(name) {
		return "", "", fmt.Errorf("%q is not a valid header name", name)
	}
	name = http.CanonicalHeaderKey(name)
	for _, r := range reservedUpstreamHeaders {
		if name == r {
			return "", "", fmt.Errorf("header %s is set by the relay itself", name)
		}
	}
	switch {
	case strings.HasPrefix(value, "$"):
		env := value[1:]
		if !validEnvName(env) {
			return "", "", fmt.Errorf("header %s: %q is not an environment variable name", name, env)
		}
		got, ok := lookupEnv(env)
		if !ok || got == "" {
			return "", "", fmt.Errorf("header %s: environment variable %s is not set", name, env)
		}
		value = got
	case strings.HasPrefix(value, "@file:"):
		path := value[len("@file:"):]
		if path == "" {
			return "", "", fmt.Errorf("header %s: @file: needs a path", name)
		}
		b, err := readFile(path)
		if err != nil {
			return "", "", fmt.Errorf("header %s: %w", name, err)
		}
		value = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if value == "" {
			return "", "", fmt.Errorf("header %s: %s is empty", name, path)
		}
	}
	if !validHeaderValue(value) {
		return "", "", errors.New("header " + name + ": the value holds a control character (a newline?)")
	}
	return name, value, nil
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	for _, c := range []byte(s) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return s != ""
}

// validHeaderValue reports whether s holds no control character but tab.
func validHeaderValue(s string) bool {
	for _, c := range []byte(s) {
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func validEnvName(s string) bool {
	for i, c := range []byte(s) {
		if !(c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return s != ""
}
