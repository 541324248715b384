package backend

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// readyFor is how long Ready reuses the answer of its last check: however
// often a load balancer probes, the backend gets at most one request a
// second from it.
const readyFor = time.Second

// readyCheck is the cached result of Upstream.Ready.
type readyCheck struct {
	mu  sync.Mutex // held across a check: concurrent probes share it
	at  time.Time
	err error
}

// Ready reports whether the backend answers HTTP at URL: any HTTP answer
// (a GET without a session is usually a 400 or 405) counts; a connection
// refused, reset or unanswered does not. A result is reused for a second,
// so a flood of readiness probes costs the backend one request a second.
// An in-process upstream is always ready.
func (u *Upstream) Ready(ctx context.Context) error {
	if u.URL == inProcessURL {
		return nil
	}
	c := &u.ready
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < readyFor {
		return c.err
	}
	c.err = u.check(ctx)
	c.at = time.Now()
	return c.err
}

func (u *Upstream) check(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.URL, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	u.setHeader(req.Header)
	resp, err := u.HTTPClient().Do(req)
	if err != nil {
		return fmt.Errorf("backend: not reachable: %w", err)
	}
	resp.Body.Close() // only that it answered matters (a server may even open a stream)
	return nil
}
