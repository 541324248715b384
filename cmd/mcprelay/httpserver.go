package main

import (
	"io"
	"net/http"
	"sync"
	"time"
)

// HTTP server timeouts. There is deliberately no ReadTimeout or
// WriteTimeout: they would cut the long-lived SSE responses (a read
// deadline left on the connection cancels the request's context once the
// server's background read hits it).
const (
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 2 * time.Minute
	// bodyTimeout bounds reading one request body, from the end of its
	// headers to its end: a client sending a body at 1 byte/s is cut off.
	bodyTimeout = 30 * time.Second
)

// newServer returns the relay's HTTP server around h.
func newServer(h http.Handler, bodyTimeout time.Duration) *http.Server {
	return &http.Server{
		Handler:           bodyDeadline(h, bodyTimeout),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
	}
}

// bodyDeadline puts a read deadline of d on the connection while a request
// body is read, and removes it as soon as the body has been read to its
// end, before the handler starts a response that may stream for hours. A
// body that does not arrive in time fails the handler's read with a timeout
// error; the deadline then stays, so that the server's own discarding of
// the unread rest fails as fast and the connection is closed.
func bodyDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err != nil {
			// Not a net/http connection (e.g. a test recorder): no deadline.
			h.ServeHTTP(w, r)
			return
		}
		r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
		h.ServeHTTP(w, r)
	})
}

// deadlineBody clears the connection's read deadline at the body's EOF.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	once sync.Once
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.clear()
	}
	return n, err
}

func (b *deadlineBody) clear() {
	b.once.Do(func() { b.rc.SetReadDeadline(time.Time{}) })
}
