package relay

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Metrics returns an http.Handler that serves the relay's counters in the
// Prometheus text format:
//
//	mcprelay_resume_decisions_total{status="409",reason="foreign_stream"} 3
//	mcprelay_backend_recreations_total 1
//	mcprelay_requests_lost_total 2
//	mcprelay_sessions_restored_total 0
//	mcprelay_sessions 12
//	mcprelay_sessions_rejected_total{reason="rate"} 4
//	mcprelay_store_bytes 1048576
//
// A 409 resume decision is a tenant-isolation event: alert on it.
func (h *Handler) Metrics() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The same Host and Origin rules as /mcp: a page reached through
		// DNS rebinding must not read the counters either.
		if status, msg := h.checkOrigin(r); status != 0 {
			http.Error(w, msg, status)
			return
		}
		counts := h.Counts()
		h.mu.Lock()
		sessions := len(h.sessions)
		h.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		var b strings.Builder
		b.WriteString("# HELP mcprelay_resume_decisions_total Resume decisions (GET with Last-Event-ID) by HTTP status and reason; status 409 is a tenant-isolation event.\n")
		b.WriteString("# TYPE mcprelay_resume_decisions_total counter\n")
		keys := make([]string, 0, len(counts))
		for k := range counts {
			if strings.HasPrefix(k, "resume/") {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			status, reason, _ := strings.Cut(strings.TrimPrefix(k, "resume/"), "/")
			fmt.Fprintf(&b, "mcprelay_resume_decisions_total{status=%q,reason=%q} %d\n", status, reason, counts[k])
		}
		for _, c := range []struct{ name, key, help string }{
			{"mcprelay_backend_recreations_total", "reincarnation", "Backend sessions re-created after being lost (new incarnations)."},
			{"mcprelay_requests_lost_total", "lost", "Requests answered with the request-lost error (-32001)."},
			{"mcprelay_sessions_restored_total", "restore", "Sessions restored from the store after a restart."},
		} {
			fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", c.name, c.help, c.name, c.name, counts[c.key])
		}
		fmt.Fprintf(&b, "# HELP mcprelay_sessions Sessions live in this process.\n# TYPE mcprelay_sessions gauge\nmcprelay_sessions %d\n", sessions)
		b.WriteString("# HELP mcprelay_sessions_rejected_total New sessions refused by the limits, by reason (rate, principal_sessions: 429; max_sessions, store_budget, store_size_unknown: 503).\n")
		b.WriteString("# TYPE mcprelay_sessions_rejected_total counter\n")
		for _, reason := range rejectReasons {
			fmt.Fprintf(&b, "mcprelay_sessions_rejected_total{reason=%q} %d\n", reason, counts["rejected/"+reason])
		}
		if sz, ok := h.store.(storeSizer); ok {
			if n, err := sz.Size(r.Context()); err == nil {
				fmt.Fprintf(&b, "# HELP mcprelay_store_bytes What the event log holds, as its store measures it (the quantity Limits.MaxStoreBytes bounds).\n# TYPE mcprelay_store_bytes gauge\nmcprelay_store_bytes %d\n", n)
			}
		}
		w.Write([]byte(b.String()))
	})
}
