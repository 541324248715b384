package pebblestore_test

import (
	"bytes"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
)

func openTail(t *testing.T, r eventlog.Retention) *pebblestore.Store {
	t.Helper()
	st, err := pebblestore.Open(filepath.Join(t.TempDir(), "log"), pebblestore.Options{Retention: r, Sync: pebblestore.SyncNone})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// readAll reads key after each cursor with each limit.
func readAll(t *testing.T, st *pebblestore.Store, key string, last uint64) map[string]string {
	t.Helper()
	out := make(map[string]string)
	for after := uint64(0); after <= last+1; after++ {
		for limit := 1; limit <= 4; limit++ {
			rec, evs, err := st.Read(t.Context(), key, after, limit, nil)
			var b bytes.Buffer
			fmt.Fprintf(&b, "%+v %v:", rec, err)
			for _, e := range evs {
				fmt.Fprintf(&b, " %d/%s/%s", e.Seq, e.Type, e.Data)
			}
			out[fmt.Sprint(after, "/", limit)] = b.String()
		}
	}
	return out
}

// TestReadFromTail: what Read answers from the tail of a stream's last
// append is what it answers from Pebble, for every cursor and limit, after
// appends of one and several events, an eviction by the same append, an
// eviction by another stream's append, and a terminal append.
func TestReadFromTail(t *testing.T) {
	st := openTail(t, eventlog.Retention{MaxEvents: 4})
	ctx := t.Context()
	if err := st.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b"} {
		if err := st.CreateStream(ctx, &eventlog.Stream{Key: k, Session: "s", Generation: 1}); err != nil {
			t.Fatal(err)
		}
	}
	ev := func(d ...string) []eventlog.Event {
		var evs []eventlog.Event
		for _, s := range d {
			evs = append(evs, eventlog.Event{Data: []byte(s)})
		}
		return evs
	}
	steps := []struct {
		key      string
		terminal bool
		events   []eventlog.Event
	}{
		{"a", false, ev("1", "2", "3")},
		{"a", false, ev("4")},
		{"a", false, ev("5", "6")}, // evicts 1 and 2: the session keeps 4
		{"b", false, ev("x", "y")}, // evicts a's 3 and 4
		{"a", false, []eventlog.Event{{Type: "reset", Data: []byte("r")}}},
		{"a", true, ev("end")},
	}
	for i, step := range steps {
		last, err := st.Append(ctx, step.key, step.terminal, step.events...)
		if err != nil {
			t.Fatalf("step %d: Append: %v", i, err)
		}
		lastA, _, _ := st.Read(ctx, "a", 0, 0, nil)
		tails := readAll(t, st, "a", max(last, lastA.LastSeq))
		if st.TailBytes() == 0 && step.key == "a" {
			t.Fatalf("step %d: no tail was kept", i)
		}
		st.DropTails()
		pebble := readAll(t, st, "a", max(last, lastA.LastSeq))
		if !reflect.DeepEqual(tails, pebble) {
			for k, v := range tails {
				if pebble[k] != v {
					t.Errorf("step %d, after/limit %s: from the tail %s, from Pebble %s", i, k, v, pebble[k])
				}
			}
		}
	}
}

// TestTailsBounded: the tails of many streams stay within the budget, and
// the events whose tails were dropped are read from Pebble.
func TestTailsBounded(t *testing.T) {
	st := openTail(t, eventlog.Retention{})
	ctx := t.Context()
	data := bytes.Repeat([]byte("x"), 1000)
	const n = 1000
	for i := range n {
		sid := fmt.Sprint("s", i%10)
		if i < 10 {
			if err := st.CreateSession(ctx, &eventlog.Session{ID: sid, Incarnation: 1}); err != nil {
				t.Fatal(err)
			}
		}
		key := fmt.Sprint("k", i)
		if err := st.CreateStream(ctx, &eventlog.Stream{Key: key, Session: sid, Generation: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Append(ctx, key, true, eventlog.Event{Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	if b := st.TailBytes(); b == 0 || b > pebblestore.TailBudget {
		t.Errorf("tails hold %d bytes of %d streams' 1,000-byte events, want some, within %d", b, n, pebblestore.TailBudget)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		_, evs, err := st.Read(ctx, fmt.Sprint("k", i), 0, 10, nil)
		if err != nil || len(evs) != 1 || !bytes.Equal(evs[0].Data, data) {
			t.Errorf("stream %d: %d events, %v", i, len(evs), err)
		}
	}
}
