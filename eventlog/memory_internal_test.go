package eventlog

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

func TestRing(t *testing.T) {
	cases := []struct {
		name   string
		pushes []int // values pushed before pops
		pops   int
		more   []int // pushed after the pops (exercises wrap-around)
	}{
		{"empty", nil, 0, nil},
		{"fill exactly", []int{1, 2, 3, 4}, 0, nil},
		{"grow", []int{1, 2, 3, 4, 5, 6, 7, 8, 9}, 0, nil},
		{"wrap", []int{1, 2, 3, 4}, 2, []int{5, 6}},
		{"wrap then grow", []int{1, 2, 3, 4}, 3, []int{5, 6, 7, 8, 9, 10}},
		{"shrink", []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, 15, []int{18}},
		{"drain", []int{1, 2, 3}, 3, nil},
		{"drain and reuse", []int{1, 2, 3}, 3, []int{4, 5}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r ring[int]
			var model []int
			for _, v := range tc.pushes {
				r.push(v)
				model = append(model, v)
			}
			for range tc.pops {
				if got := r.popFront(); got != model[0] {
					t.Fatalf("popFront = %d, want %d", got, model[0])
				}
				model = model[1:]
			}
			for _, v := range tc.more {
				r.push(v)
				model = append(model, v)
			}
			if r.len() != len(model) {
				t.Fatalf("len = %d, want %d", r.len(), len(model))
			}
			if r.len() == 0 && r.buf != nil {
				t.Errorf("empty ring still holds a buffer of %d", len(r.buf))
			}
			if len(r.buf) > ringMinCap && r.len() <= len(r.buf)/4 {
				t.Errorf("ring of %d elements keeps capacity %d", r.len(), len(r.buf))
			}
			for i := range model {
				for k := 0; i+k <= len(model); k++ {
					if got := r.appendTo(nil, i, k); !slices.Equal(got, model[i:i+k]) && k > 0 {
						t.Fatalf("appendTo(%d, %d) = %v, want %v", i, k, got, model[i:i+k])
					}
				}
			}
			if len(model) > 0 && *r.back() != model[len(model)-1] {
				t.Errorf("back = %d, want %d", *r.back(), model[len(model)-1])
			}
		})
	}
}

func TestRetentionDefaults(t *testing.T) {
	cases := []struct {
		name string
		in   Retention
		want Retention
	}{
		{"zero", Retention{}, Retention{MaxEvents: 10000, MaxBytes: 8 << 20, TerminalGrace: 5 * time.Minute}},
		{"negative", Retention{MaxEvents: -1, MaxBytes: -1, TerminalGrace: -1}, Retention{MaxEvents: 10000, MaxBytes: 8 << 20, TerminalGrace: 5 * time.Minute}},
		{"set", Retention{MaxEvents: 5, MaxBytes: 6, TerminalGrace: time.Second}, Retention{MaxEvents: 5, MaxBytes: 6, TerminalGrace: time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := NewMemory(tc.in).ret; got != tc.want {
				t.Errorf("NewMemory(%+v) keeps %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

func mustCreate(t *testing.T, m *Memory, session string, keys ...string) {
	t.Helper()
	ctx := context.Background()
	if m.lookupSession(session) == nil {
		if err := m.CreateSession(ctx, &Session{ID: session, Incarnation: 1}); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys {
		if err := m.CreateStream(ctx, &Stream{Key: k, Session: session, Generation: 1}); err != nil {
			t.Fatal(err)
		}
	}
}

func mustAppend(t *testing.T, m *Memory, key string, terminal bool, sizes ...int) {
	t.Helper()
	evs := make([]Event, len(sizes))
	for i, n := range sizes {
		evs[i].Data = make([]byte, n)
	}
	if _, err := m.Append(context.Background(), key, terminal, evs...); err != nil {
		t.Fatalf("Append(%q): %v", key, err)
	}
}

// TestMemoryGraceExact checks the grace boundary with a fake clock.
func TestMemoryGraceExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const grace = 5 * time.Minute
		m := NewMemory(Retention{TerminalGrace: grace})
		mustCreate(t, m, "s", "k")
		mustAppend(t, m, "k", true, 10)
		time.Sleep(grace - time.Nanosecond)
		if _, _, err := m.Read(context.Background(), "k", 0, 10, nil); err != nil {
			t.Fatalf("Read just before grace ends: %v", err)
		}
		time.Sleep(time.Nanosecond)
		if _, _, err := m.Read(context.Background(), "k", 0, 10, nil); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Read when grace ends: %v, want ErrNotFound", err)
		}
		checkInvariants(t, m.lookupSession("s"))
	})
}

// TestMemorySweep checks that an idle session loses its expired terminal
// streams through the sweep that other sessions' Appends drive.
func TestMemorySweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMemory(Retention{TerminalGrace: time.Minute})
		mustCreate(t, m, "idle", "done", "open")
		mustAppend(t, m, "done", true, 100, 100)
		mustAppend(t, m, "open", false, 100)
		mustCreate(t, m, "busy", "b")
		time.Sleep(time.Minute)
		for range numShards {
			mustAppend(t, m, "b", false, 1)
			time.Sleep(m.sweepEvery)
		}
		ss := m.lookupSession("idle")
		ss.mu.Lock()
		defer ss.mu.Unlock()
		if len(ss.streams) != 1 || ss.streams[0].rec.Key != "open" || ss.events != 1 || ss.bytes != 100 {
			t.Errorf("idle session after sweep: %d streams, %d events, %d bytes; want only %q with 1 event, 100 bytes",
				len(ss.streams), ss.events, ss.bytes, "open")
		}
		if m.lookupStream("done") != nil {
			t.Errorf("expired stream still indexed")
		}
		checkInvariantsLocked(t, ss)
	})
}

