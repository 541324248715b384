package sse

import (
	"bytes"
	"errors"
	"io"
	"math"
	"time"
)

const (
	defaultMaxEventBytes = 4 << 20
	initialBufSize       = 512      // an idle stream (one per session, upstream) stays this small
	busyBufSize          = 64 << 10 // a stream whose reads fill the buffer grows to this
	maxEmptyReads        = 100      // as bufio: a reader that keeps returning 0, nil is broken
	// maxRetryMillis keeps retry*time.Millisecond inside a time.Duration.
	maxRetryMillis = int64(1<<63-1) / int64(time.Millisecond)
)

var bom = []byte("\xEF\xBB\xBF")

// Scanner reads events from an SSE stream, following the WHATWG event-stream
// parsing rules (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):
// an optional leading UTF-8 BOM is skipped; lines end in CRLF, LF or CR (a CR
// at the end of one read followed by LF at the start of the next is one line
// ending); "field: value" has exactly one optional space removed after the
// colon; a line with no colon is a field with an empty value; lines starting
// with ":" are comments; unknown fields are ignored; an "id" value containing
// NUL is ignored; "retry" is applied only if it is one or more ASCII digits;
// a blank line dispatches the event.
//
// Departures from a browser, each deliberate: every block that set a field is
// returned, with or without data; a "retry" of 0 or one too large for a
// [time.Duration] is ignored (0 means "none" in [Event]); a block whose only
// effect is a bare "id:" line (which clears the last event ID) updates
// [Scanner.LastEventID] but is not returned, because its Event would be all
// zero.
//
// A Scanner reads through its own buffer; it does not allocate per line, and
// allocates per event only the copy of Data and, when they change, ID (not
// with SkipEventIDs) and Type. It is not safe for concurrent use.
type Scanner struct {
	// MaxEventBytes bounds one event as read from the wire: the total length
	// of its lines (field names and values, comments and unknown fields
	// included, line endings excluded). A stream that exceeds it gets
	// ErrTooLarge. Zero or negative means 4 MiB.
	// Set it before the first call to Next.
	MaxEventBytes int
	// SkipEventIDs leaves Event.ID empty; LastEventID still reports the
	// last event ID, and a block that set only an id is still returned
	// (as an empty Event). A reader that needs the ID only to resume,
	// from LastEventID once the stream ended, then costs no string per
	// event.
	SkipEventIDs bool

	rd   io.Reader
	buf  []byte
	r, w int   // buf[r:w] holds unread bytes
	scan int   // buf[r:r+scan] is known to hold no CR or LF
	rerr error // error from rd, reported once buf is drained

	started bool // BOM check and limit setup done
	filled  bool // the last read filled the buffer
	skipLF  bool // the last line ended in CR: a following LF belongs to it
	max     int

	// The event being assembled.
	inBlock    bool // a field line was seen since the last blank line
	blockBytes int  // bytes of lines since the last blank line
	data       []byte
	hasData    bool
	id         []byte
	hasID      bool
	typ        []byte
	retry      time.Duration

	lastID   []byte // last event ID, committed at each dispatch
	lastStr  string // lastID as a string, when not stale
	stale    bool   // lastID changed since lastStr was made
	lastType string // previous Type, reused to avoid an allocation
	err      error  // sticky
}

// NewScanner returns a Scanner that reads from r.
func NewScanner(r io.Reader) *Scanner {
	return &Scanner{rd: r}
}

// LastEventID returns the last event ID: the value of the most recent valid
// "id" field in a block that has been dispatched (WHATWG's "last event ID"),
// including blocks without data. An id seen in an event that was cut before
// its blank line does not count, so resuming from LastEventID never skips
// that event.
func (s *Scanner) LastEventID() string {
	if s.stale {
		s.lastStr, s.stale = string(s.lastID), false
	}
	return s.lastStr
}

// Next returns the next event. It returns every dispatched block that set at
// least one of id, event, data or retry. Event.Data is nil when the block had
// no data line, and a fresh copy otherwise.
//
// At a clean end of input Next returns io.EOF. If the input ends inside an
// event (a field line, or part of one, seen since the last blank line) it
// returns io.ErrUnexpectedEOF; a stream cut inside a comment ends cleanly.
// Errors from the underlying reader are returned as they are. Once Next has
// returned an error it returns the same error on every later call.
func (s *Scanner) Next() (Event, error) {
	if s.err != nil {
		return Event{}, s.err
	}
	if !s.started {
		s.start()
	}
	for {
		line, err := s.readLine()
		if err != nil {
			if err == io.EOF && s.inBlock {
				err = io.ErrUnexpectedEOF
			}
			s.err = err
			return Event{}, err
		}
		if len(line) == 0 {
			if ev, ok := s.dispatch(); ok {
				return ev, nil
			}
			continue
		}
		s.processLine(line)
	}
}

