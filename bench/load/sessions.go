package load

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// FirstResult is the outcome of [First].
type FirstResult struct {
	Samples int           `json:"samples"`
	P50     time.Duration `json:"p50_ns"`
	P99     time.Duration `json:"p99_ns"`
}

// First measures, samples times one after another, how long a new session
// takes from sending initialize to the result of its first tools/call
// (test_simple_text): where a server starts a process per session, that
// start is in it. Each session is deleted before the next.
func First(ctx context.Context, c *Client, samples int) (FirstResult, error) {
	res := FirstResult{Samples: samples}
	lat := make([]time.Duration, 0, samples)
	for range samples {
		t0 := time.Now()
		s, err := c.Initialize(ctx)
		if err != nil {
			return res, fmt.Errorf("load: first call: %w", err)
		}
		err = s.Call(ctx, ToolSimple)
		d := time.Since(t0)
		s.Delete(ctx)
		if err != nil {
			return res, fmt.Errorf("load: first call: %w", err)
		}
		lat = append(lat, d)
	}
	slices.Sort(lat)
	res.P50, res.P99 = Quantile(lat, 0.50), Quantile(lat, 0.99)
	return res, nil
}

// SessionMemResult is the outcome of [SessionMem].
type SessionMemResult struct {
	Sessions int     `json:"sessions"`
	Before   TreeMem `json:"before"` // the server before any session was opened
	Open     TreeMem `json:"open"`   // with the sessions open
	// PerSession is Open.RSS / Sessions: the whole server (and its
	// children) divided among the sessions.
	PerSession float64 `json:"per_session_bytes"`
	// Added is (Open.RSS - Before.RSS) / Sessions: what each session adds.
	Added float64 `json:"added_per_session_bytes"`
	// RootAdded is Added for the server process alone, without children.
	RootAdded float64 `json:"root_added_per_session_bytes"`
}

// SessionMem opens n sessions, each with one tools/call answered (so that a
// server that starts a process per session has started it), and reads the
// resident memory of the server process tree (through mem, e.g.
// [ReadTreeMem] of its pid) before and with them open; the sessions are
// deleted before it returns.
func SessionMem(ctx context.Context, c *Client, n int, mem func() (TreeMem, error)) (SessionMemResult, error) {
	res := SessionMemResult{Sessions: n}
	var err error
	if res.Before, err = mem(); err != nil {
		return res, err
	}
	ss, err := openSessions(ctx, c, n, 8)
	if err != nil {
		return res, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		forEach(len(ss), 8, func(i int) error { ss[i].Delete(dctx); return nil })
	}()
	if err := forEach(n, 8, func(i int) error { return ss[i].Call(ctx, ToolSimple) }); err != nil {
		return res, fmt.Errorf("load: a call on each session: %w", err)
	}
	if res.Open, err = mem(); err != nil {
		return res, err
	}
	res.PerSession = float64(res.Open.RSS) / float64(n)
	res.Added = (float64(res.Open.RSS) - float64(res.Before.RSS)) / float64(n)
	res.RootAdded = (float64(res.Open.Root) - float64(res.Before.Root)) / float64(n)
	return res, nil
}
