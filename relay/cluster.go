package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/resume"
)

// Cluster lets several relay replicas serve the same sessions: their Store
// is shared, and a Cluster says which replica owns each session's backend
// side. The owner holds a lease with a fencing token; the shared store
// refuses writes for a session from a replica whose token is stale, so a
// replica that lost its lease (paused, partitioned) can never append.
// Implementations are safe for concurrent use. One may also have
//
//	RenewAll(ctx context.Context, sessions []string, leases []Lease, ttl time.Duration) (errs []error)
//
// renewing many leases in one round trip, errs[i] being Renew's error for
// sessions[i]: a replica then renews its sessions in batches of 256
// (redisreplicas' does). And one may have
//
//	Held(ctx context.Context, session string) (bool, error)
//
// reporting whether anybody holds the session's lease: a reader idle on a
// replica that does not own the session then asks it every second and
// looks the session up (taking it over) only when nobody does, rather
// than looking it up every second (redisreplicas' does).
type Cluster interface {
	// Self is the URL at which other replicas reach this replica's MCP
	// endpoint (for example "http://10.0.0.5:8080/mcp").
	Self() string

	// Acquire takes the session's lease for Self with a new, higher
	// fencing token, if nobody else holds an unexpired lease. Otherwise it
	// returns an error wrapping *LeaseHeldError naming the holder.
	Acquire(ctx context.Context, session string, ttl time.Duration) (Lease, error)

	// Renew extends a lease l holds; an error wrapping ErrLeaseLost if l
	// is no longer the holder.
	Renew(ctx context.Context, session string, l Lease, ttl time.Duration) error

	// Release gives the lease up, so that the next request re-homes the
	// session at once.
	Release(ctx context.Context, session string, l Lease) error

	// Watch returns a channel that receives a value (coalesced, never
	// blocking the sender) after events are appended to the stream with
	// this key by any replica, and a function that stops the watch. A
	// missed notification only delays: watchers re-read the log
	// periodically.
	Watch(key string) (wake <-chan struct{}, stop func())
}

// Lease is a replica's claim on a session.
type Lease struct {
	Owner string // the owner's Cluster.Self
	Token uint64 // fencing token: grows with every acquisition
}

// ErrLeaseLost reports that a lease is no longer held.
var ErrLeaseLost = errors.New("relay: lease lost")

// LeaseHeldError reports that another replica holds a session's lease.
type LeaseHeldError struct {
	Holder Lease
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("relay: session owned by %s (token %d)", e.Holder.Owner, e.Holder.Token)
}

// Lease timing. The owner renews every leaseTTL/3; it stops answering for
// a session on its own once leaseTTL minus leaseMargin has passed since
// its last successful renewal began, before any other replica may take it,
// until a renewal succeeds again (see renewed).
const (
	defaultLeaseTTL = 2 * time.Second
	leaseMargin     = 300 * time.Millisecond
	// remotePoll is how often a reader idle on a replica that does not
	// own the stream checks that the owner still holds the lease, and
	// re-reads the log unless the Cluster says its watch missed nothing
	// (steadyWatcher; then every remoteReread).
	remotePoll = time.Second
)

// leaseHeld is the lease a replica holds on a session it owns, apart from
// the session so that a relay without a Cluster does not carry it (an idle
// session's struct is 48 bytes smaller).
type leaseHeld struct {
	lease Lease
	until atomic.Int64 // unix nanos until which the replica may act on it
	// failingSince is when the renewals of the lease began to fail (unix
	// nanos of the first failed one in a row), zero while they succeed.
	failingSince atomic.Int64
}

// leaseValid reports whether this replica may still act for s.
func (s *session) leaseValid() bool {
	return s.held != nil && time.Now().UnixNano() < s.held.until.Load()
}

// takeLease acquires s's lease for this replica. It returns a
// *LeaseHeldError if another replica holds it.
func (h *Handler) takeLease(ctx context.Context, s *session) error {
	start := time.Now()
	l, err := h.cluster.Acquire(ctx, s.id, h.leaseTTL)
	if err != nil {
		return err
	}
	held := &leaseHeld{lease: l}
	held.until.Store(start.Add(h.leaseTTL - leaseMargin).UnixNano())
	s.held = held
	return nil
}

