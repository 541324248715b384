package backend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// InProcess returns an [http.RoundTripper] that answers every request by
// calling h.ServeHTTP in a goroutine of its own: no socket, no
// serialization beyond the request and response bodies. The goroutine is
// kept for the next request for up to a second after it served one, as
// net/http's server keeps a connection's (a handler's stack grows once,
// not per request); CloseIdleConnections ends the idle ones at once.
//
// The response goes out when net/http's server would send it: at the
// handler's first Flush, when its 32 KiB buffer fills, or when it returns.
// A handler that returns first hands over its whole answer in memory: no
// goroutine hand-off for the body, and [Buffered] tells it. Otherwise the
// response streams: its Body yields what the handler writes as it flushes.
// Closing the Body, or cancelling the request's context, cancels the context
// the handler sees and makes its further writes fail, as a closed TCP
// connection would.
func InProcess(h http.Handler) http.RoundTripper {
	return inProcess{h, &workers{jobs: make(chan func())}}
}

type inProcess struct {
	h http.Handler
	w *workers
}

// workers runs in-process handlers on goroutines kept between requests,
// as net/http's server keeps a connection's: a handler with a deep stack
// (the Go SDK's) grows one once rather than once per request, and no
// goroutine is started per request. A worker idle for workerIdle ends, so
// an idle relay keeps none.
type workers struct {
	jobs   chan func()   // unbuffered: a job goes only to a worker waiting for one
	closes atomic.Uint64 // closeIdle calls so far
}

// workerIdle is how long a worker waits for a job before it ends.
const workerIdle = time.Second

// run runs f on a waiting worker, or on a new one.
func (p *workers) run(f func()) {
	select {
	case p.jobs <- f:
	default:
		go p.work(f)
	}
}

func (p *workers) work(f func()) {
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		closes := p.closes.Load()
		f()
		f = nil // not kept while waiting
		if p.closes.Load() != closes {
			return // closeIdle came while f ran: it counts as idle
		}
		t.Reset(workerIdle)
		select {
		case f = <-p.jobs:
			if f == nil {
				return // closeIdle
			}
		case <-t.C:
			return
		}
	}
}

// closeIdle ends the workers waiting for a job now, and those whose job
// is ending.
func (p *workers) closeIdle() {
	p.closes.Add(1)
	for {
		select {
		case p.jobs <- nil:
		default:
			return
		}
	}
}

// CloseIdleConnections ends the goroutines kept for handlers that wait for
// a request now (http.Client.CloseIdleConnections calls it); later
// requests start new ones.
func (t inProcess) CloseIdleConnections() { t.w.closeIdle() }

// errClientGone is what a handler's Write returns once the caller closed the
// response body or cancelled the request.
var errClientGone = errors.New("backend: in-process client closed the response")

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := handlerContext(req.Context())
	return t.serve(req.Clone(ctx), req, ctx, cancel, 0)
}

// handlerContext returns the context of a request to an in-process
// handler, made from the caller's: the handler is not behind a listener,
// so the caller's own server and local address (a relay request's context
// carries them), which handlers use for decisions such as DNS-rebinding
// protection, are hidden. It is cancelled when the caller closes the
// response or gives up, and when the handler returns.
func handlerContext(parent context.Context) (context.Context, context.CancelCauseFunc) {
	return context.WithCancelCause(noListener{parent})
}

