package relay_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/relay"
)

// scrape GETs the relay's /metrics on a loopback listener and parses it
// with the Prometheus text parser.
func scrape(t *testing.T, h *relay.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(h.Metrics())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	var p expfmt.TextParser
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return mfs
}

// series returns the metric of family name whose labels are exactly
// labels (name, value pairs), or nil.
func series(mfs map[string]*dto.MetricFamily, name string, labels ...string) *dto.Metric {
	mf := mfs[name]
	if mf == nil {
		return nil
	}
next:
	for _, m := range mf.GetMetric() {
		if len(m.GetLabel())*2 != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			found := false
			for i := 0; i < len(labels); i += 2 {
				if labels[i] == l.GetName() && labels[i+1] == l.GetValue() {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// value is the value of a counter or gauge series, -1 if absent.
func value(mfs map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	m := series(mfs, name, labels...)
	switch {
	case m == nil:
		return -1
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	}
	return -1
}

// count is the sample count of a histogram series, -1 if absent.
func count(mfs map[string]*dto.MetricFamily, name string, labels ...string) int {
	m := series(mfs, name, labels...)
	if m == nil || m.Histogram == nil {
		return -1
	}
	return int(m.GetHistogram().GetSampleCount())
}

// TestMetrics scrapes /metrics after a known sequence of requests (two
// sessions, a tool call, a 409 resume, plain GETs with and without a
// session) and checks the families and their values.
func TestMetrics(t *testing.T) {
	store := eventlog.NewMemory(eventlog.Retention{})
	e := newEnv(t, relay.Options{Store: store})
	a := e.initialize("2025-11-25", "")
	b := e.initialize("2025-11-25", "")
	_, resp := a.call(2, 0, true)
	evs, ended := events(t, resp, 0, 10*time.Second)
	if !ended {
		t.Fatal("tools/call stream did not end")
	}
	cursor := lastID(evs)
	h := b.headers()
	h["Last-Event-ID"] = cursor
	if r := e.do("GET", h, ""); r.StatusCode != http.StatusConflict {
		t.Fatalf("foreign cursor: %s", r.Status)
	}
	if r := a.get("garbage"); r.StatusCode != http.StatusBadRequest {
		t.Fatalf("garbage cursor: %s", r.Status)
	}
	// A plain GET without a session (mcp-remote sends one at start), and
	// one that opens a's standalone stream.
	if r := e.do("GET", nil, ""); r.StatusCode != http.StatusBadRequest {
		t.Fatalf("GET without session: %s", r.Status)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", a.id)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if r.StatusCode != http.StatusOK {
		t.Fatalf("standalone GET: %s", r.Status)
	}

	mfs := scrape(t, e.relay)
	cancel()
	r.Body.Close()
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"mcprelay_resume_decisions_total", []string{"status", "409", "reason", "foreign_stream"}, 1},
		{"mcprelay_resume_decisions_total", []string{"status", "400", "reason", "malformed_cursor"}, 1},
		{"mcprelay_standalone_gets_total", []string{"status", "400"}, 1},
		{"mcprelay_standalone_gets_total", []string{"status", "200"}, 1},
		{"mcprelay_backend_recreations_total", nil, 0},
		{"mcprelay_requests_lost_total", nil, 0},
		{"mcprelay_sessions_restored_total", nil, 0},
		{"mcprelay_sessions", nil, 2},
		{"mcprelay_sessions_by_state", []string{"state", "served"}, 2},
		{"mcprelay_sessions_by_state", []string{"state", "forwarded"}, 0},
		{"mcprelay_streams", []string{"kind", "standalone", "state", "attached"}, 1},
		{"mcprelay_streams", []string{"kind", "standalone", "state", "detached"}, 1},
		{"mcprelay_streams", []string{"kind", "request", "state", "attached"}, 0},
	} {
		if got := value(mfs, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// A plain GET is not a resume decision.
	if got := value(mfs, "mcprelay_resume_decisions_total", "status", "400", "reason", "missing_session"); got != -1 {
		t.Errorf("a GET without Last-Event-ID counted as a resume decision missing_session: %v", got)
	}
	for _, c := range []struct {
		kind, method string
		want         int
	}{
		{"post", "initialize", 2},
		{"post", "notifications/initialized", 2},
		{"post", "tools/call", 1},
		{"resume", "", 2},
	} {
		if got := count(mfs, "mcprelay_request_duration_seconds", "kind", c.kind, "method", c.method); got != c.want {
			t.Errorf("mcprelay_request_duration_seconds{kind=%q,method=%q} count = %d, want %d", c.kind, c.method, got, c.want)
		}
	}
	// The call's three events (two progress notifications and the result,
	// possibly batched) went through at least one append.
	if got := count(mfs, "mcprelay_store_append_seconds"); got < 1 {
		t.Errorf("mcprelay_store_append_seconds count = %d", got)
	}
	events, bytes := store.Retained()
	if events < 3 || value(mfs, "mcprelay_store_events_retained") != float64(events) || value(mfs, "mcprelay_store_bytes_retained") != float64(bytes) {
		t.Errorf("retained: metrics say %v events, %v bytes; the store %d, %d (at least the call's 3 events)",
			value(mfs, "mcprelay_store_events_retained"), value(mfs, "mcprelay_store_bytes_retained"), events, bytes)
	}
	for _, name := range []string{"go_goroutines", "go_build_info", "process_start_time_seconds"} {
		if mfs[name] == nil {
			t.Errorf("no family %s", name)
		}
	}
	if got := e.relay.Counts()["resume/409/foreign_stream"]; got != 1 {
		t.Errorf(`Counts()["resume/409/foreign_stream"] = %d, want 1`, got)
	}
}

// Two handlers in one process each have their own registry.
func TestMetricsPerHandler(t *testing.T) {
	e1 := newEnv(t, relay.Options{})
	e2 := newEnv(t, relay.Options{})
	e1.initialize("2025-11-25", "")
	if got := value(scrape(t, e1.relay), "mcprelay_sessions"); got != 1 {
		t.Errorf("first handler: mcprelay_sessions = %v, want 1", got)
	}
	if got := value(scrape(t, e2.relay), "mcprelay_sessions"); got != 0 {
		t.Errorf("second handler: mcprelay_sessions = %v, want 0", got)
	}
}

// /metrics follows the endpoint's Host and Origin rules (DNS rebinding):
// a request on a loopback listener naming another host is refused.
func TestMetricsHostCheck(t *testing.T) {
	e := newEnv(t, relay.Options{})
	srv := httptest.NewServer(e.relay.Metrics())
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Host = "attacker.example:80"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("/metrics with Host attacker.example: %s, want 403", resp.Status)
	}
	resp, err = http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics on loopback: %s", resp.Status)
	}
}

// OpsMetrics, for a listener of its own, ignores the endpoint's allowed
// hosts but keeps the DNS-rebinding rule.
func TestOpsMetricsHosts(t *testing.T) {
	e := newEnv(t, relay.Options{AllowedHosts: []string{"mcp.example.com"}})
	for _, c := range []struct {
		h    http.Handler
		host string
		want int
	}{
		{e.relay.Metrics(), "", http.StatusForbidden},
		{e.relay.OpsMetrics(), "", http.StatusOK},
		{e.relay.OpsMetrics(), "attacker.example", http.StatusForbidden},
	} {
		srv := httptest.NewServer(c.h)
		req, _ := http.NewRequest("GET", srv.URL, nil)
		if c.host != "" {
			req.Host = c.host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != c.want {
			t.Errorf("Host %q: %s, want %d", req.Host, resp.Status, c.want)
		}
	}
}
