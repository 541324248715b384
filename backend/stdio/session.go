package stdio

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/mcprelay/mcprelay/backend"
)

// drainWait bounds how long the reader may go on after the child was
// reaped (something else, a grandchild outside the group, may hold the
// pipe): then the connector closes it.
const drainWait = 2 * time.Second

// Session is one child and the session it serves. Its methods are safe for
// concurrent use.
type Session struct {
	c         *Connector
	cmd       *exec.Cmd
	pid       int
	stdin     *os.File
	stdout    *os.File
	stderr    *os.File
	log       *slog.Logger
	unrelated func([]byte)
	lostFn    func(error)

	wmu sync.Mutex // one writer on stdin at a time

	mu         sync.Mutex
	calls      map[int64]*reply  // child-side id → its reply, until answered
	active     map[*reply]bool   // replies with responses still due
	tokens     map[string]*reply // progress tokens of active replies
	err        error             // set once: ErrSessionLost (wrapped) or ErrSessionClosed
	opened     bool              // Open returned the session
	lostLater  bool              // lost before Open returned it: Open calls Lost
	lastStderr string
	status     string // exit status, once reaped

	stopOnce   sync.Once
	readerDone chan struct{}
	stderrDone chan struct{}
	done       chan struct{} // the child was reaped and the session torn down
}

var _ backend.Session = (*Session)(nil)

func newSession(c *Connector, cmd *exec.Cmd, stdin, stdout, stderr *os.File, init backend.Init, log *slog.Logger) *Session {
	return &Session{
		c: c, cmd: cmd, pid: cmd.Process.Pid,
		stdin: stdin, stdout: stdout, stderr: stderr,
		log: log, unrelated: init.Unrelated, lostFn: init.Lost,
		calls:      make(map[int64]*reply),
		active:     make(map[*reply]bool),
		tokens:     make(map[string]*reply),
		readerDone: make(chan struct{}),
		stderrDone: make(chan struct{}),
		done:       make(chan struct{}),
	}
}

// PID is the child's process id (and its process group's).
func (s *Session) PID() int { return s.pid }

// Handle returns "": a child has no name the relay could use after a
// restart.
func (s *Session) Handle() string { return "" }

func (s *Session) run() {
	go s.readStdout()
	go s.readStderr()
	go s.wait()
}

// markOpen records that Open returned the session; from now on a loss is
// reported through Lost.
func (s *Session) markOpen() {
	s.mu.Lock()
	s.opened = true
	later := s.lostLater
	err := s.err
	s.mu.Unlock()
	if later && s.lostFn != nil {
		go s.lostFn(err)
	}
}

func (s *Session) why() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.status
	if w == "" {
		w = "no exit status"
	}
	if s.lastStderr != "" {
		w += "; last stderr line: " + strconv.Quote(s.lastStderr)
	}
	return w
}

// Call sends the client's request, or a batch, to the child with each
// request's id rewritten to one unique in the connector, and returns the
// reply that collects the messages related to it (see the package
// documentation). The ids argument is not needed: the ids are read from
// msg.
func (s *Session) Call(ctx context.Context, msg []byte, _ []json.RawMessage) (backend.Reply, error) {
	r, err := s.call(ctx, msg)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (s *Session) call(ctx context.Context, msg []byte) (*reply, error) {
	parts, err := splitBatch(msg)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	r := &reply{s: s, ids: make(map[int64]json.RawMessage), wake: make(chan struct{}, 1)}
	var buf bytes.Buffer
	for _, p := range parts {
		m, err := parse(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
		}
		if m.isRequest() {
			id := s.c.newID()
			n, _ := strconv.ParseInt(string(id), 10, 64)
			out, old, err := setMember(p, "id", id)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
			}
			r.ids[n] = old
			if tok := progressToken(m.Params, true); tok != nil {
				if k, ok := idKey(tok); ok {
					r.tokens = append(r.tokens, k)
				}
			}
			p = out
		}
		if err := compactLine(&buf, p); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
		}
	}
	if len(r.ids) == 0 {
		return nil, fmt.Errorf("%w: no request with an id", ErrBadRequest)
	}
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.err
	}
	for n := range r.ids {
		s.calls[n] = r
	}
	for _, k := range r.tokens {
		s.tokens[k] = r // a token reused by a later call goes to the later one
	}
	s.active[r] = true
	s.mu.Unlock()
	if err := s.write(ctx, buf.Bytes()); err != nil {
		r.Close()
		return nil, err
	}
	r.ctx = ctx
	r.stop = context.AfterFunc(ctx, func() { r.end(ctx.Err()) })
	return r, nil
}

