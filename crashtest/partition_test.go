package crashtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
	"github.com/mcprelay/mcprelay/sse"
)

// partition is a TCP proxy between one replica and Redis that the test can
// cut: a one-sided network partition. While cut it forwards nothing: the
// connections already open stay open but silent, as a dropped route leaves
// them, and new ones are accepted and never answered. Heal closes every
// connection opened before it (as the peers' timeouts would in the end)
// and forwards new ones again.
type partition struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	cut   bool
	epoch int        // cuts so far; a connection forwards only in the epoch it was opened in
	conns []net.Conn // every connection of the current epoch, both sides
}

func newPartition(t *testing.T, target string) *partition {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.heal()
	})
	return p
}

func (p *partition) url() string { return "redis://" + p.ln.Addr().String() + "/0" }

func (p *partition) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut, epoch := p.cut, p.epoch
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		if cut {
			continue // held open, never answered
		}
		r, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, r)
		p.mu.Unlock()
		go p.pipe(r, c, epoch)
		go p.pipe(c, r, epoch)
	}
}

// pipe copies src to dst while the partition is whole; what it reads while
// cut is never delivered.
func (p *partition) pipe(dst, src net.Conn, epoch int) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass(epoch) {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pass waits while the partition is cut and reports whether a connection
// opened in epoch may still forward.
func (p *partition) pass(epoch int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.cut {
		p.cond.Wait()
	}
	return p.epoch == epoch
}

func (p *partition) cutOff() {
	p.mu.Lock()
	p.cut = true
	p.epoch++
	p.mu.Unlock()
}

func (p *partition) heal() {
	p.mu.Lock()
	p.cut = false
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.cond.Broadcast()
	p.mu.Unlock()
}

// TestReplicaPartitioned cuts the replica that owns a session off from
// Redis, and only it, in the middle of a call, while the other replica
// still reaches Redis (a one-sided partition; the chaos runs only ever
// take Redis away from every replica at once).
//
//   - Cut off and past its lease, the replica answers a request for the
//     session 503, so that the client keeps its session and cursor: never
//     a 404, never an answer it could not log.
//   - The client gives up on its stalled stream and resumes on the other
//     replica, which takes the session over and seals the call
//     (backend_lost reset, -32001). What the client saw from the first
//     replica is in the log, in order, nothing skipped.
//   - When the partition heals, the first replica finds the session taken:
//     it writes nothing more to the log, says it stopped serving the
//     session, and forwards the session's next request to the new owner.
func TestReplicaPartitioned(t *testing.T) {
	needBinary(t)
	var cut *partition
	rs := newReplicaSetVia(t, 2, redistest.Options{}, func(i int, redisAddr string) string {
		if i != 0 {
			return ""
		}
		cut = newPartition(t, redisAddr)
		return cut.url()
	})
	a, b := rs.procs[0], rs.procs[1]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, k, v := rs.sharedLog(ctx)
	sid, c, resp := startCall(ctx, t, a, k, "partitioned-call", 400, 20, 6)

	// The client keeps reading its stream from the replica being cut off.
	var mu sync.Mutex
	var stalled []sse.Event
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		scan(resp, func(ev sse.Event) bool {
			mu.Lock()
			stalled = append(stalled, ev)
			mu.Unlock()
			return true
		})
	}()
	cut.cutOff()
	cutAt := time.Now()
	healed := false
	defer func() {
		if !healed {
			cut.heal()
		}
	}()

	// A call, a resume and a DELETE right after the cut, at once, while
	// the replica still holds the lease: the log can neither record the
	// call's stream, nor be read, nor delete the session, so each is a 503
	// within the lease, and the call is not sent to the backend. A new
	// session there is a 503 within a lease TTL too. Regression: the call
	// went to the backend first, and all four 503s (which invite the
	// client to send again) came after about 11.9 s, the Redis client's
	// own timeout.
	answers := make(chan string, 2)
	within := func(what, method, cursor, body string) {
		resp, err := do(ctx, a.url(), method, sessionHeaders(sid, cursor), body)
		took := time.Since(cutAt)
		switch {
		case err != nil:
			answers <- fmt.Sprintf("%s right after the cut: %v", what, err)
		case resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || took > replicaLease:
			resp.Body.Close()
			answers <- fmt.Sprintf("%s right after the cut: %s (Retry-After %q) after %v, want 503 with Retry-After within the lease (%v)",
				what, resp.Status, resp.Header.Get("Retry-After"), took.Round(time.Millisecond), replicaLease)
		default:
			resp.Body.Close()
			answers <- ""
		}
	}
	go within("call", http.MethodPost, "", callBody("early", "early", 1, 0))
	go within("resume", http.MethodGet, c.cursor, "")
	go within("delete", http.MethodDelete, "", "")
	go func() { // and a new session
		resp, err := do(ctx, a.url(), http.MethodPost, nil, fmt.Sprintf(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"crashtest","version":"1"}}}`, protocolVersion))
		took := time.Since(cutAt)
		if err == nil {
			resp.Body.Close()
		}
		switch {
		case err != nil:
			answers <- fmt.Sprintf("initialize right after the cut: %v", err)
		case resp.StatusCode != http.StatusServiceUnavailable || took > replicaLease+500*time.Millisecond:
			answers <- fmt.Sprintf("initialize right after the cut: %s after %v, want 503 about a lease TTL (%v) after", resp.Status, took.Round(time.Millisecond), replicaLease)
		default:
			answers <- ""
		}
	}()
	for range 4 {
		if msg := <-answers; msg != "" {
			t.Error(msg)
		}
	}
	time.Sleep(time.Until(cutAt.Add(replicaLease + 500*time.Millisecond))) // past the lease, in Redis too

	// A request for the session on the cut-off replica.
	start := time.Now()
	r503, err := do(ctx, a.url(), http.MethodPost, sessionHeaders(sid, ""), callBody("during-cut", "during-cut", 1, 0))
	if err != nil {
		t.Fatalf("POST to the cut-off replica: %v", err)
	}
	r503.Body.Close()
	if r503.StatusCode != http.StatusServiceUnavailable || r503.Header.Get("Retry-After") == "" {
		t.Errorf("POST to the cut-off replica: %s (Retry-After %q) after %v, want 503 with Retry-After",
			r503.Status, r503.Header.Get("Retry-After"), time.Since(start).Round(time.Millisecond))
	}

	// The client gives up on the stalled stream: what it had is checked
	// as received, and it resumes on the other replica from there.
	resp.Body.Close()
	<-readDone
	mu.Lock()
	for _, ev := range stalled {
		k.handle(c, ev)
	}
	mu.Unlock()
	sealed := takeOver(ctx, t, b, st, k, sid, c)

	// Heal, and give the first replica time to renew, append and fail.
	cut.heal()
	healed = true
	deadline := time.Now().Add(3 * replicaLease)
	for !strings.Contains(a.logText(), "no longer served here") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if logs := a.logText(); !strings.Contains(logs, "no longer served here") {
		t.Errorf("after the partition healed the cut-off replica did not let the session go; its log:\n%s", logs)
	}
	sealed.unchanged(ctx, t, st, "the cut-off replica")

	// Its next request for the session is the new owner's.
	c2 := forwardedTo(ctx, t, a, b, st, k, sid, "after-heal")
	audit(ctx, st, sid, []*call{c, c2}, v, false)
	v.report(t)
}