// leaseKeeper renews the leases of the sessions this replica owns, and
// lets go of those it can no longer renew: their backend side stops here,
// and the next request re-homes them.
func (h *Handler) leaseKeeper() {
	defer close(h.keeperDone)
	t := time.NewTicker(h.leaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
		}
		h.mu.RLock()
		owned := make([]*session, 0, len(h.sessions))
		for _, s := range h.sessions {
			owned = append(owned, s)
		}
		h.mu.RUnlock()
		renewing := len(owned)
		// A lease that lapsed here is renewed too, not dropped: the store
		// renews it only if nobody acquired the session since (see
		// renewed). Renewals go out together: one after another, a round
		// of many sessions on a busy store took longer than a lease
		// lasts, and the replica dropped its own sessions.
		sem := make(chan struct{}, renewParallel)
		var wg sync.WaitGroup
		if b, ok := h.cluster.(leaseBatcher); ok {
			for len(owned) > 0 {
				n := min(len(owned), renewBatch)
				batch := owned[:n]
				owned = owned[n:]
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					h.renewBatch(b, batch)
				})
			}
		} else {
			for _, s := range owned {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					h.renew(h.ctx, s)
				})
			}
		}
		wg.Wait()
		h.renewFails.report(h.log, renewing)
	}
}

// leaseHolder is a Cluster that tells whether anybody holds a session's
// lease without trying to take it (redisreplicas').
type leaseHolder interface {
	Held(ctx context.Context, session string) (bool, error)
}

// ownerMayBeGone reports whether a reader that waited idle on a session
// another replica owns should look the session up again: with a
// leaseHolder, only when nobody holds its lease (its owner died or let it
// go) or the Cluster cannot tell.
func (h *Handler) ownerMayBeGone(ctx context.Context, id string) bool {
	lh, ok := h.cluster.(leaseHolder)
	if !ok {
		return true
	}
	held, err := lh.Held(ctx, id)
	return err != nil || !held
}

// steadyWatcher is a Cluster that can tell whether its watch may have
// missed an append (redisreplicas'): while WatchEpoch returns the same
// epoch with up true, every append to a watched stream was announced.
type steadyWatcher interface {
	WatchEpoch() (epoch uint64, up bool)
}

// remoteReread is how often an idle reader on a replica that does not own
// its stream re-reads the log while the Cluster says its watch missed
// nothing: a bound should a notification be lost all the same. Without
// that word it re-reads every remotePoll. At 10,000 idle streams the
// re-reads every second were most of Redis's work.
const remoteReread = 15 * time.Second

// watchQuiet is what an idle reader knew of the watch when it last read
// the log.
type watchQuiet struct {
	sw     steadyWatcher // nil: the Cluster cannot tell
	epoch  uint64
	up     bool
	readAt time.Time
}

// watchQuiet notes the watch's state before a read of the log.
func (h *Handler) watchQuiet() watchQuiet {
	sw, ok := h.cluster.(steadyWatcher)
	if !ok {
		return watchQuiet{}
	}
	e, up := sw.WatchEpoch()
	return watchQuiet{sw: sw, epoch: e, up: up, readAt: time.Now()}
}

// still reports whether nothing can have been appended unannounced since
// the read q was taken before, and it is not yet time to re-read anyway.
func (q watchQuiet) still() bool {
	if q.sw == nil || !q.up || time.Since(q.readAt) >= remoteReread {
		return false
	}
	e, up := q.sw.WatchEpoch()
	return up && e == q.epoch
}

// leaseBatcher is a Cluster that renews many leases in one round trip
// (redisreplicas'); errs[i] is Renew's error for sessions[i].
type leaseBatcher interface {
	RenewAll(ctx context.Context, sessions []string, leases []Lease, ttl time.Duration) (errs []error)
}

const (
	// renewParallel bounds the lease renewals (or batches of them) a
	// replica has in flight.
	renewParallel = 64
	// renewBatch is how many leases one RenewAll renews.
	renewBatch = 256
)

