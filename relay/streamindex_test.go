package relay

import (
	"testing"

	"github.com/mcprelay/mcprelay/resume"
)

// TestStreamIndex: stream keys spread over every shard (a key's last
// character, 2 bits of key and 4 of padding, would fill two of them), and
// remove forgets only the stream it is given.
func TestStreamIndex(t *testing.T) {
	var x streamIndex
	const n = 1600
	sts := make([]*stream, n)
	for i := range sts {
		st := &stream{key: resume.NewStreamKey()}
		st.skey = st.key.String()
		x.put(st)
		sts[i] = st
	}
	for i := range x.shards {
		if got := len(x.shards[i].m); got < n/len(x.shards)/2 {
			t.Errorf("shard %d holds %d of %d streams", i, got, n)
		}
	}
	if got := len(x.all()); got != n {
		t.Fatalf("all: %d streams, want %d", got, n)
	}
	other := &stream{key: sts[0].key, skey: sts[0].skey}
	x.remove(other)
	if x.get(sts[0].skey) != sts[0] {
		t.Fatal("removing another stream under the same key removed the indexed one")
	}
	x.remove(sts[0])
	if x.get(sts[0].skey) != nil || len(x.all()) != n-1 {
		t.Fatal("remove left the stream indexed")
	}
}
