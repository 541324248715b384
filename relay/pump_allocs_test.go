package relay

import (
	"testing"
)

// notifying is a backend.Reply that sends the same notification forever.
type notifying struct{ msg []byte }

func (n notifying) Next() ([]byte, error) { return n.msg, nil }
func (notifying) Close() error            { return nil }

// TestReplyReaderAllocs: reading a notification off a call's reply costs
// the relay no allocation (the pump runs it once per event of a stream).
// Run without -race by scripts/test.
func TestReplyReaderAllocs(t *testing.T) {
	r := &replyReader{rep: notifying{[]byte(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1}}`)}, want: []string{"1"}}
	if n := testing.AllocsPerRun(1000, func() {
		if _, err := r.next(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("replyReader.next: %v allocations per notification, want 0", n)
	}
}
