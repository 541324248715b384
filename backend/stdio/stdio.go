package stdio

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcprelay/mcprelay/backend"
)

// Sentinel errors.
var (
	// ErrNoCommand: Options.Command is empty.
	ErrNoCommand = errors.New("stdio: no command")
	// ErrClosed: the connector was closed.
	ErrClosed = errors.New("stdio: connector closed")
	// ErrTooManyChildren: MaxChildren children are running (wrapped in a
	// *backend.UnavailableError).
	ErrTooManyChildren = errors.New("stdio: too many children")
	// ErrStartFailing: the command keeps exiting before it answers
	// initialize and the connector is backing off (wrapped in a
	// *backend.UnavailableError whose message has the last exit status and
	// stderr line).
	ErrStartFailing = errors.New("stdio: command keeps failing at start")
	// ErrSessionClosed: the session was closed with Close (returned by
	// Call, Notify and the replies it ended).
	ErrSessionClosed = errors.New("stdio: session closed")
	// ErrBadRequest: Open's initialize request or a Call's message is not
	// a JSON-RPC request with an id.
	ErrBadRequest = errors.New("stdio: not a JSON-RPC request")
	// ErrMessageTooLarge: the child wrote a line longer than MaxMessage;
	// the session is lost (the error wraps backend.ErrSessionLost).
	ErrMessageTooLarge = errors.New("stdio: message too large")
)

// Options configures a [Connector]. Only Command is required.
type Options struct {
	// Command is the program and its arguments, run once per session. It
	// is looked up in PATH when it has no slash.
	Command []string

	// Env holds K=V entries added to the relay's own environment for the
	// child (a later entry wins over an earlier one and over the relay's).
	Env []string

	// Dir is the child's working directory; "" means the relay's.
	Dir string

	// MaxChildren bounds the children running at once; beyond it Open
	// returns an error wrapping *backend.UnavailableError (RetryAfter 1s)
	// and ErrTooManyChildren. 0 means 64.
	MaxChildren int

	// StopGrace is how long a stopped child has between SIGTERM and
	// SIGKILL. 0 means 5s.
	StopGrace time.Duration

	// StartBackoff paces restarts of a command that exits before it
	// answers initialize.
	StartBackoff Backoff

	// MaxMessage bounds one message (one line) from the child, in bytes; a
	// longer line breaks the protocol and loses the session. 0 means 16 MiB.
	MaxMessage int

	// Logger receives the connector's own records (children started and
	// stopped, backoff). Each session's records, its child's stderr among
	// them, go to backend.Init.Logger. Nil discards them.
	Logger *slog.Logger
}

// Backoff is an exponential backoff: after the n-th consecutive failure
// Open refuses to start the command for min(Min·2^(n-1), Max).
type Backoff struct {
	Min time.Duration // 0 means 250ms
	Max time.Duration // 0 means 30s
}

// Defaults of [Options] fields left zero.
const (
	DefaultMaxChildren = 64
	DefaultStopGrace   = 5 * time.Second
	DefaultBackoffMin  = 250 * time.Millisecond
	DefaultBackoffMax  = 30 * time.Second
	DefaultMaxMessage  = 16 << 20
)

// retryFull is the RetryAfter of an Open refused for MaxChildren.
const retryFull = time.Second

// Connector is a [backend.Connector] that runs one stdio MCP server child
// per session. It does not implement [backend.Stateless].
type Connector struct {
	opts   Options
	log    *slog.Logger
	env    []string
	nextID atomic.Int64 // child-side request ids, unique in the connector

	mu       sync.Mutex
	closed   bool
	sessions map[*Session]struct{}
	children int            // spawned and not yet reaped
	live     sync.WaitGroup // one per child not yet reaped
	fails    int            // consecutive start failures
	retryAt  time.Time      // no start before
	lastFail string         // exit status and last stderr line of the last failure
	probing  bool           // after failures, one start at a time
}

var _ backend.Connector = (*Connector)(nil)

