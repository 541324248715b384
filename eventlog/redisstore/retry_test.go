package redisstore_test

import (
	"bytes"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
)

// replyCutter is a TCP proxy in front of Redis that, once armed, lets the
// next script call through and cuts the connection when its answer comes
// back: the script ran, the caller never learns it.
type replyCutter struct {
	ln     net.Listener
	target string
	armed  atomic.Bool
	cuts   atomic.Int64
}

func newReplyCutter(t *testing.T, target string) *replyCutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyCutter{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.handle(c)
		}
	}()
	return p
}

func (p *replyCutter) url() string { return "redis://" + p.ln.Addr().String() + "/0" }

func (p *replyCutter) handle(c net.Conn) {
	r, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	var script atomic.Bool // a script call went out on this connection while armed
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if p.armed.Load() && bytes.Contains(buf[:n], []byte("EVALSHA")) {
					script.Store(true)
				}
				if _, werr := r.Write(buf[:n]); werr != nil {
					err = werr
				}
			}
			if err != nil {
				r.Close()
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if script.Load() && p.armed.CompareAndSwap(true, false) {
				p.cuts.Add(1)
				c.Close()
				r.Close()
				return
			}
			c.Write(buf[:n])
		}
		if err != nil {
			c.Close()
			return
		}
	}
}

// TestAppendRetryAfterLostAnswer: an append that ran in Redis but whose
// answer was lost fails as unavailable; the caller's retry of the same
// events does not append them again. A later append of the same events,
// once the first was answered, is a new append. Regression: the retry
// appended the events a second time, and readers got each of them under
// two IDs (seen in the crashtest's Redis restart run: Redis killed after
// running an append and before answering it).
func TestAppendRetryAfterLostAnswer(t *testing.T) {
	srv := redistest.Start(t)
	p := newReplyCutter(t, srv.Addr())
	st := open(t, srv, redisstore.Options{URL: p.url()})
	ctx := t.Context()
	if err := st.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateStream(ctx, &eventlog.Stream{Key: "k", Session: "s", Generation: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Append(ctx, "k", false, eventlog.Event{Data: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	batch := func() []eventlog.Event {
		return []eventlog.Event{{Data: []byte("a")}, {Type: "t", Data: []byte("b")}}
	}
	p.armed.Store(true)
	if _, err := st.Append(ctx, "k", false, batch()...); !errors.Is(err, eventlog.ErrUnavailable) {
		t.Fatalf("append whose answer is lost: %v, want ErrUnavailable", err)
	}
	if p.cuts.Load() != 1 {
		t.Fatalf("the proxy cut %d answers, want 1", p.cuts.Load())
	}
	evs := batch()
	last, err := st.Append(ctx, "k", false, evs...)
	if err != nil {
		t.Fatalf("retried append: %v", err)
	}
	if last != 3 || evs[0].Seq != 2 || evs[1].Seq != 3 {
		t.Errorf("retried append: LastSeq %d, seqs %d %d; want 3, 2 3 (the events appended once)", last, evs[0].Seq, evs[1].Seq)
	}
	if last, err := st.Append(ctx, "k", false, batch()...); err != nil || last != 5 {
		t.Errorf("the same events appended anew: LastSeq %d, %v; want 5", last, err)
	}
	_, got, err := st.Read(ctx, "k", 0, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	var data []string
	for _, ev := range got {
		data = append(data, ev.Type+"/"+string(ev.Data))
	}
	want := []string{"/first", "/a", "t/b", "/a", "t/b"}
	if len(data) != len(want) {
		t.Fatalf("the log holds %q, want %q", data, want)
	}
	for i := range want {
		if data[i] != want[i] {
			t.Fatalf("the log holds %q, want %q", data, want)
		}
	}
}
