package pebblestore_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
)

// TestFsyncMetric: appends under SyncAlways are counted in
// mcprelay_store_fsync_seconds, in seconds, with cumulative buckets.
func TestFsyncMetric(t *testing.T) {
	st, err := pebblestore.Open(t.TempDir(), pebblestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mustCreate(t, st, map[string][]string{"s": {"k"}})
	const appends = 5
	for range appends {
		mustAppend(t, st, "k", false, "{}")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(st)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "mcprelay_store_fsync_seconds" {
		t.Fatalf("families %v, want mcprelay_store_fsync_seconds", mfs)
	}
	h := mfs[0].GetMetric()[0].GetHistogram()
	if h.GetSampleCount() < appends {
		t.Errorf("%d fsyncs counted after %d synced appends", h.GetSampleCount(), appends)
	}
	// Seconds, not nanoseconds: an fsync takes far less than a minute.
	if mean := h.GetSampleSum() / float64(h.GetSampleCount()); mean <= 0 || mean > 60 {
		t.Errorf("mean fsync %v s", mean)
	}
	var prevBound float64
	var prevCount uint64
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() <= prevBound || b.GetCumulativeCount() < prevCount || b.GetCumulativeCount() > h.GetSampleCount() {
			t.Errorf("bucket %v ≤ %v after %v ≤ %v (of %d)", b.GetUpperBound(), b.GetCumulativeCount(), prevBound, prevCount, h.GetSampleCount())
		}
		prevBound, prevCount = b.GetUpperBound(), b.GetCumulativeCount()
	}
	if n := len(h.GetBucket()); n < 10 || n > 20 {
		t.Errorf("%d buckets", n)
	}
}

// TestRetainedAfterReopen: the totals are rebuilt when the store opens.
func TestRetainedAfterReopen(t *testing.T) {
	dir := t.TempDir()
	st, err := pebblestore.Open(dir, pebblestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, st, map[string][]string{"s": {"k"}})
	mustAppend(t, st, "k", false, "abc", "de")
	st.Close()
	if st, err = pebblestore.Open(dir, pebblestore.Options{}); err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if e, b := st.Retained(); e != 2 || b != 5 {
		t.Errorf("Retained() after reopening = %d, %d; want 2, 5", e, b)
	}
}

// Ready: nil while the store takes writes, an error once it is closed.
func TestReady(t *testing.T) {
	st, err := pebblestore.Open(t.TempDir(), pebblestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Ready(t.Context()); err != nil {
		t.Fatalf("Ready on an open store: %v", err)
	}
	st.Close()
	if err := st.Ready(t.Context()); err == nil {
		t.Fatal("Ready on a closed store: nil")
	}
}
