// Package boltstore provides an [eventlog.Store] in one embedded bbolt file,
// so that sessions, streams and their events survive a process restart.
//
//	st, err := boltstore.Open(filepath.Join(dataDir, "eventlog.db"), boltstore.Options{
//		Retention: eventlog.Retention{MaxEvents: 10000},
//		Sync:      boltstore.SyncAlways, // the default
//	})
//	if err != nil {
//		return err
//	}
//	defer st.Close()
//	last, err := st.Append(ctx, key, false, eventlog.Event{Data: msg}) // durable when it returns
//
// # Writes: one writer, group commit
//
// Every mutation is handed to a single writer goroutine, which gathers all
// that is pending (from every session) into one bbolt transaction, commits it
// and only then completes the callers. Under SyncAlways the commit is bbolt's
// own two-phase sync (data pages, then the meta page), so many appends share
// one commit and its fsyncs; appends of one stream keep their order because
// the queue is FIFO. Readers use bbolt snapshots; a snapshot is never opened
// while a commit is in progress, so under SyncAlways no reader sees an event
// before it is durable.
//
// # What a crash can lose
//
//   - SyncAlways: nothing that an Append (or any other method) reported as
//     done, whether the process is killed or the machine loses power. Calls
//     still waiting for their commit may or may not be in the file.
//   - SyncInterval: commits are not fsynced one by one; the writer fsyncs
//     about every Options.Interval. A killed process loses nothing that was
//     committed (the OS still writes it); an OS crash or power loss loses
//     about the last Interval of acknowledged writes and, as with any bbolt
//     file written without sync, may leave a file bbolt cannot open.
//   - SyncNone: as SyncInterval for a killed process; after an OS crash or
//     power loss anything not yet written back by the OS is lost and the file
//     may be unusable. For tests and benchmarks.
//
// A failed write or fsync poisons the store (every later write fails with
// [ErrFailed]) because the in-memory retention state no longer matches the
// file; reopening the file recovers the last committed state.
//
// # Layout
//
// Sessions and streams get a numeric id from their bucket's sequence. Events
// live under streamNum|seq (big-endian), so Read after a cursor is one cursor
// Seek plus k Next calls, O(log n + k). A per-session index
// (sessNum|streamNum → key) serves Streams and DeleteSession, and a
// per-session append-order bucket (sessNum|ord → streamNum, n) records runs
// of events in append order, which is all eviction needs. Stream records
// carry FirstSeq, LastSeq, Terminal, the terminal time and the retained byte
// count, so Open rebuilds every session's counters from the stream and order
// buckets without reading events.
//
// # Retention
//
// The writer keeps each session's event and byte counts and its run list in
// memory and evicts the session's oldest events (across its streams, in
// append order) inside the append's own transaction, reading each evicted
// event only for its size. Terminal streams whose grace has passed are
// invisible to readers at once, dropped by the next append to their session,
// and deleted by a background step of the writer that removes at most about
// 16k events per transaction, interleaved with append batches so appends wait
// for at most one such step. Grace is measured on the wall clock and so
// continues across restarts.
package boltstore
