package relay

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
)

// headerListen marks a forwarded listen signal: a replica serving a GET
// for a session another replica owns tells the owner that the session's
// client listens (see listen). Its MAC is made over methodListen, not
// GET, so a forwarded GET cannot be turned into a signal or back.
const (
	headerListen = "Mcprelay-Listen"
	methodListen = "LISTEN"
)

// listen makes s's backend sessions, this one and every later incarnation,
// receive the backend's unrelated messages (backend.Session.Listen), and
// records so in the store (eventlog.Session.Listening): a session restored
// after a restart, or taken over by another replica, listens at once. The
// relay asks for them from a session's first GET on: only a client that
// opens a GET stream can be sent them (a client of the backend itself that
// opens none is not either), and from then on they wait in the log while
// the client is away. A session whose client never opens a GET costs no
// backend GET stream.
//
// On a view of a session another replica owns, the owner is told (a
// forwarded listen signal) unless the record says it listens already.
// An error means the session may not listen yet: the GET is refused (503)
// and the client retries.
func (h *Handler) listen(r *http.Request, s *session) error {
	if s.owner != "" {
		if s.isListening() {
			return nil
		}
		return h.signalListen(r, s)
	}
	s.mu.Lock()
	first := !s.listening
	s.listening = true
	stored := s.listenStored
	bs := s.backend
	s.mu.Unlock()
	if first && bs != nil {
		bs.Listen()
	}
	if stored {
		return nil
	}
	ctx, cancel := h.storeContext(r.Context(), s)
	defer cancel()
	if err := h.rewriteRecord(ctx, s, nil); err != nil {
		h.log.Error("recording that a session listens", logSession, s.id, "err", err)
		return err
	}
	return nil
}

func (s *session) isListening() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listening
}

// rewriteRecord reads s's record, applies change (if not nil) and writes
// it back with Listening set if s listens. Rewrites of one session's
// record, and the re-creation of its backend side (which writes the
// record too), take turns on s.reinitMu, so none undoes another's change.
func (h *Handler) rewriteRecord(ctx context.Context, s *session, change func(*eventlog.Session)) error {
	s.reinitMu.Lock()
	defer s.reinitMu.Unlock()
	rec, err := h.store.Session(ctx, s.id)
	if err != nil {
		return err
	}
	if change != nil {
		change(rec)
	}
	listening := s.isListening()
	rec.Listening = rec.Listening || listening
	if err := h.store.UpdateSession(ctx, rec); err != nil {
		return err
	}
	if listening {
		s.mu.Lock()
		s.listenStored = true
		s.mu.Unlock()
	}
	return nil
}

// signalListen tells the replica that owns s that s's client listens, and
// returns once the owner recorded it.
func (h *Handler) signalListen(r *http.Request, s *session) error {
	ctx, cancel := context.WithTimeout(r.Context(), h.leaseTTL)
	defer cancel()
	req, owner, err := h.forwardedRequest(ctx, r, s.owner, methodListen, nil, []string{headerSessionID, headerProtocolVersion, "Authorization"})
	if err != nil {
		return err
	}
	req.Header.Set(headerListen, "1")
	resp, err := h.peers.Do(req)
	if err != nil {
		h.log.Warn("telling a session's owner that its client listens", logSession, s.id, "owner", owner, "err", err)
		return err
	}
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNoContent:
		return nil
	case http.StatusForbidden:
		// A replica of an earlier version refuses the signal's MAC (it
		// knows no LISTEN); it listened to every session from
		// initialize, so the GET goes on. Replicas with different
		// secrets also end here, and forward nothing either.
		h.log.Warn("the session's owner refused the listen signal: a replica of an earlier version (which listens from initialize), or one with another secret", logSession, s.id, "owner", owner)
		return nil
	}
	return fmt.Errorf("relay: the session's owner answered the listen signal with %s", resp.Status)
}

// serveListen answers a listen signal from another replica (verified):
// 204 once the session listens and its record says so.
func (h *Handler) serveListen(w http.ResponseWriter, r *http.Request) {
	s, err := h.lookup(r, r.Header.Get(headerSessionID))
	switch {
	case err != nil:
		writeUnavailable(w)
	case s == nil:
		httpError(w, http.StatusNotFound, "Not Found: unknown or expired session")
	case s.owner != "":
		retryAfter(w, time.Second, "the session is moving between replicas")
	case h.listen(r, s) != nil:
		writeUnavailable(w)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}