func (s *Scanner) start() {
	s.started = true
	s.max = s.MaxEventBytes
	if s.max <= 0 {
		s.max = defaultMaxEventBytes
	}
	s.max = min(s.max, math.MaxInt-1) // so that max+1, the longest line with its ending, fits
	s.buf = make([]byte, min(initialBufSize, s.max+1))
	// Skip a leading BOM, which may arrive split over several reads.
	for s.w-s.r < len(bom) && bytes.HasPrefix(bom, s.buf[s.r:s.w]) && s.rerr == nil {
		s.fill()
	}
	if bytes.HasPrefix(s.buf[s.r:s.w], bom) {
		s.r += len(bom)
	}
}

// readLine returns the next line without its line ending. The line aliases
// the buffer and is valid until the next call. At the end of input it returns
// the reader's error; an unterminated last line is discarded (WHATWG), but
// marks the block as cut unless it is a comment.
func (s *Scanner) readLine() ([]byte, error) {
	for {
		if s.skipLF && s.r < s.w {
			if s.buf[s.r] == '\n' {
				s.r++
			}
			s.skipLF = false
		}
		b := s.buf[s.r:s.w]
		if i := indexLineBreak(b[s.scan:]); i >= 0 {
			i += s.scan
			line := b[:i]
			s.r += i + 1
			s.scan = 0
			s.skipLF = b[i] == '\r'
			if len(line) > s.max-s.blockBytes {
				return nil, ErrTooLarge
			}
			return line, nil
		}
		s.scan = len(b)
		if len(b) > s.max-s.blockBytes {
			return nil, ErrTooLarge
		}
		if s.rerr != nil {
			if len(b) > 0 && b[0] != ':' {
				s.inBlock = true
			}
			s.r, s.scan = s.w, 0
			return nil, s.rerr
		}
		s.fill()
	}
}

// fill reads more input into the buffer, compacting or growing it first. It
// records a read error in s.rerr.
func (s *Scanner) fill() {
	if s.r > 0 {
		copy(s.buf, s.buf[s.r:s.w])
		s.w -= s.r
		s.r = 0
	}
	if s.w == len(s.buf) || (s.filled && len(s.buf) < busyBufSize) {
		// readLine has checked that a line this long is still allowed, so
		// max+1 (the longest line plus its ending) is always larger.
		n := min(2*len(s.buf), s.max+1)
		buf := make([]byte, n)
		copy(buf, s.buf[:s.w])
		s.buf = buf
	}
	// The buffer has room here: readLine fails a partial line longer than
	// max before asking for more, so Read never gets an empty slice.
	for range maxEmptyReads {
		n, err := s.rd.Read(s.buf[s.w:])
		if n < 0 || n > len(s.buf)-s.w {
			s.rerr = errBadRead
			return
		}
		s.w += n
		// A read that fills the buffer means a busy stream: grow before the
		// next read, up to busyBufSize. Idle streams keep a small buffer.
		s.filled = s.w == len(s.buf)
		if err != nil {
			s.rerr = err
			return
		}
		if n > 0 {
			return
		}
	}
	s.rerr = io.ErrNoProgress
}

var errBadRead = errors.New("sse: reader returned an invalid count")

// processLine applies one non-blank line to the event being assembled.
func (s *Scanner) processLine(line []byte) {
	s.blockBytes += len(line)
	if line[0] == ':' {
		return
	}
	s.inBlock = true
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
		if s.hasData {
			s.data = append(s.data, '\n')
		}
		s.data = append(s.data, value...)
		s.hasData = true
	case "event":
		s.typ = append(s.typ[:0], value...)
	case "id":
		if bytes.IndexByte(value, 0) < 0 {
			s.id = append(s.id[:0], value...)
			s.hasID = true
		}
	case "retry":
		if d, ok := parseRetry(value); ok {
			s.retry = d
		}
	}
}

// parseRetry parses a retry value of one or more ASCII digits, in
// milliseconds. It rejects values that overflow a time.Duration. Zero is
// accepted and reads as "no retry", which is what Event makes of it.
func parseRetry(v []byte) (time.Duration, bool) {
	if len(v) == 0 {
		return 0, false
	}
	var ms int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		ms = ms*10 + int64(c-'0')
		if ms > maxRetryMillis {
			return 0, false
		}
	}
	return time.Duration(ms) * time.Millisecond, true
}

// dispatch ends the current block and reports its event, if it has one.
func (s *Scanner) dispatch() (Event, bool) {
	var ev Event
	hasID := s.hasID && len(s.id) > 0
	if s.hasID {
		if !bytes.Equal(s.id, s.lastID) {
			s.lastID, s.stale = append(s.lastID[:0], s.id...), true
		}
		if !s.SkipEventIDs {
			ev.ID = s.LastEventID()
		}
	}
	if len(s.typ) > 0 {
		if string(s.typ) != s.lastType {
			s.lastType = string(s.typ)
		}
		ev.Type = s.lastType
	}
	if s.hasData {
		ev.Data = make([]byte, len(s.data))
		copy(ev.Data, s.data)
	}
	ev.Retry = s.retry

	s.inBlock, s.blockBytes = false, 0
	s.data, s.hasData = s.data[:0], false
	s.id, s.hasID = s.id[:0], false
	s.typ = s.typ[:0]
	s.retry = 0
	return ev, hasID || ev.Type != "" || ev.Data != nil || ev.Retry != 0
}
