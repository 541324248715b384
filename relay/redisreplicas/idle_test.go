package redisreplicas_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/sse"
)

// holder is the optional Cluster method an idle reader asks.
type holder interface {
	Held(ctx context.Context, session string) (bool, error)
}

// counting counts a replica's lease acquisitions; it keeps the cluster's
// Held and RenewAll.
type counting struct {
	relay.Cluster
	acquires *atomic.Int64
}

func (c counting) Acquire(ctx context.Context, session string, ttl time.Duration) (relay.Lease, error) {
	c.acquires.Add(1)
	return c.Cluster.Acquire(ctx, session, ttl)
}

func (c counting) Held(ctx context.Context, session string) (bool, error) {
	return c.Cluster.(holder).Held(ctx, session)
}

func (c counting) RenewAll(ctx context.Context, sessions []string, leases []relay.Lease, ttl time.Duration) []error {
	return c.Cluster.(batcher).RenewAll(ctx, sessions, leases, ttl)
}

// TestIdleReaderOnOtherReplica: a client's GET stream on replica B, for a
// session A owns, waits idle. Every second without news B checks whether
// A's lease lapsed, and only then looks the session up to take it over.
// Regression: B looked the session up every second regardless (the
// session record, a lease acquisition that failed, the list of its
// streams): with 10,000 such streams, Redis was busy enough that a
// resume's first event took 119 ms at p99, against 9 ms without the idle
// streams (mcpbench relay-redis3; with this check, Redis runs about a
// fifth fewer commands a second, and that p99 moves inside the noise).
// When A goes away, B still takes the session over.
func TestIdleReaderOnOtherReplica(t *testing.T) {
	rds := redistest.Start(t)
	prefix := fmt.Sprintf("idle%d", time.Now().UnixNano())
	a, srvA := replicaOn(t, rds, prefix, func(c relay.Cluster) relay.Cluster { return c })
	var acquires atomic.Int64
	_, srvB := replicaOn(t, rds, prefix, func(c relay.Cluster) relay.Cluster { return counting{c, &acquires} })
	sid := initialize(t, srvA.URL)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	openGET(t, ctx, srvB.URL, sid)
	acquires.Store(0)
	time.Sleep(3500 * time.Millisecond) // three idle checks
	if n := acquires.Load(); n != 0 {
		t.Errorf("the idle reader on the other replica tried to acquire the lease %d times while its owner held it", n)
	}

	// A goes away: B's idle reader takes the session over.
	a.Close()
	srvA.CloseClientConnections()
	srvA.Close()
	st, err := redisstore.Open(t.Context(), redisstore.Options{URL: rds.URL(), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, _, err := st.Holder(t.Context(), sid)
		if err == nil && strings.HasPrefix(h.Owner, srvB.URL) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after its owner went away, the session's lease is %+v (%v), want B's", h, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// readCounting is a store that counts its reads of event logs.
type readCounting struct {
	eventlog.Store
	reads atomic.Int64
}

func (s *readCounting) Read(ctx context.Context, key string, after uint64, max int, buf []eventlog.Event) (eventlog.Stream, []eventlog.Event, error) {
	s.reads.Add(1)
	return s.Store.Read(ctx, key, after, max, buf)
}

// TestIdleRemoteReaderWaitsForNews: a call on replica A, followed from
// replica B (the client resumed there), sends its events 3.5 s apart. B
// reads the log when A's appends are announced, not every second besides:
// while the watch has stayed up, nothing can have been appended
// unannounced. Each event still reaches the client as soon as it is
// appended. Regression: B re-read an idle stream's log every second, most
// of what Redis did with 10,000 idle streams (mcpbench relay-redis3).
func TestIdleRemoteReaderWaitsForNews(t *testing.T) {
	rds := redistest.Start(t)
	prefix := fmt.Sprintf("news%d", time.Now().UnixNano())
	_, srvA := replicaOn(t, rds, prefix, func(c relay.Cluster) relay.Cluster { return c })
	var counted *readCounting
	_, srvB := replicaWith(t, rds, prefix, func(c relay.Cluster) relay.Cluster { return c }, func(o *relay.Options) {
		counted = &readCounting{Store: o.Store}
		o.Store = counted
	})
	sid := initialize(t, srvA.URL)
	const events, gap = 3, 3500 * time.Millisecond
	call := postMCP(t, srvA.URL, sid, fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"stream_progress","arguments":{"count":%d,"interval_ms":%d},"_meta":{"progressToken":"p"}}}`, events, gap.Milliseconds()))
	sc := sse.NewScanner(call.Body)
	first, err := sc.Next()
	call.Body.Close()
	if err != nil || first.ID == "" {
		t.Fatalf("the call's first event: %+v %v", first, err)
	}

	resp := doMCP(t, t.Context(), "GET", srvB.URL, map[string]string{"Mcp-Session-Id": sid, "Last-Event-ID": first.ID}, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume on B: %s", resp.Status)
	}
	defer resp.Body.Close()
	sc = sse.NewScanner(resp.Body)
	var at []time.Time // when each progress event arrived
	var reads []int64  // B's reads of the log by then
	for {
		ev, err := sc.Next()
		if err != nil {
			t.Fatalf("the resumed stream ended after %d progress events: %v", len(at), err)
		}
		if strings.Contains(string(ev.Data), `"result"`) {
			break
		}
		if strings.Contains(string(ev.Data), "notifications/progress") {
			at = append(at, time.Now())
			reads = append(reads, counted.reads.Load())
		}
	}
	if len(at) < 2 {
		t.Fatalf("%d progress events on B, want at least 2", len(at))
	}
	for i := 1; i < len(at); i++ {
		// The events are gap apart on A: so they must be on B.
		if d := at[i].Sub(at[i-1]); d > gap+500*time.Millisecond {
			t.Errorf("progress events %d and %d reached B's client %v apart, sent %v apart", i, i+1, d.Round(time.Millisecond), gap)
		}
		// Between them: the read of the announced append (perhaps one
		// more, for a wake that came during a read), not one a second.
		if n := reads[i] - reads[i-1]; n > 2 {
			t.Errorf("B read the log %d times in the %v between two events", n, at[i].Sub(at[i-1]).Round(time.Millisecond))
		}
	}
}