// TestMemoryCompaction drops many short terminal streams while an open
// stream keeps appending, so the append-order list fills with stale runs.
func TestMemoryCompaction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMemory(Retention{MaxEvents: 1000, TerminalGrace: time.Second})
		mustCreate(t, m, "s", "open")
		for i := range 200 {
			k := fmt.Sprintf("req-%d", i)
			mustCreate(t, m, "s", k)
			mustAppend(t, m, k, true, 10)
			mustAppend(t, m, "open", false, 10)
			time.Sleep(100 * time.Millisecond)
		}
		ss := m.lookupSession("s")
		ss.mu.Lock()
		runs, streams := ss.order.len(), len(ss.streams)
		checkInvariantsLocked(t, ss)
		ss.mu.Unlock()
		// About 10 request streams are within grace; each splits the open
		// stream's runs, so about 2*10 live runs. Stale runs are compacted
		// away once they are more than 16 and a quarter of all runs.
		if runs > 70 || streams > 12 {
			t.Errorf("after 200 expired request streams: %d runs, %d streams", runs, streams)
		}
	})
}

// checkInvariants verifies the memory session's bookkeeping.
func checkInvariants(t *testing.T, ss *memSession) {
	t.Helper()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	checkInvariantsLocked(t, ss)
}

func checkInvariantsLocked(t *testing.T, ss *memSession) {
	t.Helper()
	var events, runs, stale int
	var bytes int64
	for i, st := range ss.streams {
		if st.idx != i || st.dropped {
			t.Fatalf("stream %q: idx %d at %d, dropped %v", st.rec.Key, st.idx, i, st.dropped)
		}
		var b int64
		for j := range st.events.len() {
			b += int64(len(st.events.at(j).Data))
		}
		if b != st.bytes {
			t.Fatalf("stream %q: bytes %d, counted %d", st.rec.Key, st.bytes, b)
		}
		events += st.events.len()
		bytes += b
		runs += st.runs
	}
	perStream := map[*memStream]int{}
	for i := range ss.order.len() {
		r := ss.order.at(i)
		if r.s.dropped {
			stale++
			continue
		}
		perStream[r.s] += r.n
	}
	for _, st := range ss.streams {
		if perStream[st] != st.events.len() {
			t.Fatalf("stream %q: %d events, %d in append order", st.rec.Key, st.events.len(), perStream[st])
		}
	}
	if events != ss.events || bytes != ss.bytes || stale != int(ss.stale) || runs+stale != ss.order.len() {
		t.Fatalf("session counts events=%d bytes=%d stale=%d runs=%d; counted %d, %d, %d, %d",
			ss.events, ss.bytes, ss.stale, ss.order.len(), events, bytes, stale, runs+stale)
	}
}

