package stdio

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mcprelay/mcprelay/backend"
)

// TestBackoffSchedule checks the backoff's arithmetic in a bubble: the
// refusal's RetryAfter doubles from Min up to Max, a start is allowed again
// exactly when it has passed, one at a time, and a success resets it.
func TestBackoffSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := New(Options{Command: []string{"x"}, StartBackoff: Backoff{Min: 100 * time.Millisecond, Max: 700 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		refusal := func() time.Duration {
			t.Helper()
			_, err := c.reserve()
			var ue *backend.UnavailableError
			if !errors.As(err, &ue) || !errors.Is(err, ErrStartFailing) {
				t.Fatalf("reserve: %v, want a refusal", err)
			}
			return ue.RetryAfter
		}
		probe := func() {
			t.Helper()
			p, err := c.reserve()
			if err != nil || !p {
				t.Fatalf("reserve after the backoff: probe %v, %v", p, err)
			}
			c.released(nil)
		}
		for _, want := range []time.Duration{100, 200, 400, 700, 700} {
			want *= time.Millisecond
			c.started(false, startFailed, "exit status 1")
			if got := refusal(); got != want {
				t.Fatalf("RetryAfter %v, want %v", got, want)
			}
			time.Sleep(want - time.Millisecond)
			if got := refusal(); got != time.Millisecond {
				t.Fatalf("1ms before the end: RetryAfter %v", got)
			}
			time.Sleep(time.Millisecond)
			probe()
			if got := refusal(); got != 100*time.Millisecond { // one start at a time
				t.Fatalf("while a start is tried: RetryAfter %v, want Min", got)
			}
			c.mu.Lock()
			c.probing = false // as started does for the probe
			c.mu.Unlock()
		}
		c.started(false, startOK, "")
		if p, err := c.reserve(); err != nil || p {
			t.Fatalf("after a success: probe %v, %v; want a plain start", p, err)
		}
		c.released(nil)
	})
}
