package storetest

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
)

// BenchmarkAppend is the append benchmark every store runs, so that their
// figures compare: 150-byte events at the default retention (once a session
// holds 10,000 events, every append also evicts), each writer on a session
// and stream of its own. Sub-benchmarks:
//
//   - batch=1, batch=32: one writer appending batches of that many events,
//     the cost of one Append call;
//   - writers=32, writers=256: that many concurrent writers appending single
//     events, throughput under contention.
//
// Each reports events/s. open returns a fresh, empty store at the default
// retention; BenchmarkAppend closes it. measure, if not nil, is called as the
// timed appends start; the function it returns is called when they end with
// the number of events appended, for a figure of the store's own
// (b.ReportMetric), such as events per fsync.
//
//	func BenchmarkAppend(b *testing.B) {
//		storetest.BenchmarkAppend(b, func(b *testing.B) eventlog.Store {
//			return eventlog.NewMemory(eventlog.Retention{})
//		}, nil)
//	}
func BenchmarkAppend(b *testing.B, open func(b *testing.B) eventlog.Store, measure func(b *testing.B) func(events int)) {
	for _, batch := range []int{1, 32} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { benchAppend(b, open, measure, 1, batch) })
	}
	for _, writers := range []int{32, 256} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) { benchAppend(b, open, measure, writers, 1) })
	}
}

var payload150 = bytes.Repeat([]byte("e"), 150)

// benchAppend appends b.N events, batch at a time, from writers goroutines.
func benchAppend(b *testing.B, open func(b *testing.B) eventlog.Store, measure func(b *testing.B) func(int), writers, batch int) {
	ctx := b.Context()
	st := open(b)
	defer func() {
		if err := st.Close(); err != nil {
			b.Errorf("Close: %v", err)
		}
	}()
	keys := make([]string, writers)
	for i := range keys {
		keys[i] = fmt.Sprint("bench-", i)
		if err := st.CreateSession(ctx, &eventlog.Session{ID: keys[i], Incarnation: 1}); err != nil {
			b.Fatal(err)
		}
		if err := st.CreateStream(ctx, &eventlog.Stream{Key: keys[i], Session: keys[i], Generation: 1}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var done func(int)
	if measure != nil {
		done = measure(b)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i, key := range keys {
		n := b.N / writers
		if i < b.N%writers {
			n++
		}
		wg.Go(func() {
			evs := make([]eventlog.Event, batch)
			for n > 0 {
				evs = evs[:min(batch, n)]
				for j := range evs {
					evs[j] = eventlog.Event{Data: payload150}
				}
				if _, err := st.Append(ctx, key, false, evs...); err != nil {
					b.Error(err)
					return
				}
				n -= len(evs)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	if done != nil {
		done(b.N)
	}
}
