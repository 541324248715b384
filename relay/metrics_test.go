package relay_test

import (
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
