package client

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"time"

	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// streamState is what the client knows of one logical stream (a request's
// stream, or the session's standalone stream) across its connections.
type streamState struct {
	cursor     string // last event ID received; "" means none
	cursorSess string // session ID the cursor was received under
	seen       idSet  // event IDs already handed on, for dedupe
	retry      time.Duration
	reset      bool // a reset event was the last thing seen
	progress   bool // the last connection delivered at least one event
}

// startFresh forgets the cursor and the IDs seen: what comes next is a new
// stream whose IDs may repeat the old ones.
func (st *streamState) startFresh() {
	st.cursor, st.cursorSess = "", ""
	st.seen = idSet{}
	st.reset = false
}

// resumeCursor returns the cursor to send when resuming under session sid,
// or "" and why no cursor may be sent.
func (st *streamState) resumeCursor(sid string) (cursor, why string) {
	switch {
	case st.cursor == "":
		return "", "the server sent no event ID"
	case st.cursorSess != sid:
		return "", "the cursor was received under another session ID"
	case allDigits(st.cursor):
		return "", "bare integer event IDs can collide across server restarts"
	}
	return st.cursor, ""
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// maxSeen bounds the event IDs remembered per stream. A replay starts
// after the cursor, so only a misbehaving server overlaps by more than a
// few events.
const maxSeen = 4096

// idSet is a set of the most recent maxSeen IDs. Its zero value is empty.
type idSet struct {
	m     map[string]struct{}
	order []string
}

// add adds id and reports whether it was new.
func (s *idSet) add(id string) bool {
	if _, ok := s.m[id]; ok {
		return false
	}
	if s.m == nil {
		s.m = make(map[string]struct{})
	}
	if len(s.order) >= maxSeen {
		delete(s.m, s.order[0])
		s.order = s.order[1:]
	}
	s.m[id] = struct{}{}
	s.order = append(s.order, id)
	return true
}

// readStream reads one SSE response body to its end, handing each message
// to the SDK once. intercept, if set, sees each response first and may
// claim it (then reading stops); stop, if set, is asked after each message
// whether to stop reading.
func (c *conn) readStream(body io.ReadCloser, st *streamState, sid string, intercept func(*jsonrpc.Response) bool, stop func() bool) {
	defer body.Close()
	sc := sse.NewScanner(body)
	st.progress = false
	for {
		ev, err := sc.Next()
		if err != nil {
			if err != io.EOF {
				c.log.Debug("stream broken", logSession, sid, logCursor, st.cursor, logErr, err)
			}
			return
		}
		if ev.Retry > 0 {
			st.retry = ev.Retry
		}
		if ev.ID != "" {
			if !st.seen.add(ev.ID) {
				c.log.Debug("dropping an event already delivered", logSession, sid, logCursor, ev.ID)
				continue
			}
			st.cursor, st.cursorSess = ev.ID, sid
			st.progress = true
			st.reset = false
		}
		switch ev.Type {
		case "", "message":
		case resume.EventReset:
			// What follows is complete from here on; nothing before it
			// needs to be kept.
			st.reset, st.progress = true, true
			c.log.Warn("stream reset by the server", logSession, sid, logCursor, st.cursor, "data", string(ev.Data))
			if c.opts.OnReset != nil {
				var r resume.Reset
				if err := json.Unmarshal(ev.Data, &r); err != nil {
					c.log.Warn("a reset event that does not decode", logSession, sid, logCursor, st.cursor, logErr, err)
				} else {
					c.opts.OnReset(r)
				}
			}
			continue
		default:
			continue
		}
		if len(bytes.TrimSpace(ev.Data)) == 0 {
			continue // priming event
		}
		msg, err := jsonrpc.DecodeMessage(ev.Data)
		if err != nil {
			c.log.Warn("dropping an event that is not JSON-RPC", logSession, sid, logCursor, ev.ID, logErr, err)
			continue
		}
		if r, ok := msg.(*jsonrpc.Response); ok && intercept != nil && intercept(r) {
			return
		}
		c.deliver(msg)
		if stop != nil && stop() {
			return
		}
	}
}

// delay returns how long to wait before attempt (1-based) of resuming a
// stream whose server last asked for retry (0: never).
func (c *conn) delay(attempt int, retry time.Duration) time.Duration {
	if retry > 0 && attempt <= 1 {
		return retry
	}
	return max(backoff(attempt, c.opts.MinBackoff, c.opts.MaxBackoff, rand.Float64()), retry)
}

// backoff is capped exponential backoff with jitter: attempt n waits a
// uniformly chosen time in [d/2, d], d = min(lo·2^(n-1), hi); r is in [0, 1).
func backoff(attempt int, lo, hi time.Duration, r float64) time.Duration {
	d := hi
	if attempt < 1 {
		attempt = 1
	}
	if attempt <= 62 {
		if x := lo << (attempt - 1); x > 0 && x < hi {
			d = x
		}
	}
	return d/2 + time.Duration(r*float64(d/2))
}
