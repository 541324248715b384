package eventlog

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Sentinel errors returned by every store. Compare with [errors.Is].
var (
	ErrNotFound = errors.New("eventlog: not found")
	ErrExists   = errors.New("eventlog: already exists")
	ErrTerminal = errors.New("eventlog: stream is terminal")
	// ErrUnavailable is wrapped by the errors of a store that cannot write
	// now (its disk is full or failed): retry later (HTTP 503). Reads may
	// still be served.
	ErrUnavailable = errors.New("eventlog: store unavailable")
	// ErrFenced is returned by a store shared by several relay replicas
	// when a write comes from a writer that no longer owns the session:
	// another replica has taken the session over since. The writer must
	// stop serving the session (and may forward its clients to the new
	// owner); retrying cannot succeed. Stores that are not shared never
	// return it.
	ErrFenced = errors.New("eventlog: fenced: the session is owned by another writer")
)

// Errors for invalid arguments and use after Close. They report programming
// errors, not conditions callers are expected to branch on.
var (
	errEmptyID       = errors.New("eventlog: empty session ID")
	errEmptyKey      = errors.New("eventlog: empty stream key")
	errEmptyTerminal = errors.New("eventlog: terminal append without events")
	errClosed        = errors.New("eventlog: store is closed")
)

// Session is a relay session's durable record.
type Session struct {
	ID               string
	Principal        string            // hash of the identity the session is bound to ("" = anonymous)
	ProtocolVersion  string            // negotiated protocol version
	InitializeParams json.RawMessage   // the client's initialize params, replayed when the backend is re-created
	Incarnation      uint64            // grows by one each time the backend side is re-created; starts at 1
	Upstream         string            // the backend's own session handle (its Mcp-Session-Id), may be ""
	Replay           []json.RawMessage // state-setting requests (logging/setLevel, resources/subscribe) to replay on re-creation, oldest first
	Created          time.Time
	// LastUsed is when a request last used the session, as last recorded
	// (the relay records it at most every few minutes); zero means Created.
	// A session idle past the relay's timeout is not restored.
	LastUsed time.Time
	// Listening is set once a client of the session opened a GET stream:
	// from then on every incarnation of its backend session receives the
	// backend's unrelated messages (see the relay's design document, When
	// the backend's GET stream is open). It is never cleared.
	Listening bool
}

// LastUse is when the session was last used as its record says: LastUsed,
// or Created if LastUsed is zero. Zero means the record does not say (it
// is never idle).
func (s *Session) LastUse() time.Time {
	if s.LastUsed.IsZero() {
		return s.Created
	}
	return s.LastUsed
}

// IdleSince reports whether the record says the session was last used
// before t (LastUse is not zero and before t). Stores that list idle
// sessions (an IdleSessions method) list those.
func (s *Session) IdleSince(t time.Time) bool {
	u := s.LastUse()
	return !u.IsZero() && u.Before(t)
}

// Stream is a stream's record. FirstSeq, LastSeq and Terminal are maintained
// by the store; they are ignored by [Log.CreateStream].
type Stream struct {
	Key        string          // opaque, non-empty, unique, minted by the caller
	Session    string          // owning session
	Generation uint64          // incarnation that produced the stream
	RequestID  json.RawMessage // JSON-RPC id of the request this stream answers; nil for the standalone stream
	FirstSeq   uint64          // lowest retained seq; LastSeq+1 when none retained (so 1 for a new stream)
	LastSeq    uint64          // highest seq appended; 0 if none
	Terminal   bool            // the last appended event carried the terminal marker
}

// Event is one logged SSE event. Seq is assigned by the store on Append.
//
// The store keeps Data as given, without copying: callers must not modify
// Data after passing it to Append, and must not modify the Data of events
// returned by Read.
type Event struct {
	Seq  uint64
	Type string // SSE event type; "" for an ordinary JSON-RPC message, "reset" for the relay's reset signal
	Data []byte // the message bytes
}

// Retention bounds what a store keeps. Every store's constructor takes one.
// Zero (or negative) fields take the defaults.
type Retention struct {
	MaxEvents     int           // per session, across all its streams; default 10000
	MaxBytes      int64         // per session, sum of len(Data); default 8 MiB
	TerminalGrace time.Duration // how long a terminal stream is kept after its terminal event; default 5m
}

// Retention defaults.
const (
	defaultMaxEvents     = 10000
	defaultMaxBytes      = 8 << 20
	defaultTerminalGrace = 5 * time.Minute
)

