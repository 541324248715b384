package main

import (
	"context"
	"log/slog"
	"net"
	"net/url"
	"time"
)

// upstreamDialTimeout bounds the start-up check of --upstream.
const upstreamDialTimeout = 5 * time.Second

// warnIfUnreachable tries a TCP connection to the host of the upstream URL
// u and logs a warning if none can be made. It never fails the start: the
// upstream may come up later (until then its requests get 502).
func warnIfUnreachable(ctx context.Context, u *url.URL, log *slog.Logger) {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	ctx, cancel := context.WithTimeout(ctx, upstreamDialTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		log.Warn("the upstream cannot be reached now; requests get 502 until it can", "upstream", u.Redacted(), "err", err)
		return
	}
	c.Close()
}