// renewBatch renews the leases of sessions in one RenewAll.
func (h *Handler) renewBatch(b leaseBatcher, sessions []*session) {
	ids := make([]string, len(sessions))
	leases := make([]Lease, len(sessions))
	for i, s := range sessions {
		ids[i], leases[i] = s.id, s.held.lease
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(h.ctx, h.leaseTTL/3)
	errs := b.RenewAll(ctx, ids, leases, h.leaseTTL)
	cancel()
	for i, s := range sessions {
		h.renewed(s, start, errs[i])
	}
}

// renewed applies the outcome of renewing s's lease, begun at start.
//
// A renewal that succeeds after the lease lapsed (this replica starved of
// CPU, a store that answered late) keeps the session: the Cluster renews a
// lapsed lease only while nobody has acquired the session since, so no
// other replica has acted for it and the store's fencing token still names
// this one. While the lease is lapsed the replica does not answer for the
// session (lookup renews first), and should another replica take it over,
// the store refuses the appends of the calls still running here. So a
// lapsed lease is let go only when the Cluster says another replica has
// it, not because a renewal failed: that would lose the calls in flight
// of a replica that is merely slow.
//
// Renewals that keep failing for another reason (the store out of reach)
// are borne for leasePatience, then the session is let go as well: a
// replica cut off from the store must not keep running tools for a session
// another replica may have re-created. Failures are logged once per
// renewLogEvery for all sessions, not per session and round.
func (h *Handler) renewed(s *session, start time.Time, err error) {
	switch {
	case err == nil:
		s.held.until.Store(start.Add(h.leaseTTL - leaseMargin).UnixNano())
		s.held.failingSince.Store(0)
	case errors.Is(err, ErrLeaseLost):
		h.dropLocal(s, "lease lost to another replica")
	default:
		h.metrics.renewFailures.Inc()
		h.renewFails.note(err)
		s.held.failingSince.CompareAndSwap(0, start.UnixNano())
		if since := time.Since(time.Unix(0, s.held.failingSince.Load())); since >= h.leasePatience {
			h.dropLocal(s, fmt.Sprintf("its lease could not be renewed for %v: %v", since.Round(time.Second), err))
		}
	}
}

// renewLogEvery spaces the warnings about failing lease renewals.
const renewLogEvery = 10 * time.Second

// renewFailures gathers failed lease renewals between the lease keeper's
// reports, so that a store outage is one warning every renewLogEvery, not
// one per session every round.
type renewFailures struct {
	mu       sync.Mutex
	round    int   // failures since the last report
	unlogged int   // failures since the last warning
	err      error // the last one's error
	logged   time.Time
	failing  bool // warned, and no round has renewed leases without failure since
}

func (f *renewFailures) note(err error) {
	f.mu.Lock()
	f.round++
	f.unlogged++
	f.err = err
	f.mu.Unlock()
}

// report logs what failed since the last report, after a round that
// renewed renewed leases: a warning at most every renewLogEvery while
// renewals fail, and once when a round renews some and none fails (not
// when none were left to renew: the sessions were let go, and the store
// may still be out of reach).
func (f *renewFailures) report(log *slog.Logger, renewed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.round > 0 && time.Since(f.logged) >= renewLogEvery:
		log.Warn("renewing session leases failed: their requests get 503 until a renewal succeeds",
			"failures", f.unlogged, "err", f.err)
		f.unlogged, f.logged, f.failing = 0, time.Now(), true
	case f.round == 0 && renewed > 0:
		if f.failing {
			log.Info("session lease renewals succeed again")
		}
		f.unlogged, f.failing = 0, false
	}
	f.round = 0
}

// renew renews s's lease: for the lease keeper, and for a request that
// found it lapsed. It returns nil if this replica still owns s, an error
// wrapping ErrLeaseLost if another replica does (s is dropped), or the
// Cluster's error.
func (h *Handler) renew(ctx context.Context, s *session) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, h.leaseTTL/3)
	err := h.cluster.Renew(ctx, s.id, s.held.lease, h.leaseTTL)
	cancel()
	h.renewed(s, start, err)
	return err
}

// dropLocal stops serving s on this replica without ending the session:
// its calls stop, its clients' connections close (they resume elsewhere),
// its backend side is closed. The store keeps the session; its owner from
// now on seals what this replica left unfinished.
func (h *Handler) dropLocal(s *session, why string) {
	sts, bs, ok := h.detachSession(s)
	if !ok {
		return
	}
	kickAll(sts, true)
	if bs != nil {
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			go bs.Close() // Close is waiting already or has returned
		} else {
			h.closing.Add(1)
			h.mu.Unlock()
			go func() {
				defer h.closing.Done()
				bs.Close()
			}()
		}
	}
	h.metrics.dropped.Inc()
	h.log.Warn("session no longer served here", logSession, s.id, logReason, why)
}

