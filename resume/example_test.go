package resume_test

import (
	"fmt"

	"github.com/mcprelay/mcprelay/resume"
)

// A client resumes a request stream whose oldest events were evicted: it
// gets a gap reset first, then what is retained, then the stream goes live.
func ExampleDecide() {
	codec, err := resume.NewCodec([]byte("an example secret of at least 32 bytes"))
	if err != nil {
		panic(err)
	}
	key := resume.StreamKey{0x5e, 0x11} // normally resume.NewStreamKey()
	lastEventID := codec.ID(resume.Cursor{Stream: key, Generation: 1, Seq: 2})

	cur, cerr := codec.Parse(lastEventID)
	d := resume.Decide(resume.Input{
		HasSessionHeader: true,
		Session:          &resume.Session{ID: "s1", Incarnation: 1},
		Cursor:           cur,
		CursorErr:        cerr,
		Stream:           &resume.Stream{Session: "s1", Generation: 1, FirstSeq: 5, LastSeq: 9},
	})
	fmt.Printf("row %d: %d %s\n", d.Row, d.Status, d.Outcome)
	fmt.Printf("reset %q, replay after %d, then %v\n", d.Plan.ResetBefore, d.Plan.From, d.Plan.Then)

	// The same cursor presented with a tampered ID is a 400, never a 404.
	_, cerr = codec.Parse(lastEventID[:len(lastEventID)-2] + "AA")
	d = resume.Decide(resume.Input{
		HasSessionHeader: true,
		Session:          &resume.Session{ID: "s1", Incarnation: 1},
		CursorErr:        cerr,
	})
	fmt.Printf("row %d: %d %s\n", d.Row, d.Status, d.Outcome)
	// Output:
	// row 7: 200 gap
	// reset "gap", replay after 2, then Live
	// row 3: 400 forged_cursor
}
