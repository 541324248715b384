package resume

import (
	"errors"
	"net/http"
)

// Session is the resolved session; nil in Input means unknown, expired,
// deleted or bound to another principal.
type Session struct {
	ID          string
	Incarnation uint64 // current incarnation (generation) of the session's backend
}

// Stream is the state of the stream the cursor names, as the event log holds it.
type Stream struct {
	Session    string // owning session ID
	Generation uint64 // the incarnation that produced it; < Session.Incarnation means sealed by a generation change
	Standalone bool   // the session's GET stream (false: a request stream)
	FirstSeq   uint64 // lowest retained seq; LastSeq+1 when nothing is retained
	LastSeq    uint64 // highest seq appended; 0 if none
	Terminal   bool   // LastSeq carries the terminal marker (final response written)
}

// Input is everything Decide looks at.
type Input struct {
	HasSessionHeader bool
	Session          *Session
	Cursor           Cursor  // valid only when CursorErr == nil
	CursorErr        error   // result of Codec.Parse on Last-Event-ID
	Stream           *Stream // nil: the cursor's stream is unknown to the log (expired or never existed)
}

// Next says what happens to the response after the decision's replay and resets.
type Next int

const (
	End               Next = iota // after what the decision says to send, end the response
	Live                          // keep the response open and deliver new events of this stream as they come
	CurrentStandalone             // switch to the session's current standalone stream, live (row 6 on a standalone stream)
)

// String returns the name of the constant, for logs and test failures.
func (n Next) String() string {
	switch n {
	case End:
		return "End"
	case Live:
		return "Live"
	case CurrentStandalone:
		return "CurrentStandalone"
	}
	return "Next(?)"
}

// Reset reasons, sent in an SSE "reset" event (DESIGN.md §3).
const (
	resetUnknownStream     = "unknown_stream"
	resetGap               = "gap"
	resetGenerationChanged = "generation_changed"
)

// Decision is the answer to one resume request. A client receives, in order:
// the Status; an SSE reset with ResetBefore if set; the retained events of
// the stream with Seq > From if Replay; a reset with ResetAfter if set; and
// then whatever Then says.
type Decision struct {
	Row         int    // 1..10 as numbered in DESIGN.md §3
	Status      int    // HTTP status: 400, 404, 409, 204 or 200
	Reason      string // for metrics and logs
	ResetBefore string // "" or a reset reason ("unknown_stream", "gap") sent before any replay
	Replay      bool   // replay retained events with Seq > From
	From        uint64
	ResetAfter  string // "" or a reset reason ("generation_changed") sent after the replay
	Then        Next
}

// Decide applies the resume decision table of DESIGN.md §3 to in: the first
// matching row wins. Reasons, by row:
//
//  1. 400 "missing_session": no Mcp-Session-Id header.
//  2. 404 "unknown_session": no session; the cursor is never read.
//  3. 400 "malformed_cursor", "forged_cursor", or "future_cursor" (a
//     genuine cursor past what its stream holds; checked after row 5).
//  4. 409 "foreign_stream": the stream belongs to another session.
//  5. 200 "unknown_stream": reset unknown_stream, then end.
//  6. 200 "generation_changed": reset gap if the cursor is in a hole, replay
//     up to the seal, reset generation_changed, then the current standalone
//     stream (standalone) or end (request stream).
//  7. 200 "gap": reset gap, replay what is retained, then live or end.
//  8. 204 "finished": the cursor is at or after the terminal event.
//  9. 200 "replay_to_end": replay through the terminal event, then end.
//  10. 200 "replay": replay after the cursor, then live.
//
// A CursorErr that is neither ErrMalformed nor ErrForged counts as malformed.
func Decide(in Input) Decision {
	if !in.HasSessionHeader {
		return Decision{Row: 1, Status: http.StatusBadRequest, Reason: "missing_session"}
	}
	sess := in.Session
	if sess == nil {
		return Decision{Row: 2, Status: http.StatusNotFound, Reason: "unknown_session"}
	}
	if in.CursorErr != nil {
		reason := "malformed_cursor"
		if errors.Is(in.CursorErr, ErrForged) {
			reason = "forged_cursor"
		}
		return Decision{Row: 3, Status: http.StatusBadRequest, Reason: reason}
	}
	st, cur := in.Stream, in.Cursor
	if st != nil && st.Session != sess.ID {
		return Decision{Row: 4, Status: http.StatusConflict, Reason: "foreign_stream"}
	}
	if st == nil {
		return Decision{Row: 5, Status: http.StatusOK, Reason: "unknown_stream",
			ResetBefore: resetUnknownStream, Then: End}
	}
	if cur.Generation > st.Generation || cur.Generation == st.Generation && cur.Seq > st.LastSeq {
		return Decision{Row: 3, Status: http.StatusBadRequest, Reason: "future_cursor"}
	}
	hole := inHole(cur.Seq, st.FirstSeq)
	if cur.Generation != sess.Incarnation || st.Generation != sess.Incarnation {
		d := Decision{Row: 6, Status: http.StatusOK, Reason: "generation_changed",
			Replay: true, From: cur.Seq, ResetAfter: resetGenerationChanged, Then: End}
		if hole {
			d.ResetBefore = resetGap
		}
		if st.Standalone {
			d.Then = CurrentStandalone
		}
		return d
	}
	if hole {
		d := Decision{Row: 7, Status: http.StatusOK, Reason: "gap",
			ResetBefore: resetGap, Replay: true, From: cur.Seq, Then: Live}
		if st.Terminal {
			d.Then = End
		}
		return d
	}
	if st.Terminal {
		if cur.Seq >= st.LastSeq {
			return Decision{Row: 8, Status: http.StatusNoContent, Reason: "finished"}
		}
		return Decision{Row: 9, Status: http.StatusOK, Reason: "replay_to_end",
			Replay: true, From: cur.Seq, Then: End}
	}
	return Decision{Row: 10, Status: http.StatusOK, Reason: "replay",
		Replay: true, From: cur.Seq, Then: Live}
}

// inHole reports whether events after seq were evicted before first, the
// lowest retained seq: seq+1 < first, written so that seq+1 cannot overflow.
func inHole(seq, first uint64) bool {
	return first > 0 && seq < first-1
}
