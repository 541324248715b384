package main

import (
	"bytes"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestWarnIfUnreachable: an upstream with nothing listening is a warning
// naming it and the cause; a listening one, nothing.
func TestWarnIfUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/mcp"
	ln.Close()
	up := httptest.NewServer(nil)
	defer up.Close()
	for _, c := range []struct {
		url, want string
	}{
		{closed, `level=WARN msg="the upstream cannot be reached now; requests get 502 until it can" upstream=` + closed + ` err="dial tcp ` + strings.TrimPrefix(strings.TrimSuffix(closed, "/mcp"), "http://") + `: connect: connection refused"`},
		{up.URL + "/mcp", ""},
	} {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
		u, _ := url.Parse(c.url)
		warnIfUnreachable(t.Context(), u, log)
		if got := strings.TrimSpace(buf.String()); got != c.want {
			t.Errorf("%s: logged\n%s\nwant\n%s", c.url, got, c.want)
		}
	}
}
