package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics holds the relay's Prometheus collectors, registered on the
// Handler's own registry (never the global one: a process may run many
// handlers). A new family is a field here and a line in newMetrics; the
// families are listed in docs/operations.md.
type metrics struct {
	reg *prometheus.Registry

	resumeDecisions *prometheus.CounterVec // status, reason
	plainGETs       *prometheus.CounterVec // status
	rejected        *prometheus.CounterVec // reason
	recreations     prometheus.Counter
	requestsLost    prometheus.Counter
	restored        prometheus.Counter
	forwarded       prometheus.Counter
	dropped         prometheus.Counter
	swept           prometheus.Counter
	renewFailures   prometheus.Counter
	requestDuration *prometheus.HistogramVec // kind, method
	upstreamErrors  *prometheus.CounterVec   // cause
	storeAppend     prometheus.Histogram
}

// Request kinds, the kind label of mcprelay_request_duration_seconds.
const (
	kindPOST   = "post"
	kindResume = "resume"
	kindDELETE = "delete"
)

func newMetrics(h *Handler) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		resumeDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcprelay_resume_decisions_total",
			Help: "Resume decisions (GET with Last-Event-ID) by HTTP status and reason; status 409 is a tenant-isolation event.",
		}, []string{"status", "reason"}),
		plainGETs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcprelay_standalone_gets_total",
			Help: "GETs without Last-Event-ID (opening the standalone stream, not a resume) by HTTP status.",
		}, []string{"status"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcprelay_sessions_rejected_total",
			Help: "New sessions refused by the limits, by reason (rate, principal_sessions: 429; max_sessions, store_budget, store_size_unknown: 503).",
		}, []string{"reason"}),
		recreations: counter("mcprelay_backend_recreations_total",
			"Backend sessions re-created after being lost (new incarnations)."),
		requestsLost: counter("mcprelay_requests_lost_total",
			"Requests answered with the request-lost error (-32001)."),
		restored: counter("mcprelay_sessions_restored_total",
			"Sessions restored from the store (after a restart, or on another replica after a failover)."),
		forwarded: counter("mcprelay_requests_forwarded_total",
			"Requests forwarded to the replica that owns their session."),
		dropped: counter("mcprelay_sessions_dropped_total",
			"Sessions this replica stopped serving because another replica took them over (fenced), or because their lease could not be renewed for LeasePatience."),
		swept: counter("mcprelay_sessions_swept_total",
			"Sessions removed from the store because they were idle past the timeout and no process served them (their process stopped or died, and their client never came back)."),
		renewFailures: counter("mcprelay_lease_renewal_failures_total",
			"Lease renewals that failed for a reason other than another replica holding the lease (the store out of reach or too slow); while a session's renewals fail, its requests get 503."),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mcprelay_request_duration_seconds",
			Help:    "Time from a request's arrival to the end of its response (for an SSE answer, the stream's end), by kind (post, resume, delete) and JSON-RPC method.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"kind", "method"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcprelay_upstream_errors_total",
			Help: "Failures of the backend (upstream) by cause.",
		}, []string{"cause"}),
		storeAppend: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mcprelay_store_append_seconds",
			Help:    "Latency of appends to the event log (with the disk store under --sync always, including the fsync they share).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
		m.resumeDecisions, m.plainGETs, m.rejected, m.recreations, m.requestsLost, m.restored,
		m.forwarded, m.dropped, m.swept, m.renewFailures, m.requestDuration, m.upstreamErrors, m.storeAppend,
		stateCollector{h},
	)
	for _, reason := range rejectReasons {
		m.rejected.WithLabelValues(reason) // reported from zero on
	}
	if c, ok := h.store.(prometheus.Collector); ok {
		// A store that reports on itself (the disk store's fsync
		// latencies, events and bytes retained).
		m.reg.MustRegister(c)
	}
	return m
}

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

// observeAppend records the latency of one store append that began at t.
func (m *metrics) observeAppend(t time.Time) {
	m.storeAppend.Observe(time.Since(t).Seconds())
}

// Metrics returns an http.Handler that serves the relay's metrics in the
// Prometheus text format: the families listed in docs/operations.md, the
// Go runtime's and the process's. For example:
//
//	mcprelay_resume_decisions_total{reason="foreign_stream",status="409"} 3
//	mcprelay_backend_recreations_total 1
//	mcprelay_sessions 12
//	mcprelay_sessions_rejected_total{reason="rate"} 4
//	mcprelay_store_bytes 1048576
//
// A 409 resume decision is a tenant-isolation event: alert on it.
//
// It applies the MCP endpoint's Host and Origin rules: a page reached
// through DNS rebinding must not read the counters either.
func (h *Handler) Metrics() http.Handler {
	return h.serveMetrics(h.checkOrigin)
}