// New returns a connector for opts.
func New(opts Options) (*Connector, error) {
	if len(opts.Command) == 0 || opts.Command[0] == "" {
		return nil, ErrNoCommand
	}
	for _, kv := range opts.Env {
		if k, _, ok := cut(kv); !ok || k == "" {
			return nil, fmt.Errorf("stdio: Env entry %q is not K=V", kv)
		}
	}
	if opts.MaxChildren <= 0 {
		opts.MaxChildren = DefaultMaxChildren
	}
	if opts.StopGrace <= 0 {
		opts.StopGrace = DefaultStopGrace
	}
	if opts.StartBackoff.Min <= 0 {
		opts.StartBackoff.Min = DefaultBackoffMin
	}
	if opts.StartBackoff.Max <= 0 {
		opts.StartBackoff.Max = DefaultBackoffMax
	}
	if opts.StartBackoff.Max < opts.StartBackoff.Min {
		opts.StartBackoff.Max = opts.StartBackoff.Min
	}
	if opts.MaxMessage <= 0 {
		opts.MaxMessage = DefaultMaxMessage
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts.Command = append([]string(nil), opts.Command...)
	env := append(os.Environ(), opts.Env...)
	return &Connector{opts: opts, log: log, env: env, sessions: make(map[*Session]struct{})}, nil
}

func cut(kv string) (k, v string, ok bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return kv, "", false
}

// Children returns the number of children running or being started (not
// yet reaped).
func (c *Connector) Children() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.children
}

// Discard does nothing: a child does not outlive the relay's process.
func (c *Connector) Discard(context.Context, string) error { return nil }

// Close stops every child (SIGTERM, SIGKILL after StopGrace), waits until
// all are reaped, and makes later Opens fail with ErrClosed. Close is
// idempotent.
func (c *Connector) Close() error {
	c.mu.Lock()
	c.closed = true
	ss := make([]*Session, 0, len(c.sessions))
	for s := range c.sessions {
		ss = append(ss, s)
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Go(func() { s.Close() })
	}
	wg.Wait()
	c.live.Wait()
	return nil
}

// reserve takes a child slot, or says why not.
func (c *Connector) reserve() (probe bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false, ErrClosed
	}
	if c.fails > 0 {
		if wait := time.Until(c.retryAt); wait > 0 {
			return false, &backend.UnavailableError{RetryAfter: wait,
				Err: fmt.Errorf("%w (%d in a row; last: %s)", ErrStartFailing, c.fails, c.lastFail)}
		}
		if c.probing {
			return false, &backend.UnavailableError{RetryAfter: c.opts.StartBackoff.Min,
				Err: fmt.Errorf("%w (%d in a row; last: %s); a start is being tried", ErrStartFailing, c.fails, c.lastFail)}
		}
		c.probing, probe = true, true
	}
	if c.children >= c.opts.MaxChildren {
		c.probing = c.probing && !probe
		return false, &backend.UnavailableError{RetryAfter: retryFull,
			Err: fmt.Errorf("%w (%d running)", ErrTooManyChildren, c.children)}
	}
	c.children++
	c.live.Add(1)
	return probe, nil
}

// released is called once per reserved slot, when its child is reaped or
// failed to start.
func (c *Connector) released(s *Session) {
	c.mu.Lock()
	c.children--
	if s != nil {
		delete(c.sessions, s)
	}
	c.mu.Unlock()
	c.live.Done()
}

// Outcomes of a start, for started.
const (
	startOK      = iota // the child answered initialize
	startFailed         // it could not start or exited before answering
	startUnknown        // Open gave up first (its context ended)
)

// started records the outcome of a start; why says why it failed.
func (c *Connector) started(probe bool, outcome int, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if probe {
		c.probing = false
	}
	switch outcome {
	case startOK:
		c.fails = 0
		return
	case startUnknown:
		return
	}
	c.fails++
	d := c.opts.StartBackoff.Min
	for i := 1; i < c.fails && d < c.opts.StartBackoff.Max; i++ {
		d *= 2
	}
	d = min(d, c.opts.StartBackoff.Max)
	c.retryAt = time.Now().Add(d)
	c.lastFail = why
	c.log.Warn("stdio: command failed at start; backing off", "command", c.opts.Command[0],
		"failures", c.fails, "backoff", d, "why", why)
}

