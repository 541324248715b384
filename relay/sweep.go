package relay

import (
	"context"
	"errors"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
)

// A session's record stays in the store after the process serving it
// stops or dies: the next request for it restores it, or, idle past the
// timeout, finds it expired and deletes it. A session whose client never
// comes back would stay for ever, with everything its streams retain,
// restart after restart, until --max-store-bytes refuses new sessions. The
// sweep removes those: sessions the store says are idle past the timeout
// that no process serves.

// idleLister is a store that lists the sessions its records say are idle
// (see eventlog.Store).
type idleLister interface {
	IdleSessions(ctx context.Context, before time.Time, limit int) ([]string, error)
}

const (
	// sweepBatch is how many idle sessions one store call lists.
	sweepBatch = 1000
	// sweepWait bounds one sweep's store calls.
	sweepWait = 30 * time.Second
	// maxSweepEvery is the longest time between sweeps.
	maxSweepEvery = 5 * time.Minute
)

// sweepEvery is the time between sweeps for an idle timeout: a session
// is removed at most this long after it expired.
func sweepEvery(timeout time.Duration) time.Duration {
	return min(max(timeout/4, 10*time.Millisecond), maxSweepEvery)
}

// sweep removes from the store the sessions idle past the timeout that no
// process serves: not live or being restored here, and with replicas, not
// leased by any (the sweep takes the lease itself). A session is removed
// only if its record, read again, says it expired, exactly as a request
// for it would find it (restore deletes it then); such a record never
// becomes current again, since only a session that is served records its
// use. It returns how many it removed.
func (h *Handler) sweep() int {
	lister, ok := h.store.(idleLister)
	timeout := h.opts.SessionIdleTimeout
	if !ok || timeout <= 0 {
		return 0
	}
	ctx, cancel := context.WithTimeout(h.ctx, sweepWait)
	defer cancel()
	removed := 0
	for {
		before := time.Now().Add(-timeout - timeout/8)
		ids, err := lister.IdleSessions(ctx, before, sweepBatch)
		if err != nil {
			h.sweepFailed(err)
			return removed
		}
		n := 0
		for _, id := range ids {
			gone, err := h.sweepOne(ctx, id)
			if err != nil && !outOfReach(err) {
				// This session's record, not the store: the others go on.
				h.log.Warn("sweeping an idle session from the store; skipped", logSession, id, "err", err)
				continue
			}
			if err != nil {
				h.sweepFailed(err)
				return removed
			}
			if gone {
				n++
			}
		}
		removed += n
		if n > 0 {
			h.metrics.swept.Add(float64(n))
			h.log.Info("removed sessions idle past the timeout from the store", "sessions", n)
		}
		if len(ids) < sweepBatch || n == 0 {
			return removed
		}
	}
}

// sweepOne removes session id if it expired and nobody serves it.
func (h *Handler) sweepOne(ctx context.Context, id string) (bool, error) {
	h.mu.RLock()
	_, live := h.sessions[id]
	_, restoring := h.restoring[id]
	h.mu.RUnlock()
	if live || restoring {
		return false, nil
	}
	rec, err := h.store.Session(ctx, id)
	switch {
	case errors.Is(err, eventlog.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	case !h.expired(rec):
		return false, nil
	}
	if h.cluster != nil {
		// Taking the lease tells whether a replica serves the session (a
		// call or a stream open for longer than the timeout) and keeps any
		// from taking it over while it is removed; the removal deletes
		// the lease with the rest.
		if _, err := h.cluster.Acquire(ctx, id, h.leaseTTL); err != nil {
			if _, held := errors.AsType[*LeaseHeldError](err); held {
				return false, nil
			}
			return false, err
		}
	}
	if err := h.store.DeleteSession(ctx, id); err != nil {
		if errors.Is(err, eventlog.ErrNotFound) {
			return false, nil
		}
		return false, err
	}
	h.log.Debug("session ended", logSession, id, logReason, "idle timeout (swept from the store)")
	return true, nil
}

func (h *Handler) sweepFailed(err error) {
	if h.ctx.Err() == nil {
		h.log.Warn("sweeping idle sessions from the store; retrying at the next sweep", "err", err)
	}
}
