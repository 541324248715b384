package pebblestore

import (
	"bytes"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/storetest"
)

var payload150 = bytes.Repeat([]byte("e"), 150)

// BenchmarkAppend runs the append benchmark every store runs
// (storetest.BenchmarkAppend) under each sync policy, and reports
// events/fsync: WAL fsyncs during the timed appends (under SyncInterval,
// the periodic ones).
func BenchmarkAppend(b *testing.B) {
	for _, p := range []SyncPolicy{SyncAlways, SyncInterval, SyncNone} {
		b.Run(fmt.Sprintf("sync=%s", p), func(b *testing.B) {
			var fs *syncCountingFS // of the store open returned last
			storetest.BenchmarkAppend(b, func(b *testing.B) eventlog.Store {
				fs = newSyncCountingFS()
				st, err := open(filepath.Join(b.TempDir(), "log"), Options{Sync: p}, time.Now, fs)
				if err != nil {
					b.Fatal(err)
				}
				return st
			}, func(b *testing.B) func(int) {
				syncs := fs.syncs.Load()
				return func(events int) {
					if n := fs.syncs.Load() - syncs; n > 0 {
						b.ReportMetric(float64(events)/float64(n), "events/fsync")
					}
				}
			})
		})
	}
}

// BenchmarkReadAfterDeep reads 64 events from a cursor 10,000 events back in
// a 100,000-event stream: the resume path of a client that was away long.
func BenchmarkReadAfterDeep(b *testing.B) {
	const total, back, batch = 100_000, 10_000, 1000
	ctx := b.Context()
	st, err := Open(filepath.Join(b.TempDir(), "log"), Options{
		Sync:      SyncNone,
		Retention: eventlog.Retention{MaxEvents: 2 * total, MaxBytes: 1 << 30},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if err := st.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		b.Fatal(err)
	}
	if err := st.CreateStream(ctx, &eventlog.Stream{Key: "k", Session: "s", Generation: 1}); err != nil {
		b.Fatal(err)
	}
	evs := make([]eventlog.Event, batch)
	for range total / batch {
		for i := range evs {
			evs[i] = eventlog.Event{Data: payload150}
		}
		if _, err := st.Append(ctx, "k", false, evs...); err != nil {
			b.Fatal(err)
		}
	}
	var buf []eventlog.Event
	b.ReportAllocs()
	for b.Loop() {
		_, got, err := st.Read(ctx, "k", total-back, 64, buf)
		if err != nil || len(got) != 64 || got[0].Seq != total-back+1 {
			b.Fatalf("Read: %d events from %d, %v", len(got), got[0].Seq, err)
		}
		buf = got
	}
}

// BenchmarkOpenLargeLog measures start-up (Open and Close) with 200,000
// events of 150 bytes across 1,000 sessions of two streams each.
func BenchmarkOpenLargeLog(b *testing.B) {
	const sessions, perStream = 1000, 100
	ctx := b.Context()
	path := filepath.Join(b.TempDir(), "log")
	st, err := Open(path, Options{Sync: SyncNone})
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			evs := make([]eventlog.Event, perStream/4)
			for i := w; i < sessions; i += 32 {
				id := fmt.Sprint("s", i)
				if err := st.CreateSession(ctx, &eventlog.Session{ID: id, Incarnation: 1}); err != nil {
					b.Error(err)
					return
				}
				for _, k := range []string{id + "-get", id + "-post"} {
					if err := st.CreateStream(ctx, &eventlog.Stream{Key: k, Session: id, Generation: 1}); err != nil {
						b.Error(err)
						return
					}
				}
				for j := range 8 { // interleave the two streams in append order
					for e := range evs {
						evs[e] = eventlog.Event{Data: payload150}
					}
					if _, err := st.Append(ctx, id+[]string{"-get", "-post"}[j%2], false, evs...); err != nil {
						b.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		st, err := Open(path, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(sessions*2*perStream), "events")
}