func (c *Connector) backoffLeft() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(time.Until(c.retryAt), 0)
}

// Open starts a child, sends it the client's initialize request (its id
// rewritten) and returns the session and the child's response under the
// client's id. A child that exits before it answers counts as a failed
// start: Open returns an error wrapping *backend.UnavailableError and
// ErrStartFailing, and later Opens are refused during the backoff.
func (c *Connector) Open(ctx context.Context, init backend.Init) (backend.Session, []byte, error) {
	m, err := parse(init.Request)
	if err != nil || !m.isRequest() {
		return nil, nil, fmt.Errorf("%w: initialize: %v", ErrBadRequest, err)
	}
	probe, err := c.reserve()
	if err != nil {
		return nil, nil, err
	}
	s, err := c.spawn(init)
	if errors.Is(err, ErrClosed) {
		return nil, nil, err
	}
	if err != nil {
		c.started(probe, startFailed, err.Error())
		return nil, nil, &backend.UnavailableError{RetryAfter: c.backoffLeft(), Err: fmt.Errorf("%w: %w", ErrStartFailing, err)}
	}
	r, err := s.call(ctx, init.Request)
	var resp []byte
	if err == nil {
		resp, err = r.Next()
		for err == nil && !isResponse(resp) { // nothing but the response is expected before it
			s.log.Debug("stdio: dropped a message sent before the initialize response", "msg", string(resp))
			resp, err = r.Next()
		}
		r.Close()
	}
	switch {
	case err == nil:
		c.started(probe, startOK, "")
		var res struct {
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(resp, &res) == nil && res.Error != nil {
			s.Close()
			return nil, resp, nil
		}
		s.markOpen()
		return s, resp, nil
	case errors.Is(err, backend.ErrSessionLost):
		s.Close() // already exiting: reap it and collect its exit status
		why := s.why()
		c.started(probe, startFailed, why)
		return nil, nil, &backend.UnavailableError{RetryAfter: c.backoffLeft(),
			Err: fmt.Errorf("%w: exited before answering initialize: %s", ErrStartFailing, why)}
	default:
		c.started(probe, startUnknown, "")
		s.Close()
		return nil, nil, fmt.Errorf("stdio: initialize: %w", err)
	}
}

func isResponse(b []byte) bool {
	m, err := parse(b)
	return err == nil && m.isResponse()
}

// spawn starts a child and its session's goroutines; its slot is reserved.
func (c *Connector) spawn(init backend.Init) (*Session, error) {
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		stdinW.Close()
		c.released(nil)
		return nil, err
	}
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		stdinW.Close()
		stdoutR.Close()
		stdoutW.Close()
		c.released(nil)
		return nil, err
	}
	cmd := exec.Command(c.opts.Command[0], c.opts.Command[1:]...)
	cmd.Env = c.env
	cmd.Dir = c.opts.Dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, stdoutW, stderrW
	cmd.SysProcAttr = sysProcAttr()
	err = startCmd(cmd)
	stdinR.Close()
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		stderrR.Close()
		c.released(nil)
		return nil, err
	}
	log := init.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("pid", cmd.Process.Pid)
	s := newSession(c, cmd, stdinW, stdoutR, stderrR, init, log)
	c.mu.Lock()
	c.sessions[s] = struct{}{}
	closed := c.closed
	c.mu.Unlock()
	c.log.Debug("stdio: child started", "pid", cmd.Process.Pid, "command", c.opts.Command[0])
	s.run()
	if closed { // Close ran between reserve and now
		s.Close()
		return nil, ErrClosed
	}
	return s, nil
}

func (c *Connector) newID() []byte {
	return strconv.AppendInt(nil, c.nextID.Add(1), 10)
}
