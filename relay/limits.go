package relay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limits bounds the creation of sessions (initialize). Every bound is per
// relay process: with replicas, each enforces its own. The zero value sets
// none.
//
// Refusals: a client past its own bounds (rate, sessions per principal)
// gets 429 Too Many Requests; a relay past its capacity (sessions, store
// budget) gets 503 Service Unavailable. Both carry Retry-After. Sessions
// that exist are never refused: they keep their requests, streams and
// appends, and a session restored after a restart or on another replica
// counts toward the bounds without being refused by them.
type Limits struct {
	// MaxSessions bounds the sessions this process serves (created or
	// restored here, not yet ended). Zero means no bound.
	MaxSessions int

	// MaxSessionsPerPrincipal bounds the sessions of one principal (see
	// Options.Identity) in this process; requests with no principal are
	// counted per remote IP address. Zero means no bound.
	MaxSessionsPerPrincipal int

	// SessionRate bounds how many sessions one principal (with none: one
	// remote IP address) may create per second, with bursts of SessionBurst.
	// Zero means no bound.
	SessionRate float64

	// SessionBurst is how many sessions a principal may create at once
	// under SessionRate. Zero means SessionRate rounded up (at least 1).
	SessionBurst int

	// MaxStoreBytes refuses new sessions while the store holds this many
	// bytes or more, as its Size method reports (eventlog.Memory: retained
	// event data and records; pebblestore: disk space; redisstore: Redis's
	// used_memory). Set it below what the disk or Redis can hold: sessions
	// that exist keep appending, each within its own retention. Zero means
	// no bound; a positive value with a store that has no Size is an error
	// from New.
	MaxStoreBytes int64
}

// storeSizer is a store that reports how many bytes it holds.
type storeSizer interface {
	Size(ctx context.Context) (int64, error)
}

// Reasons a session is refused, as counted ("rejected/<reason>") and
// served by Metrics.
const (
	rejectRate       = "rate"
	rejectPrincipal  = "principal_sessions"
	rejectMax        = "max_sessions"
	rejectStore      = "store_budget"
	rejectStoreError = "store_size_unknown"
)

var rejectReasons = []string{rejectRate, rejectPrincipal, rejectMax, rejectStore, rejectStoreError}

// capacityRetry is the Retry-After of a refusal that lasts until sessions
// end or the store shrinks.
const capacityRetry = 10 * time.Second

// sessionLimits keeps the counts the bounds are checked against. Its
// counts include sessions being created (reserved by admit).
type sessionLimits struct {
	lim   Limits
	burst int
	sizer storeSizer

	mu      sync.Mutex
	live    int
	per     map[string]int           // by limit key
	rates   map[string]*rate.Limiter // by limit key
	sweepAt int                      // len(rates) at which idle limiters are swept
}

func newSessionLimits(lim Limits, store any) (*sessionLimits, error) {
	switch {
	case lim.MaxSessions < 0, lim.MaxSessionsPerPrincipal < 0, lim.SessionBurst < 0, lim.MaxStoreBytes < 0:
		return nil, errors.New("relay: Limits fields must not be negative")
	case lim.SessionRate < 0 || math.IsNaN(lim.SessionRate) || math.IsInf(lim.SessionRate, 0):
		return nil, fmt.Errorf("relay: Limits.SessionRate %v is not a rate", lim.SessionRate)
	}
	l := &sessionLimits{lim: lim, per: make(map[string]int), rates: make(map[string]*rate.Limiter), sweepAt: 1024}
	l.burst = lim.SessionBurst
	if l.burst == 0 {
		l.burst = max(1, int(math.Ceil(lim.SessionRate)))
	}
	if lim.MaxStoreBytes > 0 {
		sz, ok := store.(storeSizer)
		if !ok {
			return nil, fmt.Errorf("relay: Limits.MaxStoreBytes needs a store that reports its size; %T does not", store)
		}
		l.sizer = sz
	}
	return l, nil
}

