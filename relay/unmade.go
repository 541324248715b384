package relay

import (
	"context"
	"errors"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
)

// A session whose creation failed may still be in the store: a write the
// store made but whose answer was lost (a timeout, a partition) looks like
// one it never made. Nobody can use such a record (the client never learned
// the session's ID), and only the sweep of idle sessions would remove it,
// an idle timeout later (never, from Redis, if its index entry was not
// written), so the relay removes it now: off the client's path, which gets
// its 503 at once, and again until the store answers.

// maxUnmade bounds the sessions waiting for removal; past it, during a long
// outage of the store, the oldest are forgotten (the sweep of idle sessions
// removes them later, if the store recorded them).
const maxUnmade = 10000

// unmadeRetry is how long the remover waits after the store failed it.
const unmadeRetry = time.Second

// unmake removes the record of session id, whose creation failed, from the
// store.
func (h *Handler) unmake(id string) {
	h.unmadeMu.Lock()
	defer h.unmadeMu.Unlock()
	if len(h.unmade) >= maxUnmade {
		if h.unmadeLost++; h.unmadeLost == 1 {
			h.log.Warn("too many sessions whose creation failed wait for their removal from the store; the oldest are forgotten (they stay in the store until swept)", "waiting", maxUnmade)
		}
		h.unmade = h.unmade[1:]
	}
	h.unmade = append(h.unmade, id)
	if !h.unmaking {
		h.unmaking = true
		go h.removeUnmade()
	}
}

// removeUnmade removes the records unmake was given, one at a time, until
// none is left; while the store does not answer it retries every
// unmadeRetry. Each removal waits one lease TTL at most (with replicas;
// else a few seconds).
func (h *Handler) removeUnmade() {
	wait := h.leaseTTL
	if wait <= 0 {
		wait = 5 * time.Second
	}
	failing := false
	for {
		h.unmadeMu.Lock()
		if len(h.unmade) == 0 || h.ctx.Err() != nil {
			h.unmaking = false
			h.unmadeMu.Unlock()
			return
		}
		id := h.unmade[0]
		h.unmadeMu.Unlock()

		ctx, cancel := context.WithTimeout(h.ctx, wait)
		err := h.store.DeleteSession(ctx, id)
		cancel()
		if err != nil && !errors.Is(err, eventlog.ErrNotFound) {
			if h.ctx.Err() != nil {
				continue // ends the loop
			}
			if !outOfReach(err) {
				// Not a store out of reach: retrying would not help, and
				// would hold up the others.
				h.log.Error("removing the record of a session whose creation failed; left to the sweep", logSession, id, "err", err)
				h.unmadeDone(id)
				continue
			}
			if !failing {
				h.log.Warn("removing the record of a session whose creation failed; retrying", logSession, id, "err", err)
				failing = true
			}
			select {
			case <-h.ctx.Done():
			case <-time.After(unmadeRetry):
			}
			continue
		}
		if failing {
			h.unmadeMu.Lock()
			lost := h.unmadeLost
			h.unmadeLost = 0
			h.unmadeMu.Unlock()
			h.log.Info("the store answers again; removing the records of sessions whose creation failed", "forgotten", lost)
			failing = false
		}
		h.unmadeDone(id)
	}
}

// unmadeDone takes id off the front of the queue, unless unmake dropped it
// meanwhile.
func (h *Handler) unmadeDone(id string) {
	h.unmadeMu.Lock()
	defer h.unmadeMu.Unlock()
	if len(h.unmade) > 0 && h.unmade[0] == id {
		h.unmade = h.unmade[1:]
	}
}
