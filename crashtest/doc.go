// Package crashtest provides the kill -9 crash tests of mcprelay's restart
// survival (docs/design.md: the decision table, restarts, the never-events): it holds no library code, only tests that
// build the mcprelay binary, run `mcprelay serve` on the disk store as a real
// process, kill it with SIGKILL at random moments while many sessions stream
// long tool calls, restart it on the same port and data directory, and check
// what every client receives when it resumes.
//
// Run them with the race detector (they take about half a minute and skip
// under -short):
//
//	export GOTOOLCHAIN=go1.27.3
//	go test -race -run Crash -v ./crashtest/
//
// What is checked, across every round: no event reaches a wrong session or
// stream; no event ID is delivered twice or reused for a different event,
// across restarts (never-event 4); progress arrives without a silent gap; every call
// ends, within a bound, in its result or in a -32001 error under its id
// after a backend_lost reset (never-event 5); every resume is answered within a
// bound; and, audited from the event log on disk after the last kill, each
// client received exactly what the log holds for its streams, so nothing
// durable was lost and nothing undurable was shown (--sync always).
//
// TestCrashTinyRetention runs the same with --retain-events 8 and clients
// that stop reading now and then: events behind their cursors are evicted,
// before and across restarts, and every jump a client sees (in sequence or
// in progress) must come right after a gap reset; the audit compares the
// log's tail. The run fails if no gap happened, or none across a restart.
//
// TestCrashSeqsNeverReused runs under each --sync policy: whatever a kill
// loses under interval or none, no event ID a client received may come to
// name another event, and a resume with the client's real last cursor is
// answered with the lost call's reset and error, never a 400.
package crashtest