// serve runs the handler on sreq, a request with ctx (handlerContext)
// that the handler may keep; req is the caller's request. It fails with
// ErrTimeout if the handler has not answered within timeout (0: no bound),
// as doBounded does for other transports, on the same context.
func (t inProcess) serve(sreq, req *http.Request, ctx context.Context, cancel context.CancelCauseFunc, timeout time.Duration) (*http.Response, error) {
	if timeout > 0 {
		timer := time.AfterFunc(timeout, func() {
			cancel(fmt.Errorf("%w (%v, %s %s)", ErrTimeout, timeout, req.Method, "backend"))
		})
		defer timer.Stop()
	}
	sreq.RequestURI = req.URL.RequestURI()
	sreq.RemoteAddr = "in-process"
	if sreq.Host == "" {
		sreq.Host = req.URL.Host
	}
	if sreq.Body == nil {
		sreq.Body = http.NoBody
	}
	w := &pipeWriter{
		header:  make(http.Header),
		ready:   make(chan struct{}),
		request: req,
		ctx:     ctx,
		cancel:  cancel,
	}
	t.w.run(func() {
		defer func() {
			if p := recover(); p != nil {
				if !w.sent {
					w.code, w.snap = http.StatusInternalServerError, make(http.Header)
					w.stream()
				}
				if w.pw != nil {
					if p == http.ErrAbortHandler {
						w.pw.CloseWithError(io.ErrUnexpectedEOF)
					} else {
						w.pw.CloseWithError(fmt.Errorf("backend: in-process handler panicked: %v", p))
					}
				}
				cancel(errClientGone)
				return
			}
			if w.sent {
				w.flushBuf()
				if w.pw != nil {
					w.pw.Close()
				}
			} else {
				// Finished before anything went out: the whole answer
				// is in buf.
				w.respond(&memBody{data: w.buf, cancel: cancel})
			}
			cancel(errClientGone)
		}()
		t.h.ServeHTTP(w, sreq)
	})
	select {
	case <-w.ready:
		return w.resp, nil
	case <-ctx.Done():
		if errors.Is(context.Cause(ctx), errClientGone) {
			// Not the caller: the handler answered and finished, and its
			// end cancelled the context (the answer is ready).
			<-w.ready
			return w.resp, nil
		}
		// The caller gave up before the handler answered: no response
		// goes out any more, and the handler's writes fail. If it
		// answered meanwhile, its answer is closed unread.
		w.once.Do(func() { close(w.ready) })
		<-w.ready
		if w.resp != nil {
			w.resp.Body.Close()
		}
		return nil, context.Cause(ctx)
	}
}

// noListener is a request's context without the server and local address
// of the caller's own server.
type noListener struct{ context.Context }

func (c noListener) Value(key any) any {
	if key == http.LocalAddrContextKey || key == http.ServerContextKey {
		return nil
	}
	return c.Context.Value(key)
}

// pipeWriter is the http.ResponseWriter the handler writes to.
type pipeWriter struct {
	header  http.Header
	request *http.Request
	cancel  context.CancelCauseFunc
	pw      *io.PipeWriter // made when the response streams (stream); nil if the caller gave up first

	code int         // the status the handler set; 0 before
	snap http.Header // the header as it was when the status was set
	sent bool        // the response went to the caller (only the handler's goroutine reads it)

	once  sync.Once
	ready chan struct{}
	resp  *http.Response

	ctx context.Context // the handler's: done once the caller is gone
	buf []byte          // written, not yet handed to the reader
	err error           // sticky: the reader is gone
}

func (w *pipeWriter) Header() http.Header { return w.header }

// WriteHeader sets the status and takes the header as it is now, as
// net/http's does; both go out with the response.
func (w *pipeWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 {
		return // informational responses are not forwarded
	}
	if w.code == 0 {
		w.code = code
		w.snap = w.header.Clone()
	}
}

// stream hands the response to the caller with a body that streams what
// the handler writes from now on, unless the caller gave up.
func (w *pipeWriter) stream() {
	if w.sent {
		return
	}
	w.sent = true
	w.once.Do(func() {
		pr, pw := io.Pipe()
		w.pw = pw
		w.respondLocked(&pipeBody{pr: pr, cancel: w.cancel})
	})
}

// respond hands the whole response to the caller, unless the caller gave
// up.
func (w *pipeWriter) respond(body io.ReadCloser) {
	w.sent = true
	w.once.Do(func() { w.respondLocked(body) })
}