// Listen implements [backend.Session]: a child's stdout is read from the
// start, so its unrelated messages need nothing more.
func (s *Session) Listen() {}

// Notify sends client notifications and responses to the child unchanged,
// except that notifications/cancelled names the child-side id of each call
// in flight that the client's requestId names.
func (s *Session) Notify(ctx context.Context, msg []byte) error {
	parts, err := splitBatch(msg)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	var buf bytes.Buffer
	for _, p := range parts {
		m, err := parse(p)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadRequest, err)
		}
		if m.Method == "notifications/cancelled" {
			for _, out := range s.cancelled(p, m.Params) {
				if err := compactLine(&buf, out); err != nil {
					return err
				}
			}
			continue
		}
		if err := compactLine(&buf, p); err != nil {
			return fmt.Errorf("%w: %v", ErrBadRequest, err)
		}
	}
	s.mu.Lock()
	err = s.err
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if buf.Len() == 0 {
		return nil
	}
	return s.write(ctx, buf.Bytes())
}

// cancelled rewrites a notifications/cancelled message for each call in
// flight that its requestId names; none if no call does.
func (s *Session) cancelled(msg, params []byte) [][]byte {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil {
		return nil
	}
	want, ok := idKey(p.RequestID)
	if !ok {
		return nil
	}
	var ids []int64
	s.mu.Lock()
	for n, r := range s.calls {
		if k, _ := idKey(r.ids[n]); k == want {
			ids = append(ids, n)
		}
	}
	s.mu.Unlock()
	var out [][]byte
	for _, n := range ids {
		np, _, err := setMember(params, "requestId", strconv.AppendInt(nil, n, 10))
		if err != nil {
			continue
		}
		if b, _, err := setMember(msg, "params", np); err == nil {
			out = append(out, b)
		}
	}
	return out
}

// write writes whole lines to the child. If ctx ends first, nothing
// written means the context's error; part of a line written means a broken
// stream: the session is lost.
func (s *Session) write(ctx context.Context, b []byte) error {
	s.wmu.Lock()
	var dmu sync.Mutex
	writing := true
	stop := context.AfterFunc(ctx, func() {
		dmu.Lock()
		defer dmu.Unlock()
		if writing { // not once the write is over: the next writer's deadline
			s.stdin.SetWriteDeadline(time.Now())
		}
	})
	n, err := s.stdin.Write(b)
	dmu.Lock()
	writing = false
	dmu.Unlock()
	if !stop() { // it ran, or runs and will not set a deadline now
		s.stdin.SetWriteDeadline(time.Time{})
	}
	s.wmu.Unlock()
	if err != nil && ctx.Err() != nil {
		if n == 0 {
			return ctx.Err()
		}
		lost := fmt.Errorf("%w: a write to the child was cut short: %v", backend.ErrSessionLost, ctx.Err())
		s.fail(lost)
		s.stop()
		return lost
	}
	if err != nil {
		s.mu.Lock()
		serr := s.err
		s.mu.Unlock()
		if serr != nil {
			return serr
		}
		return fmt.Errorf("%w: writing to the child: %v", backend.ErrSessionLost, err)
	}
	return nil
}

// Close stops the child (SIGTERM to its process group, SIGKILL after
// StopGrace), waits until it is reaped, and ends the replies in flight with
// ErrSessionClosed. Close is idempotent; Lost is not called.
func (s *Session) Close() error {
	s.fail(ErrSessionClosed)
	s.stop()
	<-s.done
	return nil
}

