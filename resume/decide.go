package resume

import (
	"errors"
	"math"
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

// Next says what happens to the response once a plan's replay is done.
type Next int

const (
	End               Next = iota // end the response
	Live                          // keep the response open and deliver new events of the stream as they come
	CurrentStandalone             // go on with the session's current standalone stream, live (row 6 on a standalone stream)
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

// Outcome names a resume decision in metrics and logs.
type Outcome string

// Outcomes, by row of the decision table.
const (
	OutcomeMissingSession  Outcome = "missing_session"    // row 1
	OutcomeUnknownSession  Outcome = "unknown_session"    // row 2
	OutcomeMalformedCursor Outcome = "malformed_cursor"   // row 3
	OutcomeForgedCursor    Outcome = "forged_cursor"      // row 3
	OutcomeFutureCursor    Outcome = "future_cursor"      // row 3: a generation the stream never had
	OutcomeForeignStream   Outcome = "foreign_stream"     // row 4: a tenant-isolation event
	OutcomeUnknownStream   Outcome = "unknown_stream"     // row 5
	OutcomeGeneration      Outcome = "generation_changed" // row 6
	OutcomeGap             Outcome = "gap"                // row 7: an eviction hole
	OutcomeAheadOfLog      Outcome = "ahead_of_log"       // row 7: a genuine cursor past what the log holds (lost in a crash)
	OutcomeFinished        Outcome = "finished"           // row 8
	OutcomeReplayToEnd     Outcome = "replay_to_end"      // row 9
	OutcomeReplay          Outcome = "replay"             // row 10
)

// Plan is what one client connection of a stream receives, in order: a
// reset with ResetBefore if set; if Replay, the retained events of the
// stream with Seq > From (up to UpTo unless Then is Live); a reset with
// ResetAfter if set and still due (see [Plan.ResetAfterDue]); then Then.
//
// Event IDs on the connection are minted with Stream and Generation.
// Whoever executes a plan applies the mid-stream rules of this package as
// it reads the log: [Hole] for events evicted while it reads, [Plan.Delivers]
// and [Plan.ReplayDone] for the end of a replay, [AtTerminal] for the end
// of a stream.
type Plan struct {
	Stream      StreamKey
	Generation  uint64 // the stream's generation
	ResetBefore Reason // "" or ReasonUnknownStream, ReasonGap
	Replay      bool
	From        uint64
	UpTo        uint64 // with Then != Live, the replay stops after this seq: the seal, or UntilSeal
	ResetAfter  Reason // "" or ReasonGenerationChanged
	Then        Next
}

// UntilSeal as a Plan's UpTo means: the old generation's stream is not
// sealed yet; deliver what comes, live, up to and including its terminal
// event (the seal), then go on as Then says.
const UntilSeal = math.MaxUint64

// Tail is the plan of a connection that follows a live stream from after
// seq: a new request stream (seq 0), or a standalone stream opened by a GET
// without Last-Event-ID (seq: what no connection has been given yet).
func Tail(key StreamKey, generation, seq uint64) Plan {
	return Plan{Stream: key, Generation: generation, Replay: true, From: seq, Then: Live}
}

// Decision is the answer to one resume request: the HTTP Status, and with
// 200 the Plan of what the connection receives.
type Decision struct {
	Row     int     // 1..10 as numbered in the decision table
	Status  int     // HTTP status: 400, 404, 409, 204 or 200
	Outcome Outcome // for metrics and logs
	Plan    Plan    // with Status 200
}

// Decide applies the resume decision table (docs/design.md, "The resume
// contract") to in: the first matching row wins. By row:
//
//  1. 400 missing_session: no Mcp-Session-Id header.
//  2. 404 unknown_session: no session; the cursor is never read.
//  3. 400 malformed_cursor or forged_cursor; future_cursor for a genuine
//     cursor naming a generation its stream never had (checked after
//     row 5).
//  4. 409 foreign_stream: the stream belongs to another session.
//  5. 200 unknown_stream: reset unknown_stream, then end.
//  6. 200 generation_changed: reset gap first if the cursor is in a hole
//     or ahead of the log, replay up to the seal (waiting for it, live, if
//     the stream is not sealed yet: UpTo is UntilSeal), reset
//     generation_changed, then the current standalone stream (standalone)
//     or end (request stream).
//  7. 200 gap: reset gap, replay what is retained, then live or end. A
//     genuine cursor ahead of what the log holds (events delivered, then
//     lost in a crash) is answered the same way (ahead_of_log), never 400.
//  8. 204 finished: the cursor is at the terminal event.
//  9. 200 replay_to_end: replay through the terminal event, then end.
//  10. 200 replay: replay after the cursor, then live.
//
// A CursorErr that is neither ErrMalformed nor ErrForged counts as malformed.
func Decide(in Input) Decision {
	if !in.HasSessionHeader {
		return Decision{Row: 1, Status: http.StatusBadRequest, Outcome: OutcomeMissingSession}
	}
	sess := in.Session
	if sess == nil {
		return Decision{Row: 2, Status: http.StatusNotFound, Outcome: OutcomeUnknownSession}
	}
	if in.CursorErr != nil {
		o := OutcomeMalformedCursor
		if errors.Is(in.CursorErr, ErrForged) {
			o = OutcomeForgedCursor
		}
		return Decision{Row: 3, Status: http.StatusBadRequest, Outcome: o}
	}
	st, cur := in.Stream, in.Cursor
	if st != nil && st.Session != sess.ID {
		return Decision{Row: 4, Status: http.StatusConflict, Outcome: OutcomeForeignStream}
	}
	if st == nil {
		return Decision{Row: 5, Status: http.StatusOK, Outcome: OutcomeUnknownStream, Plan: Plan{
			Stream: cur.Stream, Generation: cur.Generation, ResetBefore: ReasonUnknownStream, Then: End}}
	}
	if cur.Generation > st.Generation {
		// Event IDs of a stream carry the stream's own generation: no
		// relay mints this cursor.
		return Decision{Row: 3, Status: http.StatusBadRequest, Outcome: OutcomeFutureCursor}
	}
	replay := Plan{Stream: cur.Stream, Generation: st.Generation, Replay: true, From: cur.Seq, UpTo: st.LastSeq}
	ahead := cur.Generation == st.Generation && cur.Seq > st.LastSeq
	hole := Hole(cur.Seq, st.FirstSeq)
	if cur.Generation != sess.Incarnation || st.Generation != sess.Incarnation {
		p := replay
		p.ResetAfter, p.Then = ReasonGenerationChanged, End
		if !st.Terminal {
			// Not sealed yet: the relay that re-creates the backend seals
			// the old generation's streams after it records the new
			// incarnation (another replica may be doing it right now).
			// Wait for the seal; it tells what was lost.
			p.UpTo = UntilSeal
		}
		if hole || ahead {
			p.ResetBefore = ReasonGap
		}
		if st.Standalone {
			p.Then = CurrentStandalone
		}
		return Decision{Row: 6, Status: http.StatusOK, Outcome: OutcomeGeneration, Plan: p}
	}
	if hole || ahead {
		p := replay
		p.ResetBefore, p.Then = ReasonGap, Live
		if st.Terminal {
			p.Then = End
		}
		o := OutcomeGap
		if ahead {
			o = OutcomeAheadOfLog
		}
		return Decision{Row: 7, Status: http.StatusOK, Outcome: o, Plan: p}
	}
	if st.Terminal {
		if cur.Seq >= st.LastSeq {
			return Decision{Row: 8, Status: http.StatusNoContent, Outcome: OutcomeFinished}
		}
		p := replay
		p.Then = End
		return Decision{Row: 9, Status: http.StatusOK, Outcome: OutcomeReplayToEnd, Plan: p}
	}
	p := replay
	p.Then = Live
	return Decision{Row: 10, Status: http.StatusOK, Outcome: OutcomeReplay, Plan: p}
}

// Hole is the one rule for evicted events, at the decision and while a
// connection reads on: reading after seq, with first the lowest seq the log
// retains, events were evicted if seq+1 < first (written so that seq+1
// cannot overflow). The connection then gets a gap reset, unless its plan
// just announced one, and reads on from first-1: never a silent jump.
func Hole(seq, first uint64) bool {
	return first > 0 && seq < first-1
}

// Delivers reports whether the plan delivers the event with seq: every
// event on a live plan, those up to UpTo otherwise (a replay stops at the
// seal even if the log grew since the decision).
func (p Plan) Delivers(seq uint64) bool {
	return p.Then == Live || seq <= p.UpTo
}

// ReplayDone reports whether a plan that does not go live has delivered
// everything it replays, once the connection's cursor is at seq and the
// log's stream is as given: past UpTo, or (UntilSeal) at its terminal
// event.
func (p Plan) ReplayDone(seq uint64, st Stream) bool {
	if p.Then == Live {
		return false
	}
	if p.UpTo == UntilSeal {
		return st.Terminal && seq >= st.LastSeq
	}
	return seq >= p.UpTo
}

// ResetAfterDue returns the reset to send once the replay is done: the
// plan's ResetAfter, unless the replay ended with a reset event. A stream
// the relay sealed ends with its own reset (generation_changed on a
// standalone stream, backend_lost on a request stream), and one reset says
// it.
func (p Plan) ResetAfterDue(lastEventType string) Reason {
	if lastEventType == EventReset {
		return ""
	}
	return p.ResetAfter
}

// AtTerminal says what follows when a connection reaches a stream's
// terminal event: a request stream ends; a standalone stream is terminal
// only when the relay sealed it after a generation change (its last event
// is that reset), and the connection goes on with the session's current
// standalone stream, without a second reset.
func AtTerminal(standalone bool) Next {
	if standalone {
		return CurrentStandalone
	}
	return End
}