// OpsMetrics serves the same metrics as Metrics on a listener of their
// own (for operators, not MCP clients): Options.AllowedHosts and
// AllowedOrigins do not apply there; only the DNS-rebinding rule does (a
// loopback listener answers loopback Host names only).
func (h *Handler) OpsMetrics() http.Handler {
	return h.serveMetrics(checkLoopbackHost)
}

func (h *Handler) serveMetrics(check func(*http.Request) (int, string)) http.Handler {
	serve := promhttp.HandlerFor(h.metrics.reg, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status, msg := check(r); status != 0 {
			http.Error(w, msg, status)
			return
		}
		serve.ServeHTTP(w, r)
	})
}

// countKeys maps the families Counts reports to their keys.
var countKeys = map[string]string{
	"mcprelay_backend_recreations_total": "reincarnation",
	"mcprelay_requests_lost_total":       "lost",
	"mcprelay_sessions_restored_total":   "restore",
	"mcprelay_requests_forwarded_total":  "forwarded",
	"mcprelay_sessions_dropped_total":    "dropped",
	"mcprelay_sessions_swept_total":      "swept",
}

// Counts returns a snapshot of the relay's counters: "resume/<status>/<reason>"
// for each resume decision ("resume/409/foreign_stream" counts
// tenant-isolation events), "reincarnation" for backend re-creations,
// "lost" for requests answered with the request-lost error, "restore" for
// sessions restored after a restart, "forwarded" and "dropped" (replicas),
// "swept" for sessions removed from the store by the sweep,
// "rejected/<reason>" for sessions refused by the limits.
// Counters still at zero may be missing.
func (h *Handler) Counts() map[string]int64 {
	out := make(map[string]int64)
	mfs, _ := h.metrics.reg.Gather()
	for _, mf := range mfs {
		name := mf.GetName()
		for _, m := range mf.GetMetric() {
			v := int64(m.GetCounter().GetValue())
			switch {
			case name == "mcprelay_resume_decisions_total":
				var status, reason string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "status":
						status = l.GetValue()
					case "reason":
						reason = l.GetValue()
					}
				}
				out["resume/"+status+"/"+reason] = v
			case name == "mcprelay_sessions_rejected_total":
				for _, l := range m.GetLabel() {
					out["rejected/"+l.GetValue()] = v
				}
			case countKeys[name] != "":
				out[countKeys[name]] = v
			}
		}
	}
	return out
}

// stateCollector reports the sessions and streams this process holds, by
// state, when scraped.
type stateCollector struct{ h *Handler }

var (
	descSessions = prometheus.NewDesc("mcprelay_sessions",
		"Sessions live in this process.", nil, nil)
	descSessionStates = prometheus.NewDesc("mcprelay_sessions_by_state",
		"Sessions in this process by state: served (the backend side is here), forwarded (another replica owns it), restoring (from the store).", []string{"state"}, nil)
	descStreams = prometheus.NewDesc("mcprelay_streams",
		"Unfinished streams in this process by kind (request, standalone) and state (attached: a client connection reads it; detached).", []string{"kind", "state"}, nil)

	descEventsRetained = prometheus.NewDesc("mcprelay_store_events_retained",
		"Events the event log holds, across all sessions (memory and disk stores).", nil, nil)
	descStoreBytes = prometheus.NewDesc("mcprelay_store_bytes",
		"What the event log holds, as its store measures it (the quantity Limits.MaxStoreBytes bounds; for the disk store, its disk space).", nil, nil)
	descBytesRetained = prometheus.NewDesc("mcprelay_store_bytes_retained",
		"Bytes of event data the event log holds, across all sessions (memory and disk stores).", nil, nil)
)

