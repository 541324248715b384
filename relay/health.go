package relay

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// readier is implemented by stores and backend connectors that can say
// whether they can serve now: a store that takes writes, an upstream that
// answers. Those without it are always ready.
type readier interface {
	Ready(ctx context.Context) error
}

// Reasons for not being ready, as /readyz states them: one line naming
// the part, never its internal address (logged instead).
var (
	errDraining         = errors.New("draining")
	errStoreNotWritable = errors.New("store not writable")
	errUpstreamDown     = errors.New("upstream unreachable")
)

// readyTimeout bounds one readiness check.
const readyTimeout = 2 * time.Second

// Ready reports whether the relay can take new sessions and calls: not
// draining (after Shutdown), its store takes writes, and its backend
// answers (when the store or the connector can tell, through a
// Ready(ctx) error method). The error is one of a few short reasons;
// the cause behind it is logged when readiness changes.
func (h *Handler) Ready(ctx context.Context) error {
	err, cause := h.ready(ctx)
	if was := h.notReady.Swap(err != nil); was != (err != nil) {
		if err != nil {
			h.log.Warn("not ready", logReason, err, "err", cause)
		} else {
			h.log.Info("ready again")
		}
	}
	return err
}

func (h *Handler) ready(ctx context.Context) (reason, cause error) {
	select {
	case <-h.shutdown:
		return errDraining, nil
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if r, ok := h.store.(readier); ok {
		if err := r.Ready(ctx); err != nil {
			return errStoreNotWritable, err
		}
	}
	if r, ok := h.conn.(readier); ok {
		if err := r.Ready(ctx); err != nil {
			return errUpstreamDown, err
		}
	}
	return nil, nil
}

// Healthz serves liveness: 200 "ok" while the process serves HTTP at all.
// Like Readyz it applies no Host or Origin rule (probes name the pod's
// address) and says nothing a client could use.
func Healthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Write([]byte("ok\n"))
	})
}

// Readyz serves readiness: 200 "ready" when [Handler.Ready] is nil, else
// 503 with the one-line reason ("draining", "store not writable",
// "upstream unreachable").
func (h *Handler) Readyz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := h.Ready(r.Context()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("not ready: " + err.Error() + "\n"))
			return
		}
		w.Write([]byte("ready\n"))
	})
}
