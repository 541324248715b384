package eventlog_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.RunWith(t, func(t *testing.T, r eventlog.Retention) eventlog.Store {
		return eventlog.NewMemory(r)
	}, storetest.Options{Synctest: true})
}

func TestMemoryClosed(t *testing.T) {
	m := eventlog.NewMemory(eventlog.Retention{})
	ctx := t.Context()
	if err := m.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	if err := m.CreateStream(ctx, &eventlog.Stream{Key: "k", Session: "s", Generation: 1}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // Close is idempotent
		if err := m.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	cases := []struct {
		name string
		op   func() error
	}{
		{"Session", func() error { _, err := m.Session(ctx, "s"); return err }},
		{"CreateSession", func() error { return m.CreateSession(ctx, &eventlog.Session{ID: "t"}) }},
		{"Append", func() error { _, err := m.Append(ctx, "k", false, eventlog.Event{}); return err }},
		{"Read", func() error { _, _, err := m.Read(ctx, "k", 0, 1, nil); return err }},
		{"Streams", func() error { _, err := m.Streams(ctx, "s"); return err }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.op(); err == nil {
				t.Errorf("%s after Close succeeded", tc.name)
			}
		})
	}
}

// TestMemoryHeapPerSession measures the heap an idle session costs: its
// record (with realistic field sizes) and one standalone stream without events.
func TestMemoryHeapPerSession(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 10,000 sessions")
	}
	const n = 10000
	ctx := context.Background()
	params := []byte(`{"protocolVersion":"2025-06-18","capabilities":{"roots":{"listChanged":true},"sampling":{}},"clientInfo":{"name":"example-client","version":"1.2.3"}}`)
	ids := make([]string, n)
	keys := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%032x", i)  // 128-bit session ID, hex
		keys[i] = fmt.Sprintf("%024x", i) // 96-bit stream key
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m := eventlog.NewMemory(eventlog.Retention{})
	for i := range n {
		s := &eventlog.Session{
			ID:               ids[i],
			Principal:        "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8",
			ProtocolVersion:  "2025-06-18",
			InitializeParams: params,
			Incarnation:      1,
		}
		if err := m.CreateSession(ctx, s); err != nil {
			t.Fatal(err)
		}
		if err := m.CreateStream(ctx, &eventlog.Stream{Key: keys[i], Session: ids[i], Generation: 1}); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(m)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("heap per idle session with one standalone stream: %.0f bytes (InitializeParams %d bytes)", per, len(params))
	if per > 2048 {
		t.Errorf("idle session costs %.0f heap bytes, budget is 2048", per)
	}
}

// BenchmarkMemoryAppend runs the append benchmark every store runs
// (storetest.BenchmarkAppend).
func BenchmarkMemoryAppend(b *testing.B) {
	storetest.BenchmarkAppend(b, func(b *testing.B) eventlog.Store {
		return eventlog.NewMemory(eventlog.Retention{})
	}, nil)
}

// BenchmarkMemoryReadAfter reads after a cursor 10,000 events back in a
// 100,000-event stream: max=100 measures locating the cursor, max=10000 the
// copy of everything after it.
func BenchmarkMemoryReadAfter(b *testing.B) {
	const total, back = 100_000, 10_000
	ctx := context.Background()
	m := eventlog.NewMemory(eventlog.Retention{MaxEvents: 2 * total, MaxBytes: 1 << 30})
	defer m.Close()
	if err := m.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		b.Fatal(err)
	}
	if err := m.CreateStream(ctx, &eventlog.Stream{Key: "k", Session: "s", Generation: 1}); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 150)
	batch := make([]eventlog.Event, 1000)
	for range total / len(batch) {
		for i := range batch {
			batch[i] = eventlog.Event{Data: data}
		}
		if _, err := m.Append(ctx, "k", false, batch...); err != nil {
			b.Fatal(err)
		}
	}
	for _, max := range []int{100, back} {
		b.Run(fmt.Sprintf("max=%d", max), func(b *testing.B) {
			buf := make([]eventlog.Event, 0, max)
			b.ReportAllocs()
			for b.Loop() {
				rec, evs, err := m.Read(ctx, "k", total-back, max, buf)
				if err != nil || len(evs) != max || rec.LastSeq != total || evs[0].Seq != total-back+1 {
					b.Fatalf("Read = %d events from %d, LastSeq %d, %v", len(evs), evs[0].Seq, rec.LastSeq, err)
				}
				buf = evs
			}
			b.ReportMetric(float64(b.N*max)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// TestMemorySize: Size is exactly the retained event data plus the
// records' initialize params and recorded requests, through appends,
// eviction, expiry of terminal streams, updates and deletion.
func TestMemorySize(t *testing.T) {
	ctx := t.Context()
	m := eventlog.NewMemory(eventlog.Retention{MaxBytes: 100, TerminalGrace: time.Nanosecond})
	want := func(n int64) {
		t.Helper()
		if got, err := m.Size(ctx); err != nil || got != n {
			t.Fatalf("Size = %d, %v; want %d", got, err, n)
		}
	}
	want(0)
	params := json.RawMessage(`{"protocolVersion":"2025-06-18"}`) // 32 bytes
	if err := m.CreateSession(ctx, &eventlog.Session{ID: "s", Incarnation: 1, InitializeParams: params}); err != nil {
		t.Fatal(err)
	}
	want(32)
	for _, k := range []string{"a", "b"} {
		if err := m.CreateStream(ctx, &eventlog.Stream{Key: k, Session: "s", Generation: 1}); err != nil {
			t.Fatal(err)
		}
	}
	m.Append(ctx, "a", false, eventlog.Event{Data: make([]byte, 40)}, eventlog.Event{Data: make([]byte, 40)})
	want(32 + 80)
	m.Append(ctx, "b", false, eventlog.Event{Data: make([]byte, 50)}) // evicts one of a's: 90 retained
	want(32 + 90)
	rec, _ := m.Session(ctx, "s")
	rec.Replay = []json.RawMessage{json.RawMessage(`{"x":1}`)} // 7 bytes
	m.UpdateSession(ctx, rec)
	want(32 + 7 + 90)
	m.Append(ctx, "b", true, eventlog.Event{Data: make([]byte, 10)}) // terminal, already past its grace
	m.Append(ctx, "a", false, eventlog.Event{Data: make([]byte, 1)}) // drops b (60 bytes)
	want(32 + 7 + 41)
	if err := m.DeleteSession(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	want(0)
}