// retainedReporter is implemented by stores that can tell what they hold
// cheaply (the memory and disk stores; not Redis, shared by replicas).
type retainedReporter interface {
	Retained() (events, bytes int64)
}

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descSessions
	ch <- descSessionStates
	ch <- descStreams
	ch <- descEventsRetained
	ch <- descBytesRetained
	ch <- descStoreBytes
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	h := c.h
	var served, forwarded int
	h.mu.RLock()
	for _, s := range h.sessions {
		if s.owner != "" {
			forwarded++
		} else {
			served++
		}
	}
	restoring := len(h.restoring)
	h.mu.RUnlock()
	sts := h.streams.all()
	// [standalone][attached]
	var n [2][2]int
	for _, st := range sts {
		st.mu.Lock()
		attached := st.conn != nil
		st.mu.Unlock()
		n[b2i(st.standalone)][b2i(attached)]++
	}
	ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(served+forwarded))
	for state, v := range map[string]int{"served": served, "forwarded": forwarded, "restoring": restoring} {
		ch <- prometheus.MustNewConstMetric(descSessionStates, prometheus.GaugeValue, float64(v), state)
	}
	for i, kind := range []string{"request", "standalone"} {
		for j, state := range []string{"detached", "attached"} {
			ch <- prometheus.MustNewConstMetric(descStreams, prometheus.GaugeValue, float64(n[i][j]), kind, state)
		}
	}
	if sz, ok := h.store.(storeSizer); ok {
		ctx, cancel := context.WithTimeout(h.ctx, readyTimeout)
		n, err := sz.Size(ctx)
		cancel()
		if err == nil {
			ch <- prometheus.MustNewConstMetric(descStoreBytes, prometheus.GaugeValue, float64(n))
		}
	}
	if rr, ok := h.store.(retainedReporter); ok {
		events, bytes := rr.Retained()
		ch <- prometheus.MustNewConstMetric(descEventsRetained, prometheus.GaugeValue, float64(events))
		ch <- prometheus.MustNewConstMetric(descBytesRetained, prometheus.GaugeValue, float64(bytes))
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// rpcMethods are the JSON-RPC methods that get their own value of the
// method label; others are "other" (the label's values must stay few
// whatever clients send).
var rpcMethods = map[string]bool{}

func init() {
	for _, m := range strings.Fields(`initialize ping tools/list tools/call resources/list
		resources/templates/list resources/read resources/subscribe resources/unsubscribe
		prompts/list prompts/get completion/complete logging/setLevel server/discover
		tasks/get tasks/list tasks/result tasks/cancel
		notifications/initialized notifications/cancelled notifications/progress
		notifications/roots/list_changed`) {
		rpcMethods[m] = true
	}
}

// methodLabel is the method label of a POST carrying msgs.
func methodLabel(msgs []message) string {
	switch {
	case len(msgs) == 0:
		return ""
	case len(msgs) > 1:
		return "batch"
	case msgs[0].Method == "":
		return "response"
	case rpcMethods[msgs[0].Method]:
		return msgs[0].Method
	}
	return "other"
}

// Causes of upstream errors, the cause label of
// mcprelay_upstream_errors_total.
const (
	causeUnreachable    = "unreachable"     // no connection (refused, reset, DNS)
	causeUnavailable    = "unavailable"     // the connector cannot open a session now (too many children, backoff)
	causeTimeout        = "timeout"         // no answer within the response timeout
	causeStatus         = "http_status"     // a 5xx answer
	causeSessionLost    = "session_lost"    // the backend forgot the session, or its child exited
	causeStreamBroken   = "stream_broken"   // an answer ended before its response
	causeRecreationLoop = "recreation_loop" // the backend keeps losing one session
	causeOther          = "other"
)

// upstreamCause classifies an error of the backend connector.
func upstreamCause(err error) string {
	var se *backend.StatusError
	var ne net.Error
	switch {
	case errors.Is(err, errRecreationLoop):
		return causeRecreationLoop
	case errors.Is(err, backend.ErrSessionLost):
		return causeSessionLost
	case errors.Is(err, backend.ErrTimeout):
		return causeTimeout
	case errors.As(err, &se):
		return causeStatus
	case errors.Is(err, backend.ErrAnswerBroken), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, backend.ErrMessageTooLarge):
		return causeStreamBroken
	case errors.As(err, &ne):
		return causeUnreachable
	case errors.As(err, new(*backend.UnavailableError)):
		return causeUnavailable
	}
	return causeOther
}

// upstreamFailed counts an upstream error and logs it, with its cause, at
// warn: the detail (internal URLs among it) goes to the log, never to the
// client. cause "" means upstreamCause(err).
func (h *Handler) upstreamFailed(msg, cause string, err error, attrs ...any) {
	if cause == "" {
		cause = upstreamCause(err)
	}
	h.metrics.upstreamErrors.WithLabelValues(cause).Inc()
	h.log.Warn(msg, append(attrs, "cause", cause, "err", err)...)
}