// key is limitKey when a per-principal bound is set, else "" (nothing is
// counted per principal: an idle session keeps no key).
func (l *sessionLimits) key(r *http.Request, principal string) string {
	if l.lim.MaxSessionsPerPrincipal == 0 && l.lim.SessionRate == 0 {
		return ""
	}
	return limitKey(r, principal)
}

// limitKey is what the per-principal bounds count r under: its principal,
// or with none its remote IP address.
func limitKey(r *http.Request, principal string) string {
	if principal != "" {
		return "p:" + principal
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "a:" + host
}

// refusal is why a new session is refused.
type refusal struct {
	status     int
	retryAfter time.Duration
	reason     string
	err        error // the store's, when it could not tell its size
}

// admit checks a new session of key against the bounds and reserves its
// place; the caller gives it back with release unless the session is
// created (then release when it ends).
func (l *sessionLimits) admit(ctx context.Context, key string) *refusal {
	now := time.Now()
	if l.lim.SessionRate > 0 {
		l.mu.Lock()
		rl := l.rates[key]
		if rl == nil {
			l.sweepLocked(now)
			rl = rate.NewLimiter(rate.Limit(l.lim.SessionRate), l.burst)
			l.rates[key] = rl
		}
		res := rl.ReserveN(now, 1)
		delay := res.DelayFrom(now)
		if delay > 0 {
			res.CancelAt(now)
		}
		l.mu.Unlock()
		if delay > 0 {
			return &refusal{http.StatusTooManyRequests, delay, rejectRate, nil}
		}
	}
	if l.sizer != nil {
		n, err := l.sizer.Size(ctx)
		if err != nil {
			return &refusal{http.StatusServiceUnavailable, time.Second, rejectStoreError, err}
		}
		if n >= l.lim.MaxStoreBytes {
			return &refusal{http.StatusServiceUnavailable, capacityRetry, rejectStore, nil}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := l.lim.MaxSessionsPerPrincipal; m > 0 && l.per[key] >= m {
		return &refusal{http.StatusTooManyRequests, capacityRetry, rejectPrincipal, nil}
	}
	if m := l.lim.MaxSessions; m > 0 && l.live >= m {
		return &refusal{http.StatusServiceUnavailable, capacityRetry, rejectMax, nil}
	}
	l.takeLocked(key)
	return nil
}

// take counts a session that is not refused (one restored).
func (l *sessionLimits) take(key string) {
	l.mu.Lock()
	l.takeLocked(key)
	l.mu.Unlock()
}

func (l *sessionLimits) takeLocked(key string) {
	l.live++
	l.per[key]++
}

// release gives back what admit or take counted.
func (l *sessionLimits) release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.live--
	if l.per[key]--; l.per[key] <= 0 {
		delete(l.per, key)
	}
}

// sweepLocked forgets the rate limiters that are full again (as good as
// new), once there are twice as many as after the last sweep: memory stays
// proportional to the clients seen within a burst's refill time.
func (l *sessionLimits) sweepLocked(now time.Time) {
	if len(l.rates) < l.sweepAt {
		return
	}
	for k, rl := range l.rates {
		if rl.TokensAt(now) >= float64(l.burst) {
			delete(l.rates, k)
		}
	}
	l.sweepAt = max(1024, 2*len(l.rates))
}

// writeRefusal answers a refused initialize.
func writeRefusal(w http.ResponseWriter, f *refusal) {
	secs := max(1, int(math.Ceil(f.retryAfter.Seconds())))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	msg := "Service Unavailable: the relay takes no new sessions now; retry"
	if f.status == http.StatusTooManyRequests {
		msg = "Too Many Requests: too many sessions for this client; retry later"
		if f.reason == rejectRate {
			msg = "Too Many Requests: this client creates sessions too fast; retry later"
		}
	}
	httpError(w, f.status, msg)
}
