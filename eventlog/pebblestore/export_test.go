package pebblestore

import (
	"fmt"
	"time"
)

// Settle flushes Pebble's memtable, which starts a new WAL, and waits up to
// timeout until no flush or compaction runs. A test that measures the heap
// calls it first: the WAL's writer keeps the 32 KiB blocks it queued at
// its busiest until the WAL is replaced (3-10 MB when the machine was busy,
// which made TestSessionChurn see growth where there was none), and a
// compaction holds buffers while it runs.
func (s *Store) Settle(timeout time.Duration) error {
	if err := s.db.Flush(); err != nil {
		return err
	}
	for deadline := time.Now().Add(timeout); ; time.Sleep(10 * time.Millisecond) {
		m := s.db.Metrics()
		if m.Compact.NumInProgress == 0 && m.Flush.NumInProgress == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pebble still flushing or compacting after %v", timeout)
		}
	}
}

// DropTails forgets every stream's published tail, so that Read finds
// every event in Pebble.
func (s *Store) DropTails() {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, st := range s.streams {
		st.pubMu.Lock()
		st.pubTail = nil
		st.pubMu.Unlock()
	}
}

// TailBytes is what the published tails hold: Data and per-event cost.
func (s *Store) TailBytes() (n int64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, st := range s.streams {
		st.pubMu.Lock()
		for _, e := range st.pubTail {
			n += int64(len(e.Data)) + eventOverhead
		}
		st.pubMu.Unlock()
	}
	return n
}

// TailBudget is tailBudget.
const TailBudget = tailBudget
