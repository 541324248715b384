package pebblestore

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/mcprelay/mcprelay/eventlog"
)

// crashFS is a file system that can lose what was not fsynced.
type crashFS struct {
	t  *testing.T
	fs *vfs.MemFS
}

const crashDir = "log"

func newCrashFS(t *testing.T) *crashFS {
	fs := vfs.NewCrashableMem()
	if err := fs.MkdirAll(crashDir, 0o700); err != nil {
		t.Fatal(err)
	}
	return &crashFS{t: t, fs: fs}
}

func (c *crashFS) open(p SyncPolicy, r eventlog.Retention) *Store {
	c.t.Helper()
	s, err := open(crashDir, Options{Sync: p, Interval: time.Hour, Retention: r}, time.Now, c.fs)
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

// crash returns the store's file system as a crash at this moment could
// leave it (keeping each unsynced write with probability keep%), and
// closes s against the old one.
func (c *crashFS) crash(s *Store, keep int, rng *rand.Rand) {
	clone := c.fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: keep, RNG: rng})
	s.Close()
	c.fs = clone
}

// TestSeqsNeverReusedAfterCrash: whatever a crash loses, a stream never
// hands out again a seq it handed out before the crash (a client may hold
// an event ID with it), under every sync policy; under SyncAlways, which
// loses nothing, it skips none. Eviction and reopening work across the
// holes the skipping leaves.
func TestSeqsNeverReusedAfterCrash(t *testing.T) {
	defer func(n uint64) { seqReserve = n }(seqReserve)
	seqReserve = 256 // so that rounds pass it: the forced fsync is exercised
	for _, p := range []SyncPolicy{SyncAlways, SyncInterval, SyncNone} {
		for _, keep := range []int{0, 50} {
			t.Run(fmt.Sprintf("%v/keep %d%%", p, keep), func(t *testing.T) {
				ctx := t.Context()
				rng := rand.New(rand.NewPCG(uint64(keep), 1))
				ret := eventlog.Retention{MaxEvents: 3000}
				c := newCrashFS(t)
				s := c.open(p, ret)
				if err := s.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
					t.Fatal(err)
				}
				for _, key := range []string{"a", "b"} {
					if err := s.CreateStream(ctx, &eventlog.Stream{Key: key, Session: "s", Generation: 1}); err != nil {
						t.Fatal(err)
					}
				}
				s.Close() // a clean start: the session and streams are durable
				handed := map[string][]uint64{}
				data := map[string]map[uint64]string{"a": {}, "b": {}}
				for round := range 3 {
					s = c.open(p, ret)
					for _, key := range []string{"a", "b"} {
						// More than seqReserve appends in some rounds.
						n := 10 + rng.IntN(int(2*seqReserve))
						for i := range n {
							ev := eventlog.Event{Data: fmt.Appendf(nil, "%s r%d e%d", key, round, i)}
							last, err := s.Append(ctx, key, false, ev)
							if err != nil {
								t.Fatal(err)
							}
							if prev := handed[key]; len(prev) > 0 && last <= prev[len(prev)-1] {
								t.Fatalf("round %d: stream %s handed out seq %d after %d", round, key, last, prev[len(prev)-1])
							}
							if p == SyncAlways && len(handed[key]) > 0 && last != handed[key][len(handed[key])-1]+1 {
								t.Fatalf("round %d, SyncAlways: stream %s skipped from %d to %d", round, key, handed[key][len(handed[key])-1], last)
							}
							handed[key] = append(handed[key], last)
							data[key][last] = string(ev.Data)
						}
					}
					c.crash(s, keep, rng)
				}
				s = c.open(p, ret)
				defer s.Close()
				total := 0
				lasts := map[string]uint64{}
				for _, key := range []string{"a", "b"} {
					last, err := s.Append(ctx, key, false, eventlog.Event{Data: []byte("after")})
					if err != nil {
						t.Fatal(err)
					}
					if h := handed[key]; last <= h[len(h)-1] {
						t.Errorf("stream %s: after the crash Append returned seq %d, already handed out (last was %d)", key, last, h[len(h)-1])
					}
					lasts[key] = last
				}
				for _, key := range []string{"a", "b"} {
					last := lasts[key]
					// Every retained event is one that was handed out with
					// that seq, and a cursor in a hole reads on without a
					// reported eviction.
					rec, evs, err := s.Read(ctx, key, 0, 1<<20, nil)
					if err != nil {
						t.Fatal(err)
					}
					for _, e := range evs[:len(evs)-1] {
						if want, ok := data[key][e.Seq]; !ok || want != string(e.Data) {
							t.Fatalf("stream %s: seq %d reads %q, was handed out as %q", key, e.Seq, e.Data, want)
						}
					}
					if !slices.IsSortedFunc(evs, func(a, b eventlog.Event) int { return int(a.Seq) - int(b.Seq) }) || evs[len(evs)-1].Seq != last || rec.LastSeq != last {
						t.Errorf("stream %s: record %+v, events end at %d, want %d", key, rec, evs[len(evs)-1].Seq, last)
					}
					if len(evs) > 1 {
						cursor := evs[len(evs)-2].Seq
						if cursor+1 < last {
							cursor++ // in the hole
						}
						rec2, evs2, err := s.Read(ctx, key, cursor, 10, nil)
						if err != nil || len(evs2) != 1 || evs2[0].Seq != last || rec2.FirstSeq != rec.FirstSeq {
							t.Errorf("stream %s: Read after %d: %+v, %v, %v; want the last event and FirstSeq %d", key, cursor, rec2, seqs(evs2), err, rec.FirstSeq)
						}
					}
					total += len(evs)
				}
				// Retention counts retained events, not the seqs skipped.
				if total > ret.MaxEvents {
					t.Errorf("%d events retained, MaxEvents %d", total, ret.MaxEvents)
				}
				s.ss(t, "s", total)
			})
		}
	}
}

