package crashtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestKilledRelaysSessionsAreSwept: a relay killed with -9 leaves its
// sessions in the disk store. Restarted with a short idle timeout, and no
// client coming back, it removes them once idle past it. Regression: they
// stayed, with their streams, restart after restart.
func TestKilledRelaysSessionsAreSwept(t *testing.T) {
	needBinary(t)
	p := newRelay(t) // idle timeout 1 h
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 5 {
		sid, err := initialize(ctx, p.url())
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("left-%d", i)
		resp, err := do(ctx, p.url(), http.MethodPost, sessionHeaders(sid, ""), callBody(name, name, 20, 0))
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("call: %v %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	p.kill()
	p.args = append(p.args, "--session-idle-timeout", "1s")
	p.start()
	time.Sleep(3 * time.Second) // past the timeout and its eighth, sweeps every 250 ms
	p.kill()
	list, err := p.openStore().ListSessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Fatalf("the store holds %d of the killed relay's 5 sessions 3 s after the restart with a 1 s idle timeout, want none", len(list))
	}
}
