package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/client"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// countServer is the MCP server the relay fronts in these tests. Its
// "count" tool sends n progress notifications, interval apart, then
// answers "counted n". Its "wait" tool sends one progress notification,
// then waits for gate.
func countServer(gate <-chan struct{}) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "client-test", Version: "1"}, nil)
	type countArgs struct {
		N          int `json:"n"`
		IntervalMS int `json:"interval_ms,omitempty"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "count", Description: "count to n"}, func(ctx context.Context, req *mcp.CallToolRequest, a countArgs) (*mcp.CallToolResult, any, error) {
		for i := 1; i <= a.N; i++ {
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: req.Params.GetProgressToken(), Progress: float64(i), Total: float64(a.N),
			}); err != nil {
				return nil, nil, err
			}
			select {
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			case <-time.After(time.Duration(a.IntervalMS) * time.Millisecond):
			}
		}
		return text(fmt.Sprintf("counted %d", a.N)), nil, nil
	})
	type waitArgs struct {
		Name string `json:"name"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "wait", Description: "waits for the test's gate"}, func(ctx context.Context, req *mcp.CallToolRequest, a waitArgs) (*mcp.CallToolResult, any, error) {
		// A first event, so that the call's stream is open before the
		// test goes on.
		req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1})
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		return text("done " + a.Name), nil, nil
	})
	return s
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

func resultText(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	if res == nil || len(res.Content) != 1 {
		t.Fatalf("result %+v: want one content", res)
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("content %T: want text", res.Content[0])
	}
	return tc.Text
}

// newRelay starts mcprelay in front of srv on a loopback listener.
func newRelay(t testing.TB, srv *mcp.Server, opts relay.Options) string {
	t.Helper()
	opts.Backend = backend.SDK(srv, nil)
	h, err := relay.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		h.Close()
		hs.CloseClientConnections()
		hs.Close()
	})
	return hs.URL
}

// cutter is an http.RoundTripper that cuts SSE response bodies after a
// random number of bytes, as a flaky network or proxy would.
type cutter struct {
	base http.RoundTripper
	prob float64 // chance that a body is cut
	max  int     // a cut body ends after [0, max) bytes

	mu   sync.Mutex
	rnd  *rand.Rand
	cuts atomic.Int64
}

func (c *cutter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(req)
	if err != nil || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp, err
	}
	c.mu.Lock()
	cut := c.rnd.Float64() < c.prob
	n := c.rnd.IntN(c.max)
	c.mu.Unlock()
	if cut {
		c.cuts.Add(1)
		resp.Body = &cutBody{rc: resp.Body, left: n}
	}
	return resp, nil
}

var errCut = errors.New("test: connection cut")

type cutBody struct {
	rc   io.ReadCloser
	left int
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		b.rc.Close()
		return 0, errCut
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= n
	return n, err
}

func (b *cutBody) Close() error { return b.rc.Close() }

// progressLog records the progress notifications a client receives, per
// token, in the order the SDK hands them to the handler.
type progressLog struct {
	mu     sync.Mutex
	got    map[string][]float64
	signal chan struct{}
}

func newProgressLog() *progressLog {
	return &progressLog{got: make(map[string][]float64), signal: make(chan struct{}, 1)}
}

func (p *progressLog) handle(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	p.mu.Lock()
	tok := fmt.Sprint(req.Params.ProgressToken)
	p.got[tok] = append(p.got[tok], req.Params.Progress)
	p.mu.Unlock()
	select {
	case p.signal <- struct{}{}:
	default:
	}
}

func (p *progressLog) get(tok string) []float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got[tok])
}

// waitFor waits until tok has n notifications or ctx ends.
func (p *progressLog) waitFor(ctx context.Context, tok string, n int) []float64 {
	for {
		if got := p.get(tok); len(got) >= n {
			return got
		}
		select {
		case <-p.signal:
		case <-ctx.Done():
			return p.get(tok)
		}
	}
}

// inOrder reports whether got is 1, 2, ..., len(got).
func inOrder(got []float64) bool {
	for i, v := range got {
		if v != float64(i+1) {
			return false
		}
	}
	return true
}

