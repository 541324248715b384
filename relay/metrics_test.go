package relay_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mcprelay/mcprelay/relay"
)

func TestMetrics(t *testing.T) {
	e := newEnv(t, relay.Options{})
	s := e.initialize("2025-11-25", "")
	if r := s.get("garbage"); r.StatusCode != 400 {
		t.Fatalf("garbage cursor: %s", r.Status)
	}
	w := httptest.NewRecorder()
	e.relay.Metrics().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	body := w.Body.String()
	for _, want := range []string{
		`mcprelay_resume_decisions_total{status="400",reason="malformed_cursor"} 1`,
		"mcprelay_backend_recreations_total 0",
		"mcprelay_sessions 1",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
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