// releaseAll drains and then gives up every lease this replica holds (on
// SIGTERM), so that a rolling restart re-homes sessions at once: calls in
// flight get until ctx is done to finish; what is left is sealed by the
// next owner (reset and -32001).
func (h *Handler) releaseAll(ctx context.Context) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		h.mu.RLock()
		busy := 0
		for _, s := range h.sessions {
			s.mu.Lock()
			busy += len(s.inflight)
			s.mu.Unlock()
		}
		h.mu.RUnlock()
		if busy == 0 {
			break
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
			continue
		}
		break
	}
	h.mu.RLock()
	owned := make([]*session, 0, len(h.sessions))
	for _, s := range h.sessions {
		owned = append(owned, s)
	}
	h.mu.RUnlock()
	for _, s := range owned {
		h.dropLocal(s, "replica shutting down")
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		if err := h.cluster.Release(rctx, s.id, s.held.lease); err != nil {
			h.log.Warn("releasing a session lease", logSession, s.id, "err", err)
		}
		cancel()
	}
}

// remoteView returns a read-only view of a session another replica owns:
// enough to decide resumes and to serve streams from the shared log. It
// returns nil, nil if the session has no current standalone stream yet.
func (h *Handler) remoteView(ctx context.Context, rec *eventlog.Session, owner string) (*session, error) {
	s := &session{
		id:          rec.ID,
		principal:   rec.Principal,
		version:     rec.ProtocolVersion,
		incarnation: rec.Incarnation,
		owner:       owner,
		listening:   rec.Listening,
	}
	s.recorded.Store(rec.LastUse().UnixNano())
	sts, err := h.store.Streams(ctx, rec.ID)
	if err != nil {
		return nil, fmt.Errorf("%w: event log: %w", errUnavailable, err)
	}
	for _, r := range sts {
		if r.RequestID == nil && r.Generation == rec.Incarnation && !r.Terminal {
			key, err := resume.ParseStreamKey(r.Key)
			if err != nil {
				continue
			}
			// A GET without a cursor starts after what the log holds: this
			// replica cannot know what the owner already delivered.
			s.standalone = &stream{key: key, skey: r.Key, sess: s, gen: r.Generation, standalone: true, delivered: r.LastSeq}
		}
	}
	if s.standalone == nil {
		return nil, fmt.Errorf("%w: the session is being re-created by its owner", errUnavailable)
	}
	return s, nil
}

// waitRemote waits for events of a stream this replica does not write:
// a notification from the cluster, or remotePoll (idle). goOn is false
// when the connection must end (ok false: the client is gone; true:
// shutdown or poll, retry sent).
func (h *Handler) waitRemote(ctx context.Context, c *sseConn, p resume.Plan, cursor uint64, wake <-chan struct{}, pollC <-chan time.Time) (goOn, ok, idle bool) {
	t := time.NewTimer(remotePoll)
	defer t.Stop()
	select {
	case <-wake:
	case <-t.C:
		return true, true, true
	case <-ctx.Done():
		return false, false, false
	case <-h.shutdown:
		c.retry(p.Stream, p.Generation, cursor, max(h.opts.PollInterval, time.Second))
		return false, true, false
	case <-pollC:
		c.retry(p.Stream, p.Generation, cursor, h.opts.PollInterval)
		return false, true, false
	}
	return true, true, false
}

// retryAfter answers a request the owner cannot take right now.
func retryAfter(w http.ResponseWriter, d time.Duration, msg string) {
	w.Header().Set("Retry-After", fmt.Sprint(max(1, int(math.Ceil(d.Seconds())))))
	httpError(w, http.StatusServiceUnavailable, "Service Unavailable: "+msg+"; retry")
}

// storeContext bounds a request's store calls for s, with replicas: by s's
// lease when this replica owns s (past it the replica may not act for s
// anyway), by one lease TTL when another replica does. A store that does
// not answer (a partition) must not hold the client for the store client's
// own timeouts: the request fails, and the client is told to retry (503).
// Without a Cluster it is ctx.
func (h *Handler) storeContext(ctx context.Context, s *session) (context.Context, context.CancelFunc) {
	switch {
	case h.cluster == nil:
		return context.WithCancel(ctx)
	case s.owner != "" || s.held == nil: // a view, or no lease yet
		return context.WithTimeout(ctx, h.leaseTTL)
	}
	return context.WithDeadline(ctx, time.Unix(0, s.held.until.Load()))
}
