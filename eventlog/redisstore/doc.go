// Package redisstore provides an [eventlog.Store] on Redis (6.2 or later),
// shared by relay replicas: any replica can read any session's log, and
// leases with fencing tokens make sure that only the session's owner
// writes to it.
//
//	st, err := redisstore.Open(ctx, redisstore.Options{
//		URL:       "redis://redis.internal:6379/0", // or rediss:// for TLS
//		Retention: eventlog.Retention{MaxEvents: 10000},
//	})
//	if err != nil {
//		return err
//	}
//	defer st.Close()
//	lease, err := st.AcquireLease(ctx, sid, "http://replica-1:8080", 10*time.Second)
//	// ... renew it well before it runs out; on eventlog.ErrFenced, stop
//	// serving the session: another replica owns it.
//
// # Layout
//
// Every key of a session carries the session ID as its hash tag,
// "<prefix>:{<sid>}:...", so that in Redis Cluster a session lives in one
// slot and every operation on it is one script on one node. A stream's
// events are a Redis stream whose entry IDs are the event seqs ("<seq>-0"),
// so Read after a cursor is one XRANGE from after+1: O(log n + k). The
// stream key → session index, "<prefix>:x:<key>", is outside the tag (it
// may live on another node); a Store looks a key up once and caches it,
// since a key's session never changes. "<prefix>:used", a sorted set of
// session IDs by last use, is the index IdleSessions reads. See scripts.go
// for every key.
//
// # Atomicity
//
// CreateSession, UpdateSession, DeleteSession, CreateStream and Append
// are each one Lua script, so Redis applies each whole or not at all, in
// one AOF and replication record; Append adds the events, updates the
// stream and session counters, evicts the session's oldest events and
// drops its terminal streams whose grace has passed, all in one script.
// Read is one MULTI/EXEC. Only CreateStream and DeleteSession also touch
// the index outside the session's slot, in separate commands: a crash
// between the two leaves at worst an index entry without a stream, which
// CreateStream repairs when the key is used again. The session writes
// likewise update "<prefix>:used" after their script: a crash between the
// two leaves a session unindexed (never listed idle) or an entry without a
// session (IdleSessions drops it).
//
// # Retention
//
// As the memory store: per session, MaxEvents and MaxBytes across its
// streams, oldest first in the session's append order (kept as a
// run-length list), never another session's events, the newest event
// always kept. A terminal stream is invisible to readers once its grace
// has passed (measured on the Redis clock, so on one clock for every
// replica) and is dropped by its session's next append; its index entry
// expires by itself a minute after the grace.
//
// # Leases and fencing
//
// AcquireLease makes a replica the session's owner and gives it a token
// from the session's fencing counter, which only grows. A lease lives as
// long as its owner's heartbeat, a key with a TTL that renewing any of the
// owner's leases refreshes: a replica holding thousands of leases renews
// them all with one script (lease.go says how a lapse is handled). Once a
// session has a fencing counter, every write to it (CreateSession,
// CreateStream, Append, UpdateSession; not DeleteSession) is accepted
// only from a Store holding the session's current token, which it passes
// to the script: a replica that paused past its lease while another took
// over gets eventlog.ErrFenced, even if it never noticed it lost the
// lease. Sessions without a lease are not fenced.
//
// # Live notification
//
// Every Append publishes the stream's new LastSeq to "<prefix>:w:<key>";
// Watch wakes readers in any replica. Pub/sub is at most once, so readers
// must still re-read periodically.
//
// # What a Redis restart or failover can lose
//
// The store is as durable as Redis is configured to be. With appendonly
// yes and appendfsync always nothing acknowledged is lost; with everysec
// up to about the last second or two, even when only redis-server is
// killed; without persistence, or after a failover to a replica that
// lagged, more.
// What is lost is always a suffix of whole scripts: a stream's seq counter
// and its events are lost together, never one without the other. A Store
// remembers the highest seq it has seen of each stream; if it then finds a
// stream behind that mark, it never hands out the lost seqs again: the
// next append skips past them and drops the stream's retained events, so
// that clients behind the mark see a hole rather than silently different
// events under seqs they may hold. An append that ran but whose answer
// was lost (Redis killed before replying, a cut connection) is not run
// twice when the caller retries it with the same events: each append
// carries a batch ID, which the retry reuses, and the script skips a
// batch the stream's last append carried. If everything is lost, the relay secret
// (LoadOrCreateSecret) is created anew and every event ID minted before
// stops verifying.
package redisstore
