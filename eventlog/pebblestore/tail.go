package pebblestore

import (
	"slices"
	"sync"

	"github.com/mcprelay/mcprelay/eventlog"
)

// A reader following a stream asks for what was just appended to it: a
// relay's client connection reads each event right after the pump's
// append commits. Answering that from Pebble means an iterator per read
// (about a fifth of the disk store's CPU in a tool-call round trip), so
// every stream publishes the events of its last append with its record
// (stream.pubTail), and Read serves a cursor inside them from memory.
//
// A tail is only a cache: dropping it changes nothing but where Read
// finds the events. tailCache bounds what tails hold across the store;
// beyond tailBudget the oldest are dropped, so the memory of idle
// sessions (whose last append may be minutes old) does not grow with
// them.
const (
	// tailBudget bounds the bytes of the tails kept, across the store.
	tailBudget = 256 << 10
	// tailMax is the largest append whose events are kept as a tail.
	tailMax = 64 << 10
	// eventOverhead is what a tail costs per event besides its Data.
	eventOverhead = 64
)

// tailOf returns the tail of an append of events (n bytes of Data): a
// copy of the slice, whose Data the store keeps as given, as the memory
// store does (eventlog.Event: callers never modify it). nil if the append
// is too large to keep.
func tailOf(events []eventlog.Event, n int64) []eventlog.Event {
	if len(events) == 0 || n+int64(len(events))*eventOverhead > tailMax {
		return nil
	}
	return slices.Clone(events)
}

// tailCache keeps the published tails within tailBudget, dropping the
// oldest first.
type tailCache struct {
	mu    sync.Mutex
	fifo  []tailEntry // oldest first, from head
	head  int
	bytes int64
}

// tailEntry is one published tail: its stream, its first seq (to tell it
// from a later tail of the same stream), its cost.
type tailEntry struct {
	st    *stream
	first uint64
	cost  int64
}

// add records that st published tail, and drops the oldest tails while
// the total is over budget.
func (c *tailCache) add(st *stream, tail []eventlog.Event) {
	cost := int64(len(tail)) * eventOverhead
	for _, e := range tail {
		cost += int64(len(e.Data))
	}
	c.mu.Lock()
	c.fifo = append(c.fifo, tailEntry{st: st, first: tail[0].Seq, cost: cost})
	c.bytes += cost
	var drop []tailEntry
	for c.bytes > tailBudget && c.head < len(c.fifo) {
		e := c.fifo[c.head]
		c.fifo[c.head] = tailEntry{}
		c.head++
		c.bytes -= e.cost
		drop = append(drop, e)
	}
	if c.head > len(c.fifo)/2 && c.head > 64 {
		c.fifo = append(c.fifo[:0], c.fifo[c.head:]...)
		c.head = 0
	}
	c.mu.Unlock()
	for _, e := range drop {
		e.st.pubMu.Lock()
		if t := e.st.pubTail; len(t) > 0 && t[0].Seq == e.first {
			e.st.pubTail = nil
		}
		e.st.pubMu.Unlock()
	}
}