// TestChaos cuts the client's streams at random points during long tool
// calls through mcprelay, hundreds of times: every call must end with its
// result or a lost-request error, never hang, and every notification must
// reach the SDK exactly once and in order.
func TestChaos(t *testing.T) {
	runs := 300
	if testing.Short() {
		runs = 40
	}
	cases := []struct {
		name string
		poll time.Duration // relay's poll interval (0: none)
		prob float64
		max  int
	}{
		{name: "cuts", prob: 0.6, max: 1500},
		{name: "cuts_with_polling", poll: 15 * time.Millisecond, prob: 0.4, max: 1500},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := newRelay(t, countServer(nil), relay.Options{PollInterval: tc.poll})
			var results, lost, cuts int64
			for run := range runs {
				r, l, c := chaosRun(t, url, run, tc.prob, tc.max)
				results += r
				lost += l
				cuts += c
				if t.Failed() {
					t.Fatalf("run %d failed", run)
				}
			}
			t.Logf("%d runs: %d results, %d lost (typed error), %d bodies cut", runs, results, lost, cuts)
			// A call is lost only when its POST answer is cut before the
			// first event ID arrives (nothing to resume from): rare.
			if lost*10 > results {
				t.Errorf("%d calls lost, %d answered: resuming does not work", lost, results)
			}
		})
	}
}

func chaosRun(t *testing.T, url string, run int, prob float64, max int) (results, lost, cuts int64) {
	const calls, n = 3, 6
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cut := &cutter{base: http.DefaultTransport, prob: prob, max: max, rnd: rand.New(rand.NewPCG(uint64(run), 5))}
	tr := client.New(client.Options{
		Endpoint:   url,
		HTTPClient: &http.Client{Transport: cut},
		MinBackoff: time.Millisecond,
		MaxBackoff: 5 * time.Millisecond,
	})
	plog := newProgressLog()
	c := mcp.NewClient(&mcp.Implementation{Name: "chaos", Version: "1"}, &mcp.ClientOptions{ProgressNotificationHandler: plog.handle})
	cs, err := c.Connect(ctx, tr, nil)
	if err != nil {
		// The initialize answer itself may be cut: a typed loss.
		if !client.IsLost(err) {
			t.Errorf("run %d: connect: %v", run, err)
		}
		return 0, 1, cut.cuts.Load()
	}
	defer cs.Close()
	var wg sync.WaitGroup
	outcome := make([]error, calls)
	res := make([]*mcp.CallToolResult, calls)
	for i := range calls {
		wg.Go(func() {
			p := &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": n, "interval_ms": 2}}
			p.SetProgressToken(fmt.Sprintf("tok-%d", i))
			res[i], outcome[i] = cs.CallTool(ctx, p)
		})
	}
	wg.Wait()
	for i := range calls {
		tok := fmt.Sprintf("tok-%d", i)
		switch err := outcome[i]; {
		case err == nil:
			if got := resultText(t, res[i]); got != fmt.Sprintf("counted %d", n) {
				t.Errorf("run %d call %d: result %q", run, i, got)
			}
			got := plog.waitFor(ctx, tok, n)
			if len(got) != n || !inOrder(got) {
				t.Errorf("run %d call %d: progress %v, want 1..%d exactly once in order", run, i, got, n)
			}
			results++
		case client.IsLost(err) && errors.Is(err, client.ErrRequestLost):
			var le *client.LostError
			if !errors.As(err, &le) || le.Reason != client.ReasonUnattributable {
				t.Errorf("run %d call %d: lost for an unexpected reason: %v", run, i, err)
			}
			if got := plog.get(tok); !inOrder(got) {
				t.Errorf("run %d call %d (lost): progress %v: duplicated or out of order", run, i, got)
			}
			lost++
		default:
			t.Errorf("run %d call %d: %v (want a result or ErrRequestLost)", run, i, err)
		}
	}
	if ctx.Err() != nil {
		t.Errorf("run %d: hung until the test's deadline", run)
	}
	cs.Close()
	for i := range calls { // nothing arrived twice after the fact
		if got := plog.get(fmt.Sprintf("tok-%d", i)); len(got) > n || !inOrder(got) {
			t.Errorf("run %d call %d: progress after close %v", run, i, got)
		}
	}
	return results, lost, cut.cuts.Load()
}

// swapHandler serves whichever relay is current: swapping it simulates the
// relay losing every session (a restart without a shared store).
type swapHandler struct {
	mu sync.Mutex
	h  *relay.Handler
}

func (s *swapHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	h := s.h
	s.mu.Unlock()
	h.ServeHTTP(w, r)
}

