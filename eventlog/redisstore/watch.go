package redisstore

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Watch returns a channel that receives a value when the stream key may
// have new events: after an append to it by any Store on this Redis
// (every Append publishes to the stream's channel), when its session is
// deleted, and when this Store
// has (re)subscribed to that channel, since appends may have been missed
// before. The channel has a buffer of one and wakes are coalesced, so a
// reader that is woken should read everything after its cursor. Call stop
// when done watching.
//
// Notifications are at most once: Redis pub/sub drops messages while the
// subscription connection is down, and a publish can overtake nothing but
// can be lost. A missed notification only delays a reader: readers must
// also re-read the log periodically (every few seconds).
//
// All watchers of a Store share one pub/sub connection, opened on first
// use and reopened after a failure; channels are subscribed while they
// have watchers. After Close, Watch returns a channel that never fires.
func (s *Store) Watch(key string) (wake <-chan struct{}, stop func()) {
	return s.hub.watch(s.channel(key))
}

// WatchEpoch tells a watcher whether it may have missed a notification:
// while it returns the same epoch with up true, the pub/sub connection has
// stayed up and every subscription on it has succeeded, so every append to
// a stream watched all along was announced. A reader idle that long need
// not re-read the log to find one. Any other answer (the connection lost,
// reconnected, or a subscription that failed) means it may have missed
// some, and should re-read.
func (s *Store) WatchEpoch() (epoch uint64, up bool) {
	return s.hub.epoch.Load(), s.hub.up.Load()
}

// hubTimeout bounds one SUBSCRIBE or UNSUBSCRIBE.
const hubTimeout = 5 * time.Second

// hub fans one pub/sub connection out to the watchers of a Store.
type hub struct {
	c   rueidis.Client
	log *slog.Logger

	// subMu serializes subscription changes and the connection's life.
	subMu   sync.Mutex
	dc      rueidis.DedicatedClient // nil while disconnected
	started bool
	quit    chan struct{}
	done    chan struct{}

	mu     sync.Mutex // guards subs and closed; taken by the connection's hooks
	subs   map[string]map[*watcher]struct{}
	closed bool

	// epoch grows when the connection comes up and when it is lost; up
	// is set while it is up and no (un)subscription on it has failed
	// (WatchEpoch).
	epoch atomic.Uint64
	up    atomic.Bool
}

type watcher struct{ ch chan struct{} }

func newHub(c rueidis.Client, log *slog.Logger) *hub {
	return &hub{c: c, log: log, quit: make(chan struct{}), done: make(chan struct{}), subs: make(map[string]map[*watcher]struct{})}
}

func (h *hub) watch(channel string) (<-chan struct{}, func()) {
	w := &watcher{ch: make(chan struct{}, 1)}
	h.subMu.Lock()
	defer h.subMu.Unlock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return w.ch, func() {}
	}
	set := h.subs[channel]
	first := set == nil
	if first {
		set = make(map[*watcher]struct{})
		h.subs[channel] = set
	}
	set[w] = struct{}{}
	h.mu.Unlock()
	switch {
	case !h.started:
		h.started = true
		go h.run()
	case first && h.dc != nil:
		h.command(h.dc.B().Subscribe().Channel(channel).Build())
	}
	return w.ch, sync.OnceFunc(func() { h.unwatch(channel, w) })
}

func (h *hub) unwatch(channel string, w *watcher) {
	h.subMu.Lock()
	defer h.subMu.Unlock()
	h.mu.Lock()
	set := h.subs[channel]
	delete(set, w)
	last := set != nil && len(set) == 0
	if last {
		delete(h.subs, channel)
	}
	h.mu.Unlock()
	if last && h.dc != nil {
		h.command(h.dc.B().Unsubscribe().Channel(channel).Build())
	}
}

// command sends a (un)subscription on the connection; subMu is held. A
// failure is logged: the connection's loss ends run's wait, and it then
// resubscribes from subs.
func (h *hub) command(cmd rueidis.Completed) {
	ctx, cancel := context.WithTimeout(context.Background(), hubTimeout)
	defer cancel()
	if err := h.dc.Do(ctx, cmd).Error(); err != nil {
		// A channel may not be subscribed: until the next connection,
		// watchers re-read the log on their own.
		h.up.Store(false)
		h.log.Warn("redisstore: watch subscription failed", "command", cmd.Commands()[0], "err", err)
	}
}

// wake signals every watcher of channel without blocking.
func (h *hub) wake(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.subs[channel] {
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
}

// run keeps the pub/sub connection up, subscribed to every watched
// channel, until close.
func (h *hub) run() {
	defer close(h.done)
	backoff := 50 * time.Millisecond
	for {
		dc, cancel := h.c.Dedicate()
		wait := dc.SetPubSubHooks(rueidis.PubSubHooks{
			OnMessage: func(m rueidis.PubSubMessage) { h.wake(m.Channel) },
			OnSubscription: func(s rueidis.PubSubSubscription) {
				if s.Kind == "subscribe" {
					h.wake(s.Channel)
				}
			},
		})
		h.subMu.Lock()
		h.mu.Lock()
		chans := slices.Collect(maps.Keys(h.subs))
		h.mu.Unlock()
		var err error
		if len(chans) > 0 {
			ctx, cc := context.WithTimeout(context.Background(), hubTimeout)
			err = dc.Do(ctx, dc.B().Subscribe().Channel(chans...).Build()).Error()
			cc()
		}
		if err == nil {
			h.dc = dc
			backoff = 50 * time.Millisecond
			h.epoch.Add(1)
			h.up.Store(true)
		}
		h.subMu.Unlock()
		if err == nil {
			select {
			case err = <-wait:
			case <-h.quit:
			}
		}
		h.subMu.Lock()
		h.up.Store(false)
		h.epoch.Add(1)
		h.dc = nil
		h.subMu.Unlock()
		cancel()
		select {
		case <-h.quit:
			return
		default:
		}
		h.log.Warn("redisstore: watch connection lost; reconnecting", "err", err, "after", backoff)
		select {
		case <-h.quit:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (h *hub) close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.subMu.Lock()
	started := h.started
	h.subMu.Unlock()
	close(h.quit)
	if started {
		<-h.done
	}
}
