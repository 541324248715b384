package eventlog_test

import (
	"context"
	"fmt"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
)

// A client resumes after its cursor fell out of the retained window: Read
// reports the hole through FirstSeq and returns what is still retained.
func Example() {
	ctx := context.Background()
	st := eventlog.NewMemory(eventlog.Retention{MaxEvents: 3})
	defer st.Close()

	_ = st.CreateSession(ctx, &eventlog.Session{ID: "sess", Incarnation: 1, Created: time.Now()})
	_ = st.CreateStream(ctx, &eventlog.Stream{Key: "post-1", Session: "sess", Generation: 1})
	for i := 1; i <= 4; i++ {
		_, _ = st.Append(ctx, "post-1", false, eventlog.Event{Data: fmt.Appendf(nil, "progress %d", i)})
	}
	last, _ := st.Append(ctx, "post-1", true, eventlog.Event{Data: []byte("result")})
	fmt.Println("terminal event:", last)

	cursor := uint64(1)
	rec, evs, _ := st.Read(ctx, "post-1", cursor, 10, nil)
	if cursor+1 < rec.FirstSeq {
		fmt.Printf("gap: events %d..%d lost\n", cursor+1, rec.FirstSeq-1)
	}
	for _, e := range evs {
		fmt.Printf("%d %s\n", e.Seq, e.Data)
	}
	// Output:
	// terminal event: 5
	// gap: events 2..2 lost
	// 3 progress 3
	// 4 progress 4
	// 5 result
}
