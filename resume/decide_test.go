package resume

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

func TestDecide(t *testing.T) {
	key := StreamKey{0xaa}
	sess := &Session{ID: "s1", Incarnation: 2}
	// in builds a well-formed input for session s1 at incarnation 2.
	in := func(seq uint64, st Stream) Input {
		return Input{
			HasSessionHeader: true,
			Session:          sess,
			Cursor:           Cursor{Stream: key, Generation: 2, Seq: seq},
			Stream:           &st,
		}
	}
	live := Stream{Session: "s1", Generation: 2, FirstSeq: 1, LastSeq: 10}
	done := Stream{Session: "s1", Generation: 2, FirstSeq: 1, LastSeq: 10, Terminal: true}
	holed := Stream{Session: "s1", Generation: 2, FirstSeq: 6, LastSeq: 10}
	sealed := Stream{Session: "s1", Generation: 1, FirstSeq: 1, LastSeq: 10}
	with := func(i Input, f func(*Input)) Input { f(&i); return i }

	tests := []struct {
		name string
		in   Input
		want Decision
	}{
		// Row 1.
		{name: "row 1: no session header", in: with(in(3, live), func(i *Input) { i.HasSessionHeader = false }),
			want: Decision{Row: 1, Status: 400, Outcome: "missing_session"}},
		{name: "row 1 beats row 2", in: Input{},
			want: Decision{Row: 1, Status: 400, Outcome: "missing_session"}},

		// Row 2.
		{name: "row 2: unknown session", in: with(in(3, live), func(i *Input) { i.Session = nil }),
			want: Decision{Row: 2, Status: 404, Outcome: "unknown_session"}},
		{name: "row 2 beats a malformed cursor", in: Input{HasSessionHeader: true, CursorErr: ErrMalformed},
			want: Decision{Row: 2, Status: 404, Outcome: "unknown_session"}},
		{name: "row 2 beats a forged cursor", in: Input{HasSessionHeader: true, CursorErr: ErrForged},
			want: Decision{Row: 2, Status: 404, Outcome: "unknown_session"}},
		{name: "row 2 beats a foreign stream", in: with(in(3, Stream{Session: "other", Generation: 2, FirstSeq: 1, LastSeq: 10}), func(i *Input) { i.Session = nil }),
			want: Decision{Row: 2, Status: 404, Outcome: "unknown_session"}},

		// Row 3.
		{name: "row 3: malformed cursor", in: Input{HasSessionHeader: true, Session: sess, CursorErr: ErrMalformed},
			want: Decision{Row: 3, Status: 400, Outcome: "malformed_cursor"}},
		{name: "row 3: wrapped malformed cursor", in: Input{HasSessionHeader: true, Session: sess, CursorErr: fmt.Errorf("%w: version 7", ErrMalformed)},
			want: Decision{Row: 3, Status: 400, Outcome: "malformed_cursor"}},
		{name: "row 3: forged cursor", in: Input{HasSessionHeader: true, Session: sess, CursorErr: ErrForged},
			want: Decision{Row: 3, Status: 400, Outcome: "forged_cursor"}},
		{name: "row 3: any other cursor error is malformed", in: Input{HasSessionHeader: true, Session: sess, CursorErr: errors.New("boom")},
			want: Decision{Row: 3, Status: 400, Outcome: "malformed_cursor"}},
		{name: "row 3 beats an unknown stream", in: Input{HasSessionHeader: true, Session: sess, CursorErr: ErrForged, Stream: nil},
			want: Decision{Row: 3, Status: 400, Outcome: "forged_cursor"}},
		{name: "row 7: genuine cursor ahead of the log (lost in a crash)", in: in(11, live),
			want: Decision{Row: 7, Status: 200, Outcome: "ahead_of_log", Plan: Plan{ResetBefore: "gap", Replay: true, From: 11, Then: Live}}},
		{name: "row 7: max seq ahead of the log", in: in(math.MaxUint64, live),
			want: Decision{Row: 7, Status: 200, Outcome: "ahead_of_log", Plan: Plan{ResetBefore: "gap", Replay: true, From: math.MaxUint64, Then: Live}}},
		{name: "row 7 beats row 8: ahead of a terminal stream", in: in(11, done),
			want: Decision{Row: 7, Status: 200, Outcome: "ahead_of_log", Plan: Plan{ResetBefore: "gap", Replay: true, From: 11, Then: End}}},
		{name: "row 6: ahead of a sealed stream: gap, then the seal's reset", in: with(in(11, sealed), func(i *Input) { i.Cursor.Generation = 1 }),
			want: Decision{Row: 6, Status: 200, Outcome: "generation_changed", Plan: Plan{ResetBefore: "gap", Replay: true, From: 11, ResetAfter: "generation_changed", Then: End}}},
		{name: "row 3: future generation", in: with(in(3, live), func(i *Input) { i.Cursor.Generation = 3 }),
			want: Decision{Row: 3, Status: 400, Outcome: "future_cursor"}},
		{name: "row 3: generation newer than a sealed stream", in: in(3, sealed),
			want: Decision{Row: 3, Status: 400, Outcome: "future_cursor"}},
		{name: "row 7: any seq on an empty stream but priming is ahead", in: in(1, Stream{Session: "s1", Generation: 2, FirstSeq: 1, LastSeq: 0}),
			want: Decision{Row: 7, Status: 200, Outcome: "ahead_of_log", Plan: Plan{ResetBefore: "gap", Replay: true, From: 1, Then: Live}}},

		// Row 4.
		{name: "row 4: foreign stream", in: in(3, Stream{Session: "s2", Generation: 2, FirstSeq: 1, LastSeq: 10}),
			want: Decision{Row: 4, Status: 409, Outcome: "foreign_stream"}},
		{name: "row 4 beats row 6", in: with(in(3, Stream{Session: "s2", Generation: 1, FirstSeq: 1, LastSeq: 10}), func(i *Input) { i.Cursor.Generation = 1 }),
			want: Decision{Row: 4, Status: 409, Outcome: "foreign_stream"}},
		{name: "row 4 beats a cursor ahead of the log", in: in(99, Stream{Session: "s2", Generation: 2, FirstSeq: 1, LastSeq: 10}),
			want: Decision{Row: 4, Status: 409, Outcome: "foreign_stream"}},

		// Row 5.
		{name: "row 5: unknown stream", in: with(in(3, live), func(i *Input) { i.Stream = nil }),
			want: Decision{Row: 5, Status: 200, Outcome: "unknown_stream", Plan: Plan{ResetBefore: "unknown_stream", Then: End}}},
		{name: "row 5 beats a future cursor", in: Input{HasSessionHeader: true, Session: sess, Cursor: Cursor{Generation: 9, Seq: 99}},
			want: Decision{Row: 5, Status: 200, Outcome: "unknown_stream", Plan: Plan{ResetBefore: "unknown_stream", Then: End}}},

		// Row 6.
		{name: "row 6: old-generation request stream", in: with(in(4, sealed), func(i *Input) { i.Cursor.Generation = 1 }),
			want: Decision{Row: 6, Status: 200, Outcome: "generation_changed", Plan: Plan{Replay: true, From: 4, ResetAfter: "generation_changed", Then: End}}},
		{name: "row 6: old-generation standalone stream", in: with(in(4, Stream{Session: "s1", Generation: 1, Standalone: true, FirstSeq: 1, LastSeq: 10}), func(i *Input) { i.Cursor.Generation = 1 }),
			want: Decision{Row: 6, Status: 200, Outcome: "generation_changed", Plan: Plan{Replay: true, From: 4, ResetAfter: "generation_changed", Then: CurrentStandalone}}},
		{name: "row 6: cursor at the seal", in: with(in(10, sealed), func(i *Input) { i.Cursor.Generation = 1 }),
			want: Decision{Row: 6, Status: 200, Outcome: "generation_changed", Plan: Plan{Replay: true, From: 10, ResetAfter: "generation_changed", Then: End}}},
		{name: "row 6: hole in the old generation", in: with(in(2, Stream{Session: "s1", Generation: 1, FirstSeq: 6, LastSeq: 10}), func(i *Input) { i.Cursor.Generation = 1 }),
			want: Decision{Row: 6, Status: 200, Outcome: "generation_changed", Plan: Plan{ResetBefore: "gap", Replay: true, From: 2, ResetAfter: "generation_changed", Then: End}}},
		{name: "row 6: cursor just before the first retained, no hole", in: with(in(5, Stream{Session: "s1", Generation: 1, Standalone: true, FirstSeq: 6, LastSeq: 10}), func(i *Input) { i.Cursor.Generation = 1 }),
			want: Decision{Row: 6, Status: 200, Outcome: "generation_changed", Plan: Plan{Replay: true, From: 5, ResetAfter: "generation_changed", Then: CurrentStandalone}}},
		{name: "row 6 beats row 8: terminal old-generation stream", in: with(in(10, Stream{Session: "s1", Generation: 1, FirstSeq: 1, LastSeq: 10, Terminal: true}), func(i *Input) { i.Cursor.Generation = 1 }),
			want: Decision{Row: 6, Status: 200, Outcome: "generation_changed", Plan: Plan{Replay: true, From: 10, ResetAfter: "generation_changed", Then: End}}},
		{name: "row 6: cursor older than its stream's generation", in: with(in(4, live), func(i *Input) { i.Cursor.Generation = 1 }),
			want: Decision{Row: 6, Status: 200, Outcome: "generation_changed", Plan: Plan{Replay: true, From: 4, ResetAfter: "generation_changed", Then: End}}},
		{name: "row 6: max seq in an older generation does not wrap into a hole", in: with(in(math.MaxUint64, live), func(i *Input) { i.Cursor.Generation = 1 }),
			want: Decision{Row: 6, Status: 200, Outcome: "generation_changed", Plan: Plan{Replay: true, From: math.MaxUint64, ResetAfter: "generation_changed", Then: End}}},

		// Row 7.
		{name: "row 7: hole", in: in(2, holed),
			want: Decision{Row: 7, Status: 200, Outcome: "gap", Plan: Plan{ResetBefore: "gap", Replay: true, From: 2, Then: Live}}},
		{name: "row 7: cursor at FirstSeq-2", in: in(4, holed),
			want: Decision{Row: 7, Status: 200, Outcome: "gap", Plan: Plan{ResetBefore: "gap", Replay: true, From: 4, Then: Live}}},
		{name: "row 7: priming cursor with a hole", in: in(0, holed),
			want: Decision{Row: 7, Status: 200, Outcome: "gap", Plan: Plan{ResetBefore: "gap", Replay: true, From: 0, Then: Live}}},
		{name: "row 7: terminal with hole", in: in(2, Stream{Session: "s1", Generation: 2, FirstSeq: 6, LastSeq: 10, Terminal: true}),
			want: Decision{Row: 7, Status: 200, Outcome: "gap", Plan: Plan{ResetBefore: "gap", Replay: true, From: 2, Then: End}}},
		{name: "row 7: everything evicted", in: in(3, Stream{Session: "s1", Generation: 2, FirstSeq: 11, LastSeq: 10}),
			want: Decision{Row: 7, Status: 200, Outcome: "gap", Plan: Plan{ResetBefore: "gap", Replay: true, From: 3, Then: Live}}},

		// Row 8.
		{name: "row 8: cursor at the terminal event", in: in(10, done),
			want: Decision{Row: 8, Status: 204, Outcome: "finished"}},
		{name: "row 8: terminal, everything evicted, cursor at the end", in: in(10, Stream{Session: "s1", Generation: 2, FirstSeq: 11, LastSeq: 10, Terminal: true}),
			want: Decision{Row: 8, Status: 204, Outcome: "finished"}},

		// Row 9.
		{name: "row 9: before the terminal event", in: in(9, done),
			want: Decision{Row: 9, Status: 200, Outcome: "replay_to_end", Plan: Plan{Replay: true, From: 9, Then: End}}},
		{name: "row 9: priming cursor on a terminal stream", in: in(0, done),
			want: Decision{Row: 9, Status: 200, Outcome: "replay_to_end", Plan: Plan{Replay: true, From: 0, Then: End}}},
		{name: "row 9: cursor exactly at FirstSeq-1 of a terminal stream", in: in(5, Stream{Session: "s1", Generation: 2, FirstSeq: 6, LastSeq: 10, Terminal: true}),
			want: Decision{Row: 9, Status: 200, Outcome: "replay_to_end", Plan: Plan{Replay: true, From: 5, Then: End}}},

		// Row 10.
		{name: "row 10: replay then live", in: in(3, live),
			want: Decision{Row: 10, Status: 200, Outcome: "replay", Plan: Plan{Replay: true, From: 3, Then: Live}}},
		{name: "row 10: cursor at LastSeq", in: in(10, live),
			want: Decision{Row: 10, Status: 200, Outcome: "replay", Plan: Plan{Replay: true, From: 10, Then: Live}}},
		{name: "row 10: cursor exactly at FirstSeq-1", in: in(5, holed),
			want: Decision{Row: 10, Status: 200, Outcome: "replay", Plan: Plan{Replay: true, From: 5, Then: Live}}},
		{name: "row 10: priming cursor, FirstSeq 1", in: in(0, live),
			want: Decision{Row: 10, Status: 200, Outcome: "replay", Plan: Plan{Replay: true, From: 0, Then: Live}}},
		{name: "row 10: priming cursor on an empty stream", in: in(0, Stream{Session: "s1", Generation: 2, FirstSeq: 1, LastSeq: 0}),
			want: Decision{Row: 10, Status: 200, Outcome: "replay", Plan: Plan{Replay: true, From: 0, Then: Live}}},
		{name: "row 10: standalone stream", in: in(7, Stream{Session: "s1", Generation: 2, Standalone: true, FirstSeq: 1, LastSeq: 10}),
			want: Decision{Row: 10, Status: 200, Outcome: "replay", Plan: Plan{Replay: true, From: 7, Then: Live}}},
	}

	rows := map[int]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want.Status == 200 {
				// Every plan names the cursor's stream and mints IDs in
				// the stream's generation (the cursor's for an unknown
				// stream); a replay stops at what the log held.
				tt.want.Plan.Stream = tt.in.Cursor.Stream
				tt.want.Plan.Generation = tt.in.Cursor.Generation
				if tt.in.Stream != nil {
					tt.want.Plan.Generation = tt.in.Stream.Generation
					tt.want.Plan.UpTo = tt.in.Stream.LastSeq
					if tt.want.Row == 6 && !tt.in.Stream.Terminal {
						tt.want.Plan.UpTo = UntilSeal // not sealed yet: wait for the seal
					}
				}
			}
			if got := Decide(tt.in); got != tt.want {
				t.Errorf("Decide:\n got %+v\nwant %+v", got, tt.want)
			}
		})
		rows[tt.want.Row] = true
	}
	for row := 1; row <= 10; row++ {
		if !rows[row] {
			t.Errorf("no test case for row %d", row)
		}
	}
}

