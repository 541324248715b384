// Package eventlog provides the relay's durable state: session records, the
// streams of each session, and the SSE events logged on every stream, so that
// a client that loses its connection can resume (docs/design.md).
//
// The package defines the [Store] interface (the union of [Sessions] and
// [Log]), the sentinel errors callers branch on, the per-session [Retention]
// budget every store enforces, and [Memory], the bounded in-memory store used
// by default. Persistent stores live in their own packages and must all pass
// the conformance suite in package storetest.
//
//	st := eventlog.NewMemory(eventlog.Retention{}) // defaults: 10000 events, 8 MiB, 5m grace
//	_ = st.CreateSession(ctx, &eventlog.Session{ID: sid, Incarnation: 1, Created: time.Now()})
//	_ = st.CreateStream(ctx, &eventlog.Stream{Key: key, Session: sid, Generation: 1})
//	last, _ := st.Append(ctx, key, false, eventlog.Event{Data: msg})
//	rec, evs, _ := st.Read(ctx, key, cursor, 64, nil) // events with Seq > cursor
//	if cursor+1 < rec.FirstSeq {
//		// eviction hole: the relay sends a reset before evs
//	}
//
// # Sequences, terminal streams and retention
//
// A stream's events carry consecutive sequence numbers starting at 1, assigned
// by the store on [Log.Append]. The event appended with terminal=true is the
// stream's last; later appends fail with [ErrTerminal]. Retention is counted
// per session, never globally, so one tenant cannot evict another's history:
// when a session exceeds [Retention.MaxEvents] or [Retention.MaxBytes], the
// session's oldest events in append order (across all its streams) are
// dropped and those streams' FirstSeq advances. A terminal stream is dropped
// entirely (record and events) once [Retention.TerminalGrace] has passed
// since its terminal append.
//
// # Ownership of bytes
//
// Stores may keep the slices they are given and hand them back without
// copying: after Append, callers must not modify an [Event]'s Data, and
// callers of Read must not modify the Data of the events returned, nor the
// RequestID of returned [Stream] records. Session records are always copied
// in and out.
//
// # Memory store layout
//
// [Memory] shards its session and stream indexes over fixed lock shards and
// locks each session separately, so Append and Read of different sessions do
// not contend. A stream's retained events sit in a ring buffer indexed by
// seq-FirstSeq, so Read after a cursor is O(1) to locate plus O(k) to copy.
// Each session keeps a run-length list of which stream each of its events
// went to, in append order, which is all eviction needs. Expired terminal
// streams are dropped lazily when their session is touched and by a sweep
// that Append triggers at most every TerminalGrace/64 (clamped), visiting one
// lock shard at a time; there is no background goroutine.
package eventlog
