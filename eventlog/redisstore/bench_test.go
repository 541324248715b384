package redisstore_test

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
	"github.com/mcprelay/mcprelay/eventlog/storetest"
)

var payload150 = bytes.Repeat([]byte("e"), 150)

// benchStore opens a store on a fresh server with one session and stream
// "k", and returns the server and the store's prefix too.
func benchStore(b *testing.B) (*redistest.Server, *redisstore.Store, string) {
	srv := redistest.Start(b)
	prefix := freshPrefix()
	st := open(b, srv, redisstore.Options{Prefix: prefix})
	if err := st.CreateSession(b.Context(), &eventlog.Session{ID: "s", Incarnation: 1}); err != nil {
		b.Fatal(err)
	}
	if err := st.CreateStream(b.Context(), &eventlog.Stream{Key: "k", Session: "s", Generation: 1}); err != nil {
		b.Fatal(err)
	}
	return srv, st, prefix
}

// BenchmarkAppend runs the append benchmark every store runs
// (storetest.BenchmarkAppend), each sub-benchmark on a fresh server.
func BenchmarkAppend(b *testing.B) {
	storetest.BenchmarkAppend(b, func(b *testing.B) eventlog.Store {
		srv := redistest.Start(b)
		st, err := redisstore.Open(b.Context(), redisstore.Options{URL: srv.URL(), Prefix: freshPrefix()})
		if err != nil {
			b.Fatalf("Open: %v", err)
		}
		return st
	}, nil)
}

// BenchmarkRead reads 256 events after a cursor in a 1,000-event stream.
func BenchmarkRead(b *testing.B) {
	_, st, _ := benchStore(b)
	evs := make([]eventlog.Event, 100)
	for range 10 {
		for i := range evs {
			evs[i] = eventlog.Event{Data: payload150}
		}
		if _, err := st.Append(b.Context(), "k", false, evs...); err != nil {
			b.Fatal(err)
		}
	}
	var buf []eventlog.Event
	b.ReportAllocs()
	for b.Loop() {
		_, got, err := st.Read(b.Context(), "k", 500, 256, buf)
		if err != nil || len(got) != 256 || got[0].Seq != 501 {
			b.Fatalf("Read: %d events, %v", len(got), err)
		}
		buf = got
	}
}

// BenchmarkWatchLatency measures, across two stores on one Redis, the time
// from the start of an Append on one to the wake of a watcher on the other.
func BenchmarkWatchLatency(b *testing.B) {
	srv, a, prefix := benchStore(b)
	w := open(b, srv, redisstore.Options{Prefix: prefix})
	wake, stop := w.Watch("k")
	defer stop()
	select {
	case <-wake: // subscribed
	case <-time.After(5 * time.Second):
		b.Fatal("no subscription")
	}
	lat := make([]time.Duration, 0, 1024)
	for b.Loop() {
		t0 := time.Now()
		if _, err := a.Append(b.Context(), "k", false, eventlog.Event{Data: payload150}); err != nil {
			b.Fatal(err)
		}
		select {
		case <-wake:
		case <-time.After(5 * time.Second):
			b.Fatal("no wake")
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}