func (s *swapHandler) swap(t *testing.T, srv *mcp.Server) {
	h, err := relay.New(relay.Options{Backend: backend.SDK(srv, nil)})
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	old := s.h
	s.h = h
	s.mu.Unlock()
	if old != nil {
		old.Close()
	}
	t.Cleanup(func() { h.Close() })
}

// TestSessionLost: the server forgets the session (404) while calls are in
// flight. The client re-initializes; a call marked idempotent is re-sent
// and answered, the other fails with ErrRequestLost through the SDK.
func TestSessionLost(t *testing.T) {
	started := newProgressLog()
	gate := make(chan struct{})
	srv := countServer(gate)
	sh := &swapHandler{}
	sh.swap(t, srv)
	hs := httptest.NewServer(sh)
	defer hs.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr := client.New(client.Options{Logger: testLogger(t), Endpoint: hs.URL, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "lost", Version: "1"}, &mcp.ClientOptions{ProgressNotificationHandler: started.handle}).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	before := cs.ID()

	type outcome struct {
		res *mcp.CallToolResult
		err error
	}
	callWait := func(ctx context.Context, name string) <-chan outcome {
		ch := make(chan outcome, 1)
		go func() {
			p := &mcp.CallToolParams{Name: "wait", Arguments: map[string]any{"name": name}}
			p.SetProgressToken(name)
			res, err := cs.CallTool(ctx, p)
			ch <- outcome{res, err}
		}()
		return ch
	}
	plain := callWait(ctx, "plain")
	safe := callWait(client.Idempotent(ctx), "safe")
	for _, name := range []string{"plain", "safe"} {
		if len(started.waitFor(ctx, name, 1)) == 0 {
			t.Fatal("calls never started")
		}
	}
	sh.swap(t, srv) // every session is gone
	close(gate)

	p := <-plain
	if !errors.Is(p.err, client.ErrRequestLost) || !client.IsLost(p.err) {
		t.Errorf("non-idempotent call: err = %v, want ErrRequestLost", p.err)
	}
	var le *client.LostError
	if !errors.As(p.err, &le) || le.Reason != client.ReasonSessionLost {
		t.Errorf("non-idempotent call: %v, want a *LostError with reason %s", p.err, client.ReasonSessionLost)
	}
	s := <-safe
	if s.err != nil {
		t.Fatalf("idempotent call: %v, want it re-sent and answered", s.err)
	}
	if got := resultText(t, s.res); got != "done safe" {
		t.Errorf("idempotent call: %q", got)
	}
	if cs.ID() == before || cs.ID() == "" {
		t.Errorf("session ID %q after re-initialization, was %q", cs.ID(), before)
	}
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Errorf("tools/list on the new session: %v", err)
	}
}

// TestPolling: a relay that closes streams for polling (with retry) still
// delivers a long call's notifications once, in order, and the client
// resumes the close after exactly the retry the relay sent. In a synctest
// bubble (the client reaches the relay in process), so timing is exact: 21
// events 3 ms apart answer at 63 ms; the relay closes the call's POST
// stream 10 ms after it opens and the client comes back 10 ms later, at
// 20 ms; the resumed GET is not closed again, so that is the one resume.
func TestPolling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		endWorkers(t)
		const poll = 10 * time.Millisecond
		secret := []byte("client-test-secret-0123456789abcdef")
		codec, err := resume.NewCodec(secret)
		if err != nil {
			t.Fatal(err)
		}
		h, err := relay.New(relay.Options{Backend: backend.SDK(countServer(nil), nil), PollInterval: poll, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		var mu sync.Mutex
		resumes := map[resume.StreamKey][]time.Duration{} // by the stream resumed
		start := time.Now()
		hc := &http.Client{Transport: backend.InProcess(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") != "" {
				cur, err := codec.Parse(r.Header.Get("Last-Event-ID"))
				if err != nil {
					t.Errorf("the client resumed with a cursor the relay never sent: %v", err)
				}
				mu.Lock()
				resumes[cur.Stream] = append(resumes[cur.Stream], time.Since(start))
				mu.Unlock()
			}
			h.ServeHTTP(w, r)
		}))}
		ctx := t.Context()
		plog := newProgressLog()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "poll", Version: "1"}, &mcp.ClientOptions{ProgressNotificationHandler: plog.handle}).
			Connect(ctx, client.New(client.Options{Endpoint: "http://relay.test/mcp", HTTPClient: hc}), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		p := &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": 21, "interval_ms": 3}}
		p.SetProgressToken("poll")
		start = time.Now()
		res, err := cs.CallTool(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if got := resultText(t, res); got != "counted 21" {
			t.Errorf("result %q", got)
		}
		if got := time.Since(start); got != 63*time.Millisecond {
			t.Errorf("the result came after %v, want 63ms", got)
		}
		if got := plog.waitFor(ctx, "poll", 21); len(got) != 21 || !inOrder(got) {
			t.Errorf("progress %v", got)
		}
		mu.Lock()
		defer mu.Unlock()
		// The GET that opens the standalone stream is closed at 10 ms
		// too; the call's stream is the one whose resumes are counted here.
		want := []time.Duration{20 * time.Millisecond}
		found := false
		for _, at := range resumes {
			found = found || slices.Equal(at, want)
		}
		if !found {
			t.Errorf("the client resumed its streams at %v, want the call's at %v (closed every %v, retry %v)", resumes, want, poll, poll)
		}
	})
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// firstCallCut cuts the first SSE answer to a POST (the tools/call) after
// its first n events, as a dropped connection would.
type firstCallCut struct {
	base http.RoundTripper
	n    int
	done atomic.Bool
}