// TestMemoryModel drives one session with random appends, terminal appends,
// new streams and the passage of time, and compares every stream with a
// plain model of the retention rules after each step. A second session must
// never change.
func TestMemoryModel(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { runModel(t, seed) })
		})
	}
}

type modelEvent struct {
	key  string
	seq  uint64
	size int
}

func runModel(t *testing.T, seed uint64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 42))
	ret := Retention{MaxEvents: 20, MaxBytes: 2000, TerminalGrace: 10 * time.Second}
	m := NewMemory(ret)
	mustCreate(t, m, "other", "o")
	mustAppend(t, m, "o", false, 50, 50, 50)
	mustCreate(t, m, "s")

	var (
		retained   []modelEvent // in append order
		last       = map[string]uint64{}
		terminalAt = map[string]time.Time{}
		gone       = map[string]bool{}
		keys       []string
	)
	expire := func(now time.Time) {
		for k, at := range terminalAt {
			if !gone[k] && now.Sub(at) >= ret.TerminalGrace {
				gone[k] = true
				retained = slices.DeleteFunc(retained, func(e modelEvent) bool { return e.key == k })
			}
		}
	}
	for step := range 400 {
		now := time.Now()
		expire(now)
		switch op := rng.IntN(10); {
		case op == 0 || len(keys) == 0:
			k := fmt.Sprintf("k%d", len(keys))
			mustCreate(t, m, "s", k)
			keys = append(keys, k)
		case op == 1:
			time.Sleep(time.Duration(rng.IntN(4000)) * time.Millisecond)
		default:
			k := keys[rng.IntN(len(keys))]
			terminal := rng.IntN(6) == 0
			sizes := make([]int, 1+rng.IntN(3))
			evs := make([]Event, len(sizes))
			for i := range sizes {
				sizes[i] = rng.IntN(300)
				if rng.IntN(30) == 0 {
					sizes[i] = 2500 // alone over MaxBytes
				}
				evs[i].Data = make([]byte, sizes[i])
			}
			_, err := m.Append(ctx, k, terminal, evs...)
			switch {
			case gone[k]:
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("step %d: Append to expired %q: %v", step, k, err)
				}
				continue
			case !terminalAt[k].IsZero():
				if !errors.Is(err, ErrTerminal) {
					t.Fatalf("step %d: Append to terminal %q: %v", step, k, err)
				}
				continue
			case err != nil:
				t.Fatalf("step %d: Append(%q): %v", step, k, err)
			}
			for _, n := range sizes {
				last[k]++
				retained = append(retained, modelEvent{k, last[k], n})
			}
			if terminal {
				terminalAt[k] = now
			}
			var bytes int64
			for _, e := range retained {
				bytes += int64(e.size)
			}
			for (len(retained) > ret.MaxEvents || bytes > ret.MaxBytes) && len(retained) > 1 {
				bytes -= int64(retained[0].size)
				retained = retained[1:]
			}
		}
		expire(time.Now())
		for _, k := range keys {
			rec, evs, err := m.Read(ctx, k, 0, 1000, nil)
			if gone[k] {
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("step %d: Read expired %q: %v", step, k, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("step %d: Read(%q): %v", step, k, err)
			}
			var want []uint64
			for _, e := range retained {
				if e.key == k {
					want = append(want, e.seq)
				}
			}
			got := make([]uint64, len(evs))
			for i, e := range evs {
				got[i] = e.Seq
			}
			wantFirst := last[k] + 1
			if len(want) > 0 {
				wantFirst = want[0]
			}
			if !slices.Equal(got, want) || rec.LastSeq != last[k] || rec.FirstSeq != wantFirst || rec.Terminal != !terminalAt[k].IsZero() {
				t.Fatalf("step %d: stream %q: record [%d,%d] terminal=%v seqs %v; want [%d,%d] terminal=%v seqs %v", step, k,
					rec.FirstSeq, rec.LastSeq, rec.Terminal, got, wantFirst, last[k], !terminalAt[k].IsZero(), want)
			}
		}
		checkInvariants(t, m.lookupSession("s"))
	}
	rec, evs, err := m.Read(ctx, "o", 0, 10, nil)
	if err != nil || rec.FirstSeq != 1 || len(evs) != 3 {
		t.Fatalf("other session changed: %+v, %d events, %v", rec, len(evs), err)
	}
}