// withDefaults returns r with zero or negative fields replaced by the defaults.
func (r Retention) withDefaults() Retention {
	if r.MaxEvents <= 0 {
		r.MaxEvents = defaultMaxEvents
	}
	if r.MaxBytes <= 0 {
		r.MaxBytes = defaultMaxBytes
	}
	if r.TerminalGrace <= 0 {
		r.TerminalGrace = defaultTerminalGrace
	}
	return r
}

// Sessions stores session records. Implementations are safe for concurrent use.
type Sessions interface {
	// CreateSession stores a copy of s. It returns ErrExists if s.ID is taken.
	CreateSession(ctx context.Context, s *Session) error
	// Session returns a copy of the record; ErrNotFound if unknown.
	Session(ctx context.Context, id string) (*Session, error)
	// UpdateSession replaces the record with ID s.ID by a copy of s; ErrNotFound if unknown.
	UpdateSession(ctx context.Context, s *Session) error
	// DeleteSession removes the record and all its streams and events; ErrNotFound if unknown.
	DeleteSession(ctx context.Context, id string) error
}

// Log stores streams and their events. Implementations are safe for
// concurrent use; a stream has at most one appender at a time, but readers
// run concurrently with it.
type Log interface {
	// CreateStream stores a new stream with no events (FirstSeq 1, LastSeq 0).
	// The session must exist (ErrNotFound); ErrExists if the key is taken.
	CreateStream(ctx context.Context, s *Stream) error
	// Append assigns consecutive Seqs (LastSeq+1, ...) to events, setting
	// events[i].Seq, stores them and returns the new LastSeq. A store that
	// may have lost acknowledged events in a crash starts the first append
	// after it above every seq it may have handed out before (LastSeq
	// reports what it holds), so a seq never names two events; Read then
	// skips the seqs in between. terminal marks
	// the last of them as the terminal event. ErrTerminal if the stream is
	// already terminal; ErrNotFound if unknown.
	//
	// Append may evict the session's oldest events (never another session's)
	// to stay within Retention. Events appended by the call are evicted by
	// it only when the batch alone exceeds the budget; the newest event is
	// always kept, even if it alone exceeds the budget.
	Append(ctx context.Context, key string, terminal bool, events ...Event) (uint64, error)
	// Read returns the stream's current record and up to max retained
	// events with Seq > after, in order, appended to buf[:0] (buf may be
	// nil; max <= 0 returns no events). If after+1 < FirstSeq the caller has
	// a hole; Read then returns events from FirstSeq. Read is O(log n + k).
	Read(ctx context.Context, key string, after uint64, max int, buf []Event) (Stream, []Event, error)
	// Streams lists the session's streams in any order. An unknown session
	// has no streams: the result is empty and the error nil.
	Streams(ctx context.Context, session string) ([]Stream, error)
}

// SessionSummary is a session's record and what a store retains for it,
// as listed by stores that can list their sessions (a ListSessions method,
// implemented by the memory and disk stores; the Redis store has no index
// of its sessions to list them from, short of scanning every key).
type SessionSummary struct {
	Session
	Streams int   // streams held: live, or finished and within TerminalGrace
	Events  int   // events retained, across its streams
	Bytes   int64 // bytes of event data (sum of len(Data)) retained
}

// Stores may also list the sessions their records say are idle, with a
// method
//
//	IdleSessions(ctx context.Context, before time.Time, limit int) ([]string, error)
//
// returning up to limit IDs (limit > 0) of sessions whose record is
// IdleSince(before), in any order. The relay removes with it the sessions
// nobody will come back for: those of a process that stopped or died,
// whose clients never resumed. All three stores here implement it; a
// session may be listed that was used or deleted meanwhile, so the caller
// reads the record again before acting.
//
// And they may record a session's use without rewriting its record:
//
//	TouchSession(ctx context.Context, id string, at time.Time) error
//
// makes the record's LastUsed at if that is later, leaves the rest as it
// is, and is not fenced, so that a replica serving the session's streams
// without owning it records uses too; ErrNotFound if the session is
// unknown. All three stores here implement it.

// Store is both, plus Close.
type Store interface {
	Sessions
	Log
	// Close releases the store's resources. Calls after Close fail.
	Close() error
}

// cloneSession returns a deep copy of s.
func cloneSession(s *Session) Session {
	c := *s
	c.InitializeParams = cloneBytes(s.InitializeParams)
	if s.Replay != nil {
		c.Replay = make([]json.RawMessage, len(s.Replay))
		for i, r := range s.Replay {
			c.Replay[i] = cloneBytes(r)
		}
	}
	return c
}

// cloneBytes is bytes.Clone for json.RawMessage, keeping nil as nil.
func cloneBytes(b json.RawMessage) json.RawMessage {
	if b == nil {
		return nil
	}
	return append(json.RawMessage{}, b...)
}