// TestDecideInvariants walks every combination of small values and checks
// the promises of docs/design.md that hold across rows.
func TestDecideInvariants(t *testing.T) {
	const (
		sid  = "s1"
		maxN = 5
		inc  = 2
		gens = 4 // 0..3 for the cursor and the stream
	)
	n := 0
	for _, owner := range []string{sid, "s2"} {
		for sg := uint64(0); sg < gens; sg++ {
			for cg := uint64(0); cg < gens; cg++ {
				for last := uint64(0); last <= maxN; last++ {
					for first := uint64(1); first <= last+1; first++ {
						for seq := uint64(0); seq <= maxN+1; seq++ {
							for flags := range 4 {
								st := Stream{Session: owner, Generation: sg, FirstSeq: first, LastSeq: last,
									Standalone: flags&1 != 0, Terminal: flags&2 != 0 && last > 0}
								in := Input{HasSessionHeader: true, Session: &Session{ID: sid, Incarnation: inc},
									Cursor: Cursor{Generation: cg, Seq: seq}, Stream: &st}
								checkInvariants(t, in, Decide(in))
								n++
							}
						}
					}
				}
			}
		}
	}
	if n < 10000 {
		t.Fatalf("checked only %d inputs", n)
	}
}

func checkInvariants(t *testing.T, in Input, d Decision) {
	t.Helper()
	st, cur := in.Stream, in.Cursor
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("Decide(stream %+v, cursor gen %d seq %d) = %+v: %s", *st, cur.Generation, cur.Seq, d, fmt.Sprintf(format, args...))
	}
	if d.Row < 1 || d.Row > 10 {
		fail("row out of range")
	}
	if st.Session != in.Session.ID && d.Status != 409 {
		fail("another session's stream must be a 409")
	}
	p := d.Plan
	if d.Status != 200 && p != (Plan{}) {
		fail("a non-200 answer sends nothing")
	}
	if d.Status == 200 {
		if cur.Generation > st.Generation {
			fail("a generation the stream never had must be rejected")
		}
		ahead := cur.Generation == st.Generation && cur.Seq > st.LastSeq
		hole := cur.Seq+1 < st.FirstSeq
		if (hole || ahead) != (p.ResetBefore == ReasonGap) {
			fail("a hole or a cursor ahead of the log must be announced with a gap reset first, and only those")
		}
		upTo := st.LastSeq
		if d.Row == 6 && !st.Terminal {
			upTo = UntilSeal
		}
		if !p.Replay || p.From != cur.Seq || p.UpTo != upTo || p.Generation != st.Generation {
			fail("every 200 here replays after the cursor, up to what the log holds, in the stream's generation")
		}
		if st.Terminal && p.Then == Live {
			fail("a terminal stream never goes live")
		}
		inc := in.Session.Incarnation
		changed := cur.Generation != inc || st.Generation != inc
		if changed != (p.ResetAfter == ReasonGenerationChanged) {
			fail("a generation change must end with a generation_changed reset, and only then")
		}
		if p.Then == CurrentStandalone && !(changed && st.Standalone) {
			fail("only an old standalone stream moves to the current one")
		}
	}
	if d.Status == 204 && !(st.Terminal && cur.Seq == st.LastSeq) {
		fail("204 only at the terminal event")
	}
}