// fail ends the session with err, once, and every reply in flight with it.
func (s *Session) fail(err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return false
	}
	s.err = err
	for r := range s.active {
		if r.err == nil {
			r.err = err
		}
		r.poke()
	}
	clear(s.calls)
	clear(s.active)
	clear(s.tokens)
	return true
}

// stop closes the child's stdin and sends SIGTERM to its group, then SIGKILL
// after StopGrace unless it was reaped first. It does not wait.
func (s *Session) stop() {
	s.stopOnce.Do(func() {
		s.stdin.Close() // without wmu: it also ends a write the child blocks
		signalGroup(s.cmd.Process, sigTerm)
		go func() {
			t := time.NewTimer(s.c.opts.StopGrace)
			defer t.Stop()
			select {
			case <-s.done:
			case <-t.C:
				s.log.Warn("stdio: child did not stop in time; killing it", "grace", s.c.opts.StopGrace)
				signalGroup(s.cmd.Process, sigKill)
			}
		}()
	})
}

// wait reaps the child and tears the session down.
func (s *Session) wait() {
	waitExited(s.pid)
	// The leader has exited but is not reaped yet: its group id is still
	// reserved, so the rest of the group (if any) can be killed safely.
	signalGroup(s.cmd.Process, sigKill)
	err := s.cmd.Wait()
	status := "exit status 0"
	if err != nil {
		status = err.Error()
	}
	// Give the readers drainWait to reach end of file, then drainWait more
	// once their pipes are closed (a callback of the relay may hold them).
	drained, cancel := context.WithTimeout(context.Background(), drainWait)
	for _, r := range []struct {
		done <-chan struct{}
		f    *os.File
	}{{s.readerDone, s.stdout}, {s.stderrDone, s.stderr}} {
		select {
		case <-r.done:
			continue
		case <-drained.Done():
		}
		r.f.Close()
		t := time.NewTimer(drainWait)
		select {
		case <-r.done:
		case <-t.C:
		}
		t.Stop()
	}
	cancel()
	s.stdout.Close()
	s.stderr.Close()
	s.stdin.Close()

	s.fail(fmt.Errorf("%w: child %s", backend.ErrSessionLost, status))
	s.mu.Lock()
	s.status = status
	err = s.err
	report := !errors.Is(err, ErrSessionClosed) && s.opened
	if !s.opened && !errors.Is(err, ErrSessionClosed) {
		s.lostLater = true
	}
	s.mu.Unlock()
	s.c.released(s)
	s.log.Debug("stdio: child reaped", "status", status)
	close(s.done)
	if report && s.lostFn != nil {
		s.lostFn(err)
	}
}