// respondLocked sets the response and tells the caller; under w.once.
func (w *pipeWriter) respondLocked(body io.ReadCloser) {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	h := w.snap
	cl := int64(-1)
	if v := h.Get("Content-Length"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			cl = n
		}
	} else if mb, ok := body.(*memBody); ok {
		cl = int64(len(mb.data))
	}
	w.resp = &http.Response{
		Status:        fmt.Sprintf("%d %s", w.code, http.StatusText(w.code)),
		StatusCode:    w.code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          body,
		ContentLength: cl,
		Request:       w.request,
	}
	close(w.ready)
}

// Write buffers p, as a server's response writer does: the reader gets it
// at the next Flush, when the buffer fills, or when the handler returns. A
// handoff through the pipe per Write would cost a goroutine switch for
// every small write a handler makes.
func (w *pipeWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.err == nil && w.ctx.Err() != nil {
		w.err = errClientGone // the caller closed the body or gave up
	}
	if w.err != nil {
		return 0, w.err
	}
	if len(w.buf)+len(p) > writeBufSize {
		w.stream()
		if err := w.flushBuf(); err != nil {
			return 0, err
		}
		if len(p) > writeBufSize {
			if _, err := w.pw.Write(p); err != nil {
				w.err = errClientGone
				return 0, w.err
			}
			return len(p), nil
		}
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// writeBufSize is the response buffer of an in-process handler.
const writeBufSize = 32 << 10

func (w *pipeWriter) flushBuf() error {
	if w.err == nil && w.pw == nil {
		w.err = errClientGone // the caller gave up before the response
	}
	if w.err != nil {
		return w.err
	}
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.pw.Write(w.buf)
	w.buf = w.buf[:0]
	if err != nil {
		w.err = errClientGone
	}
	return w.err
}

// Flush sends the header if it was not sent yet, and what was written.
func (w *pipeWriter) Flush() {
	w.stream()
	w.flushBuf()
}

// FlushError is Flush reporting a gone reader (http.ResponseController
// uses it).
func (w *pipeWriter) FlushError() error {
	w.stream()
	return w.flushBuf()
}

// Hijack is not possible without a connection.
func (w *pipeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, errors.New("backend: in-process response cannot be hijacked")
}

// pipeBody is the response body the caller reads.
type pipeBody struct {
	pr     *io.PipeReader
	cancel context.CancelCauseFunc
}

func (b *pipeBody) Read(p []byte) (int, error) { return b.pr.Read(p) }

func (b *pipeBody) Close() error {
	b.cancel(errClientGone)
	b.pr.CloseWithError(errClientGone)
	return nil
}

// memBody is the whole answer of a handler that returned before it flushed.
type memBody struct {
	data   []byte
	off    int
	cancel context.CancelCauseFunc
}

func (b *memBody) Read(p []byte) (int, error) {
	if b.off >= len(b.data) {
		return 0, io.EOF
	}
	n := copy(p, b.data[b.off:])
	b.off += n
	return n, nil
}

func (b *memBody) Close() error {
	b.cancel(errClientGone)
	return nil
}

// inMemory reports whether body is an in-process handler's whole answer,
// read without waiting on anybody.
func inMemory(body io.ReadCloser) bool {
	if cb, ok := body.(*cancelBody); ok {
		body = cb.ReadCloser
	}
	_, ok := body.(*memBody)
	return ok
}

// readAll reads body to its end, at most n bytes; an in-process handler's
// whole answer is taken as it is, not copied.
func readAll(body io.Reader, n int64) ([]byte, error) {
	if cb, ok := body.(*cancelBody); ok {
		body = cb.ReadCloser
	}
	if mb, ok := body.(*memBody); ok {
		data := mb.data[mb.off:]
		data = data[:min(int64(len(data)), n)]
		mb.off += len(data)
		return data, nil
	}
	return io.ReadAll(io.LimitReader(body, n))
}