func seqs(evs []eventlog.Event) []uint64 {
	out := make([]uint64, len(evs))
	for i, e := range evs {
		out[i] = e.Seq
	}
	return out
}

// ss checks the session's in-memory event count.
func (s *Store) ss(t *testing.T, id string, want int) {
	t.Helper()
	ss := s.session(id)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.events != want {
		t.Errorf("session %s counts %d retained events, Read returns %d", id, ss.events, want)
	}
}

// TestSeqSkipSurvivesLaterRuns: a stream that a relaxed-policy crash left
// behind must still skip its seqs when it is next appended to, even if
// processes in between (under any policy) never appended to it, crashed
// or closed cleanly.
func TestSeqSkipSurvivesLaterRuns(t *testing.T) {
	cases := []struct {
		name   string
		policy SyncPolicy // of the run in between
		clean  bool       // whether the run in between closed cleanly
	}{
		{"always, clean close", SyncAlways, true},
		{"always, crash", SyncAlways, false},
		{"interval, clean close", SyncInterval, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			c := newCrashFS(t)
			s := c.open(SyncNone, eventlog.Retention{})
			if err := s.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{"a", "b"} {
				if err := s.CreateStream(ctx, &eventlog.Stream{Key: key, Session: "s", Generation: 1}); err != nil {
					t.Fatal(err)
				}
			}
			s.Close()
			s = c.open(SyncNone, eventlog.Retention{})
			var handed uint64
			for range 20 {
				var err error
				if handed, err = s.Append(ctx, "b", false, eventlog.Event{Data: []byte("x")}); err != nil {
					t.Fatal(err)
				}
			}
			c.crash(s, 0, nil) // loses b's 20 events

			s = c.open(tc.policy, eventlog.Retention{})
			if _, err := s.Append(ctx, "a", false, eventlog.Event{Data: []byte("y")}); err != nil {
				t.Fatal(err)
			}
			if tc.clean {
				s.Close()
			} else {
				c.crash(s, 0, nil)
			}

			s = c.open(SyncAlways, eventlog.Retention{})
			defer s.Close()
			last, err := s.Append(ctx, "b", false, eventlog.Event{Data: []byte("z")})
			if err != nil {
				t.Fatal(err)
			}
			if last <= handed {
				t.Errorf("stream b handed out seq %d again (it handed out up to %d before the crash)", last, handed)
			}
		})
	}
}
