// Package pebblestore provides an [eventlog.Store] in one embedded Pebble
// (LSM) directory, so that sessions, streams and their events survive a
// process restart. It is mcprelay's disk store: measured against a bbolt
// store with the same design (since removed), it committed 2 to 4 times
// more durable events per second with many sessions appending at once,
// because Pebble's WAL shares one fsync among concurrent commits where
// bbolt rewrote a page per touched stream and session.
//
//	st, err := pebblestore.Open(filepath.Join(dataDir, "eventlog"), pebblestore.Options{
//		Retention: eventlog.Retention{MaxEvents: 10000},
//		Sync:      pebblestore.SyncAlways, // the default
//	})
//	if err != nil {
//		return err
//	}
//	defer st.Close()
//	last, err := st.Append(ctx, key, false, eventlog.Event{Data: msg}) // durable when it returns
//
// # Writes: one batch per call, group commit in the WAL
//
// Each mutation builds one Pebble batch (events, the stream record, the
// append-order run, any evictions) and commits it itself; under SyncAlways
// with pebble.Sync. Pebble's commit pipeline gathers the batches that are
// waiting for the WAL into one fsync, so appends of many sessions share
// fsyncs without a writer goroutine of our own. A session's writes are
// serialised by a per-session mutex held across the commit, so one stream's
// appends keep their order and consecutive seqs, and the in-memory
// retention state always matches what was committed.
//
// Pebble makes a batch visible to its readers before its WAL fsync ends.
// So that under SyncAlways no reader sees an event before it is durable,
// readers never take the latest state from Pebble alone: each stream's
// record (FirstSeq, LastSeq, Terminal) is published in memory only after
// its batch's commit returned, and Read iterates only up to the published
// LastSeq. Session records are read from Pebble under a per-session lock
// that UpdateSession holds across its commit.
//
// # What a crash can lose
//
//   - SyncAlways: nothing that an Append (or any other method) reported as
//     done, whether the process is killed or the machine loses power.
//   - SyncInterval: writes are not fsynced one by one; a background
//     goroutine fsyncs the WAL about every Options.Interval. An OS crash or
//     power loss loses about the last Interval of acknowledged writes. A
//     killed process can lose the few writes still in Pebble's WAL buffer
//     (its flusher writes them to the OS within microseconds to
//     milliseconds).
//   - SyncNone: as SyncInterval without the periodic fsync. For tests and
//     benchmarks.
//
// Pebble recovers from its WAL at Open in every case; a torn tail is
// dropped, never a partial batch applied.
//
// # Seqs are never reused
//
// A client may hold the ID of an event that a crash then lost. So that no
// later event gets that ID, a stream's seqs never run more than seqReserve
// (65536) ahead of what is durable: under SyncInterval and SyncNone an
// append that would pass the stream's last synced LastSeq by more is
// committed with an fsync (one extra fsync per 65536 events of a busy
// stream; a stream with fewer events never causes one). The store records
// at Open (fsynced) which policy it runs with and at Close that it closed
// cleanly. When Open finds that the last process ran with a relaxed policy
// and did not close, every unfinished stream reports the LastSeq it holds,
// and its next append starts at that LastSeq + seqReserve + 1 (and is
// fsynced, by the rule above). Until every such stream has made that skip,
// the store stays marked as crashed (a clean Close leaves the mark), so a
// later process, whatever its policy, skips them too. The skipped seqs are a hole that holds no
// event: Read returns the events on both sides as usual, a cursor inside
// it reads on from the first event after it, and retention counts only
// events. Under SyncAlways nothing acknowledged can be lost, and nothing
// is skipped.
//
// A failed commit poisons the store (every later write fails with
// [ErrFailed], which wraps eventlog.ErrUnavailable) because the in-memory
// retention state no longer matches the database; reads are still served,
// and reopening the directory recovers the last committed state. Pebble's
// fatal errors (a WAL or MANIFEST write failing on a full disk, often in
// Pebble's own goroutines) do the same instead of ending the process. An
// Open whose recovery keeps failing (Pebble retries the flush of the
// recovered WAL at once, forever) gives up after a few failures and
// returns the error.
//
// # Layout
//
// Sessions and streams get a number at creation. Keys start with one kind
// byte; integers are big-endian:
//
//	"S" sessionID                  → sessNum | session fields
//	"i" sessNum streamNum          → stream identity (generation, key, request ID), written once
//	"s" sessNum streamNum          → stream counters (FirstSeq, LastSeq, terminal time, bytes)
//	"o" sessNum ord                → streamNum | n: a run of n events in the session's append order
//	"e" sessNum streamNum seq      → type | data
//
// An append rewrites only the small "s" counters and one "o" run besides
// its events: the request ID, which the client chooses and may be large,
// is never written again after CreateStream.
//
// Read after a cursor is one bounded iterator SeekGE plus k Next calls,
// O(log n + k), except that the events of each stream's last append are
// also published in memory with its record, within a store-wide budget
// (tail.go): a reader following a stream gets what was just appended
// without an iterator. Streams is answered from memory. DeleteSession is four
// range deletions plus one point deletion, whatever the session holds.
// Open reads the "S", "i", "s" and "o" records, never events, to rebuild
// every session's counters and append-order runs. A format 1 directory
// (identity inside the "s" record) is upgraded at Open.
//
// # Retention
//
// Each session's event and byte counts and its run list (with the sizes
// of the events appended since Open) are kept in memory; an append evicts
// the session's oldest events, across its streams in append order, inside
// its own batch. Only the sizes of events stored before Open are read from
// Pebble, when eviction reaches them. Runs of 16 or more evicted events of
// one stream are deleted with one range tombstone.
//
// Terminal streams whose grace has passed are invisible to readers at once,
// dropped by the next write to their session, and otherwise by a
// background goroutine (stopped by Close) that drops them one session at a
// time in small unsynced batches, deleting a stream's events with a range
// tombstone. Grace is measured on the wall clock and so continues across
// restarts.
//
// # Deleted sessions cost nothing
//
// A deleted session leaves nothing in memory (its terminal streams leave
// the expiry heap at once). On disk, its range deletions would free space
// only when Pebble happens to compact over them, so once 16 MiB of events
// were deleted with their sessions or streams, and at least half the disk
// usage, the background goroutine compacts the whole key space. The
// memtable is 8 MiB: Pebble preallocates each WAL at about 1.1 × its size
// and keeps a few WALs for reuse, so the memtable size is the data
// directory's floor (about 33 MB of WALs with 8 MiB; 264 MB with 64 MiB).
//
// # Reading a stopped store
//
// Options.ReadOnly opens a directory for reading (ListSessions, Read,
// Streams, Session) without writing anything to it: Pebble replays its WAL
// in memory, and the store skips its start-up marks, expiry and
// compaction. Pebble locks the directory even then, so a store another
// process has open cannot be read.
package pebblestore
