package pebblestore

import (
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The store is a prometheus.Collector of its WAL fsync latencies, which
// Pebble measures itself: one fsync serves every commit waiting for it,
// so a commit's latency is not an fsync's.
var _ prometheus.Collector = (*Store)(nil)

var descFsync = prometheus.NewDesc("mcprelay_store_fsync_seconds",
	"Latency of the disk store's WAL fsyncs (one fsync is shared by the appends of all sessions that commit together).", nil, nil)

// fsyncBounds are the bucket bounds reported, in nanoseconds: for each
// of a few round bounds, the smallest of Pebble's (100 fine buckets) at
// or above it, so that the cumulative counts are exact.
var fsyncBounds = func() []float64 {
	var out []float64
	for _, want := range []float64{1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 10} {
		i, _ := slices.BinarySearch(pebble.FsyncLatencyBuckets, want*1e9)
		if i < len(pebble.FsyncLatencyBuckets) && !slices.Contains(out, pebble.FsyncLatencyBuckets[i]) {
			out = append(out, pebble.FsyncLatencyBuckets[i])
		}
	}
	return out
}()

// Describe implements prometheus.Collector.
func (s *Store) Describe(ch chan<- *prometheus.Desc) { ch <- descFsync }

// Collect implements prometheus.Collector: mcprelay_store_fsync_seconds.
func (s *Store) Collect(ch chan<- prometheus.Metric) {
	var m dto.Metric
	if s.fsync == nil || s.fsync.Write(&m) != nil {
		return
	}
	h := m.GetHistogram()
	buckets := make(map[float64]uint64, len(fsyncBounds))
	for _, b := range h.GetBucket() {
		if slices.Contains(fsyncBounds, b.GetUpperBound()) {
			buckets[b.GetUpperBound()/1e9] = b.GetCumulativeCount()
		}
	}
	ch <- prometheus.MustNewConstHistogram(descFsync, h.GetSampleCount(), h.GetSampleSum()/1e9, buckets)
}
