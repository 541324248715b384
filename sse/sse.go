// Package sse provides the Server-Sent Events wire format used by mcprelay:
// an allocation-free encoder ([AppendEvent], [AppendComment]) for the relay's
// response streams and a [Scanner] that parses a stream by the WHATWG
// event-stream rules for the client side.
//
// Writing an event:
//
//	buf = sse.AppendEvent(buf[:0], sse.Event{ID: id, Data: msg})
//	w.Write(buf)
//
// Reading a stream:
//
//	sc := sse.NewScanner(resp.Body)
//	for {
//		ev, err := sc.Next()
//		if err != nil {
//			// io.EOF: the stream ended cleanly; io.ErrUnexpectedEOF: it was
//			// cut inside an event, resume with sc.LastEventID().
//			break
//		}
//		handle(ev)
//	}
//
// Unlike a browser's EventSource, the Scanner reports every block that set a
// field, including blocks without data, so a client sees the 2025-11-25
// priming event (an id with empty data) and a bare "retry:" line. An [Event]
// whose fields are all zero is never written by [AppendEvent] (it encodes as
// a lone blank line) and never returned by [Scanner.Next].
//
// A [Scanner] is not safe for concurrent use; the Append functions keep no
// state and may be called from any goroutine.
package sse

import (
	"bytes"
	"errors"
	"strconv"
	"time"
)

// ErrTooLarge is returned by [Scanner.Next] when one event exceeds
// [Scanner.MaxEventBytes].
var ErrTooLarge = errors.New("sse: event too large")

// Event is one Server-Sent Event.
type Event struct {
	ID    string        // "id:" field; "" means no id line was sent/received
	Type  string        // "event:" field; "" means the default type "message"
	Data  []byte        // data lines joined with "\n"; nil means no data line at all
	Retry time.Duration // "retry:" field in milliseconds; 0 means none
}

// AppendEvent appends the wire form of e to dst and returns the extended slice.
//
// It writes, in order: an "id: " line if e.ID != "", an "event: " line if
// e.Type != "", a "retry: " line with the delay in whole milliseconds
// (rounded up, so a positive Retry is never written as 0) if e.Retry > 0,
// one "data: " line per line of e.Data if e.Data != nil, and the blank line
// that ends the event. Lines in Data are split on "\r\n", "\n" and "\r"; an
// empty line is written as a bare "data:", so an empty non-nil Data writes a
// single "data:" line (the 2025-11-25 priming event).
//
// The caller guarantees that e.ID contains no CR, LF or NUL and e.Type no CR
// or LF. AppendEvent does not check or strip them: it cannot report an error
// and sits on the relay's hot path. A line break in either would let the rest
// of the value be read as further fields, and a scanner ignores an id that
// contains NUL. Event IDs minted by the relay and the fixed event types it
// uses satisfy this by construction.
//
// AppendEvent does not allocate when dst has enough capacity.
func AppendEvent(dst []byte, e Event) []byte {
	if e.ID != "" {
		dst = append(dst, "id: "...)
		dst = append(dst, e.ID...)
		dst = append(dst, '\n')
	}
	if e.Type != "" {
		dst = append(dst, "event: "...)
		dst = append(dst, e.Type...)
		dst = append(dst, '\n')
	}
	if e.Retry > 0 {
		ms := int64(e.Retry / time.Millisecond)
		if e.Retry%time.Millisecond != 0 {
			ms++
		}
		dst = append(dst, "retry: "...)
		dst = strconv.AppendInt(dst, ms, 10)
		dst = append(dst, '\n')
	}
	if e.Data != nil {
		rest := e.Data
		for {
			line, next, ok := cutLine(rest)
			dst = appendField(dst, "data:", line)
			if !ok {
				break
			}
			rest = next
		}
	}
	return append(dst, '\n')
}

// AppendComment appends text as a comment followed by a blank line, the form
// used for keep-alives: ": text\n\n" (":\n\n" when text is empty). Text is
// meant to be a single line; if it contains CR or LF anyway, each of its
// lines is written as its own comment line, so a comment can never inject a
// field or end an event early.
func AppendComment(dst []byte, text string) []byte {
	rest := text
	for {
		i := indexLineBreakString(rest)
		if i < 0 {
			dst = appendField(dst, ":", rest)
			break
		}
		dst = appendField(dst, ":", rest[:i])
		if rest[i] == '\r' && i+1 < len(rest) && rest[i+1] == '\n' {
			i++
		}
		rest = rest[i+1:]
	}
	return append(dst, '\n')
}

// appendField appends "name value\n", with a space after name only when
// value is not empty, so that an empty value reads back as empty.
func appendField[T string | []byte](dst []byte, name string, value T) []byte {
	dst = append(dst, name...)
	if len(value) > 0 {
		dst = append(dst, ' ')
		dst = append(dst, value...)
	}
	return append(dst, '\n')
}

// cutLine splits b at its first line break (CRLF, LF or CR). It returns the
// text before the break, the text after it, and whether a break was found.
func cutLine(b []byte) (line, rest []byte, found bool) {
	i := indexLineBreak(b)
	if i < 0 {
		return b, nil, false
	}
	j := i + 1
	if b[i] == '\r' && j < len(b) && b[j] == '\n' {
		j++
	}
	return b[:i], b[j:], true
}

// indexLineBreak returns the index of the first CR or LF in b, or -1.
// Two IndexByte passes beat a byte loop: both are vectorised.
func indexLineBreak(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	head := b
	if i >= 0 {
		head = b[:i]
	}
	if j := bytes.IndexByte(head, '\r'); j >= 0 {
		return j
	}
	return i
}

func indexLineBreakString(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' || s[i] == '\r' {
			return i
		}
	}
	return -1
}