func (c *firstCallCut) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(req)
	if err != nil || req.Method != http.MethodPost || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || !c.done.CompareAndSwap(false, true) {
		return resp, err
	}
	resp.Body = &eventCutBody{rc: resp.Body, left: c.n}
	return resp, nil
}

// eventCutBody reads whole SSE events until left are read, then fails.
type eventCutBody struct {
	rc   io.ReadCloser
	left int
	prev byte
}

func (b *eventCutBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		b.rc.Close()
		return 0, errCut
	}
	n, err := b.rc.Read(p[:1]) // byte by byte: stop right after the n-th event
	if n == 1 {
		if p[0] == '\n' && b.prev == '\n' {
			b.left--
		}
		b.prev = p[0]
	}
	return n, err
}

func (b *eventCutBody) Close() error { return b.rc.Close() }

// TestGapReported: with a retention of 4 events per session, the events a
// call logs while its client is away (its stream cut after the priming
// event and 2 progress notifications, 100 ms of backoff) are evicted; the
// resume brings a gap reset, which the client reports to its caller
// (Options.OnReset), then the rest, and the call ends with its result.
// In a synctest bubble, the relay in process: the timing is exact.
func TestGapReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		endWorkers(t)
		st := eventlog.NewMemory(eventlog.Retention{MaxEvents: 4})
		t.Cleanup(func() { st.Close() })
		h, err := relay.New(relay.Options{Backend: backend.SDK(countServer(nil), nil), Store: st})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		var mu sync.Mutex
		var resets []resume.Reset
		tr := client.New(client.Options{
			Endpoint:   "http://relay.test/mcp",
			HTTPClient: &http.Client{Transport: &firstCallCut{base: backend.InProcess(h), n: 3}},
			MinBackoff: 100 * time.Millisecond,
			MaxBackoff: 100 * time.Millisecond,
			OnReset: func(r resume.Reset) {
				mu.Lock()
				resets = append(resets, r)
				mu.Unlock()
			},
		})
		plog := newProgressLog()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "gap", Version: "1"}, &mcp.ClientOptions{ProgressNotificationHandler: plog.handle}).Connect(t.Context(), tr, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		// 40 events 5 ms apart: the call goes on for 200 ms, half of it
		// while the client waits to resume.
		p := &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": 40, "interval_ms": 5}}
		p.SetProgressToken("gap")
		res, err := cs.CallTool(t.Context(), p)
		if err != nil {
			t.Fatal(err)
		}
		if got := resultText(t, res); got != "counted 40" {
			t.Errorf("result %q", got)
		}
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(resets) != 1 || resets[0].Reason != resume.ReasonGap {
			t.Fatalf("resets reported %+v, want one gap", resets)
		}
		// 1 and 2 before the cut, then a jump past what was evicted, then
		// every notification up to 40.
		got := plog.get("gap")
		ok := len(got) > 2 && slices.Equal(got[:2], []float64{1, 2}) && got[2] > 3 && got[len(got)-1] == 40
		for i := 3; ok && i < len(got); i++ {
			ok = got[i] == got[i-1]+1
		}
		if !ok {
			t.Errorf("progress %v: want 1, 2, then a jump (the gap), then each up to 40", got)
		}
	})
}