// readStdout reads the child's messages and routes each to its reply or to
// Unrelated, until the child's stdout ends or breaks the protocol.
func (s *Session) readStdout() {
	defer close(s.readerDone)
	lr := &lineReader{r: bufio.NewReaderSize(s.stdout, 64<<10), max: s.c.opts.MaxMessage}
	var cause error
	for {
		line, err := lr.next()
		if err != nil {
			switch {
			case errors.Is(err, errLineTooLong):
				cause = fmt.Errorf("%w: %w: a line over %d bytes", backend.ErrSessionLost, ErrMessageTooLarge, s.c.opts.MaxMessage)
				s.log.Error("stdio: child broke the protocol; stopping it", "err", cause)
			default:
				cause = fmt.Errorf("%w: child's stdout ended: %v", backend.ErrSessionLost, err)
			}
			break
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if line[0] == '[' { // a batch (2025-03-26): its messages one by one
			if batch, err := splitBatch(line); err == nil {
				for _, m := range batch {
					s.route(m)
				}
				continue
			}
		}
		s.route(line)
	}
	s.fail(cause)
	s.stop()
}

// route delivers one message from the child (see the package doc).
func (s *Session) route(line []byte) {
	m, err := parse(line)
	if err != nil {
		s.log.Warn("stdio: skipped a malformed line from the child", "err", err, "line", clip(line, 256))
		return
	}
	msg := bytes.Clone(line)
	s.mu.Lock()
	var to *reply
	switch {
	case m.isResponse():
		n, err := strconv.ParseInt(string(bytes.TrimSpace(m.ID)), 10, 64)
		r := s.calls[n]
		if err != nil || r == nil {
			s.mu.Unlock()
			s.log.Debug("stdio: dropped a response to no call in flight", "id", string(m.ID))
			return
		}
		out, _, err := setMember(msg, "id", r.ids[n])
		if err != nil {
			s.mu.Unlock()
			s.log.Warn("stdio: skipped a malformed response", "err", err)
			return
		}
		delete(s.calls, n)
		delete(r.ids, n)
		r.queue = append(r.queue, out)
		if len(r.ids) == 0 {
			r.finished = true
			s.forget(r)
		}
		r.poke()
		s.mu.Unlock()
		return
	case m.Method == "notifications/progress":
		if k, ok := idKey(progressToken(m.Params, false)); ok {
			to = s.tokens[k]
		}
	case m.isRequest() || m.Method == "notifications/message":
		if len(s.active) == 1 {
			for r := range s.active {
				to = r
			}
		}
	}
	if to != nil {
		to.queue = append(to.queue, msg)
		to.poke()
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	if s.unrelated != nil {
		s.unrelated(msg)
	}
}

// forget removes r from the calls in flight; s.mu is held.
func (s *Session) forget(r *reply) {
	for n := range r.ids {
		delete(s.calls, n)
	}
	for _, k := range r.tokens {
		if s.tokens[k] == r {
			delete(s.tokens, k)
		}
	}
	delete(s.active, r)
}

func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// reply is the stream of one Call's related messages.
type reply struct {
	s        *Session
	ctx      context.Context           // the call's: once done, the reply is abandoned
	ids      map[int64]json.RawMessage // child-side id → client's id, until answered
	tokens   []string
	wake     chan struct{}
	stop     func() bool
	queue    [][]byte // guarded by s.mu, like the fields below
	finished bool     // every response came
	err      error    // the reply ended before that
}

func (r *reply) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Next returns the call's next message; io.EOF after the responses to all
// its requests; ErrSessionLost (wrapped) when the child is gone,
// ErrSessionClosed after Close, the context's error once the call's
// context is done.
func (r *reply) Next() ([]byte, error) {
	for {
		if err := r.ctx.Err(); err != nil {
			// Abandoned: whatever the child sent, even the response,
			// is not for the caller any more.
			return nil, err
		}
		r.s.mu.Lock()
		if m, ok := r.popLocked(); ok {
			r.s.mu.Unlock()
			return m, nil
		}
		err, fin := r.err, r.finished
		r.s.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if fin {
			return nil, io.EOF
		}
		<-r.wake
	}
}

// TryNext returns the call's next message if the child has sent it
// already (backend.Buffered).
func (r *reply) TryNext() ([]byte, bool) {
	if r.ctx.Err() != nil {
		return nil, false // Next says so
	}
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.popLocked()
}

// popLocked takes the first queued message; r.s.mu is held.
func (r *reply) popLocked() ([]byte, bool) {
	if len(r.queue) == 0 {
		return nil, false
	}
	m := r.queue[0]
	r.queue[0] = nil
	r.queue = r.queue[1:]
	return m, true
}

var errReplyClosed = errors.New("stdio: reply closed")

// end abandons the reply with err (unless it already ended).
func (r *reply) end(err error) {
	r.s.mu.Lock()
	if r.err == nil && !r.finished {
		r.err = err
	}
	r.s.forget(r)
	r.s.mu.Unlock()
	r.poke()
}

// Close abandons the reply: responses still due to it are dropped.
func (r *reply) Close() error {
	if r.stop != nil {
		r.stop()
	}
	r.end(errReplyClosed)
	return nil
}
