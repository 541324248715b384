package load

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

// RoundTripResult is the outcome of [RoundTrips].
type RoundTripResult struct {
	Calls   int           `json:"calls"`
	Errors  int           `json:"errors"`
	Elapsed time.Duration `json:"elapsed_ns"`
	PerSec  float64       `json:"per_sec"`
	P50     time.Duration `json:"p50_ns"`
	P99     time.Duration `json:"p99_ns"`
}

// RoundTrips opens sessions sessions, then calls test_simple_text in a loop
// on each, concurrently, for d; it reports completed calls per second and
// the latency quantiles of successful calls.
func RoundTrips(ctx context.Context, c *Client, sessions int, d time.Duration) (RoundTripResult, error) {
	ss, err := openSessions(ctx, c, sessions, 32)
	if err != nil {
		return RoundTripResult{}, err
	}
	lat := make([][]time.Duration, sessions)
	errs := make([]int, sessions)
	var firstErr error
	var once sync.Once
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i, s := range ss {
		wg.Go(func() {
			l := make([]time.Duration, 0, 4096)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				if err := s.Call(ctx, ToolSimple); err != nil {
					errs[i]++
					once.Do(func() { firstErr = err })
					continue
				}
				l = append(l, time.Since(t0))
			}
			lat[i] = l
		})
	}
	wg.Wait()
	res := RoundTripResult{Elapsed: time.Since(start)}
	all := slices.Concat(lat...)
	res.Calls = len(all)
	for _, e := range errs {
		res.Errors += e
	}
	if res.Calls == 0 {
		if firstErr == nil {
			firstErr = ctx.Err()
		}
		return res, fmt.Errorf("load: no round trip succeeded: %w", firstErr)
	}
	res.PerSec = float64(res.Calls) / res.Elapsed.Seconds()
	slices.Sort(all)
	res.P50, res.P99 = Quantile(all, 0.50), Quantile(all, 0.99)
	for _, s := range ss {
		s.Delete(ctx)
	}
	return res, nil
}

// StreamsResult is the outcome of [Streams].
type StreamsResult struct {
	Streams   int           `json:"streams"`
	PerStream int           `json:"per_stream"`
	Received  int           `json:"received"`
	Lost      int           `json:"lost"`   // asked for but never received
	Resets    int           `json:"resets"` // explicit loss signals received
	Errors    int           `json:"errors"` // streams that failed or ended without the response
	Elapsed   time.Duration `json:"elapsed_ns"`
	PerSec    float64       `json:"events_per_sec"`
}

// Streams opens streams sessions and, at once, one stream_progress call of
// n notifications on each; it counts every notification received and
// reports events per second over the wall time of the whole lot.
func Streams(ctx context.Context, c *Client, streams, n int) (StreamsResult, error) {
	ss, err := openSessions(ctx, c, streams, 32)
	if err != nil {
		return StreamsResult{}, err
	}
	stats := make([]StreamStats, streams)
	errs := make([]error, streams)
	start := time.Now()
	var wg sync.WaitGroup
	for i, s := range ss {
		wg.Go(func() { stats[i], errs[i] = s.Stream(ctx, n, 0) })
	}
	wg.Wait()
	res := StreamsResult{Streams: streams, PerStream: n, Elapsed: time.Since(start)}
	var firstErr error
	for i, st := range stats {
		res.Received += st.Progress
		res.Lost += max(n-st.Progress, 0)
		res.Resets += st.Resets
		if errs[i] != nil {
			res.Errors++
			firstErr = cmpErr(firstErr, errs[i])
		}
	}
	res.PerSec = float64(res.Received) / res.Elapsed.Seconds()
	for _, s := range ss {
		s.Delete(ctx)
	}
	if res.Received == 0 {
		return res, fmt.Errorf("load: no event received: %w", firstErr)
	}
	return res, nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// ResumeResult is the outcome of [Resume].
type ResumeResult struct {
	Back    int `json:"back"`
	Samples int `json:"samples"`
	// FirstP50 and FirstP99 are the time from sending the GET to the first
	// replayed event.
	FirstP50 time.Duration `json:"first_p50_ns"`
	FirstP99 time.Duration `json:"first_p99_ns"`
	// PerSec is the median over samples of notifications replayed per
	// second, from sending the GET to the replayed response.
	PerSec float64 `json:"replay_per_sec"`
	// Lost counts, over all samples, notifications after the cursor that
	// were not replayed; Resets the explicit loss signals.
	Lost   int `json:"lost"`
	Resets int `json:"resets"`
	Errors int `json:"errors"`
}

// Resume opens a session, streams back+lead notifications in one call,
// keeps the event ID of notification number lead, and then resumes from it
// samples times (one GET with Last-Event-ID each, read to the replayed
// response): each replay should carry back notifications and the response.
// Each sample is bounded by timeout.
func Resume(ctx context.Context, c *Client, back, lead, samples int, timeout time.Duration) (ResumeResult, error) {
	lead = max(lead, 1)
	s, err := c.Initialize(ctx)
	if err != nil {
		return ResumeResult{}, err
	}
	defer s.Delete(ctx)
	st, err := s.Stream(ctx, back+lead, lead)
	if err != nil {
		return ResumeResult{}, fmt.Errorf("load: resume: the call to resume: %w", err)
	}
	if st.KeptID == "" {
		return ResumeResult{}, fmt.Errorf("load: resume: notification %d carried no event ID", lead)
	}
	// Some servers (the Go SDK) take a moment to mark a finished POST
	// stream done and answer 409 until then.
	if err := awaitResumable(ctx, s, st.KeptID); err != nil {
		return ResumeResult{}, err
	}
	res := ResumeResult{Back: back, Samples: samples}
	var first []time.Duration
	var rates []float64
	var firstErr error
	for range samples {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		rs, err := s.Resume(sctx, st.KeptID)
		cancel()
		if err == nil && !rs.Response {
			err = ErrNoResponse
		}
		res.Lost += max(back-rs.Progress, 0)
		res.Resets += rs.Resets
		if err != nil {
			res.Errors++
			firstErr = cmpErr(firstErr, err)
		}
		if rs.FirstEvent > 0 {
			first = append(first, rs.FirstEvent)
			rates = append(rates, float64(rs.Progress)/rs.Elapsed.Seconds())
		}
	}
	if len(first) == 0 {
		if firstErr == nil {
			firstErr = errors.New("no event")
		}
		return res, fmt.Errorf("load: resume replayed nothing: %w", firstErr)
	}
	slices.Sort(first)
	res.FirstP50, res.FirstP99 = Quantile(first, 0.50), Quantile(first, 0.99)
	res.PerSec = Median(rates)
	return res, nil
}

// Mem is a server process's memory, after a garbage collection.
type Mem struct {
	HeapAlloc  uint64 `json:"heap_alloc"`
	StackInuse uint64 `json:"stack_inuse"`
	Sys        uint64 `json:"sys"`
	RSS        uint64 `json:"rss"` // resident set size (VmRSS), 0 where unknown
	Goroutines int    `json:"goroutines"`
}

// ReadMem collects garbage twice and reads this process's memory.
func ReadMem() Mem {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return Mem{HeapAlloc: ms.HeapAlloc, StackInuse: ms.StackInuse, Sys: ms.Sys, RSS: rss(), Goroutines: runtime.NumGoroutine()}
}

func rss() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	return statusRSS(b)
}

// MemHandler serves [ReadMem] of this process as JSON.
func MemHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(ReadMem())
	})
}

// FetchMem returns a func that reads the [MemHandler] at url.
func FetchMem(url string) func(context.Context) (Mem, error) {
	return func(ctx context.Context) (Mem, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return Mem{}, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return Mem{}, err
		}
		defer resp.Body.Close()
		var m Mem
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			return Mem{}, fmt.Errorf("load: memory endpoint: %w", err)
		}
		return m, nil
	}
}

// PerItem is memory per idle session or per idle stream: the growth of
// the server's figures divided by the count.
type PerItem struct {
	Heap       float64 `json:"heap_bytes"`
	Stack      float64 `json:"stack_bytes"`
	RSS        float64 `json:"rss_bytes"`
	Goroutines float64 `json:"goroutines"`
}

func perItem(before, after Mem, n int) PerItem {
	d := func(a, b uint64) float64 { return (float64(b) - float64(a)) / float64(n) }
	return PerItem{
		Heap:       d(before.HeapAlloc, after.HeapAlloc),
		Stack:      d(before.StackInuse, after.StackInuse),
		RSS:        d(before.RSS, after.RSS),
		Goroutines: float64(after.Goroutines-before.Goroutines) / float64(n),
	}
}

// IdleResult is the outcome of [Idle].
type IdleResult struct {
	Sessions int     `json:"sessions"`
	Session  PerItem `json:"per_session"`
	Streams  int     `json:"streams"`           // 0: not measured
	Stream   PerItem `json:"per_stream"`        // above the session's own cost
	Failed   int     `json:"failed_to_open"`    // GET streams that did not open
	Open     Mem     `json:"with_everything"`   // the server with all of them open
	Baseline Mem     `json:"before_any_opened"` // the server before
}

// Idle opens n initialized sessions and measures the server's memory
// (through mem) per session; then, if streams, one open GET stream per
// session, and the memory per stream above that. The sessions and streams
// stay open until the returned func is called, so that later workloads run
// with them live.
func Idle(ctx context.Context, c *Client, n int, streams bool, mem func(context.Context) (Mem, error)) (IdleResult, func(), error) {
	res := IdleResult{Sessions: n}
	before, err := mem(ctx)
	if err != nil {
		return res, func() {}, err
	}
	res.Baseline = before
	ss, err := openSessions(ctx, c, n, 32)
	if err != nil {
		return res, func() {}, err
	}
	closeAll := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		forEach(len(ss), 32, func(i int) error { ss[i].Delete(dctx); return nil })
		c.CloseIdle()
	}
	withSessions, err := mem(ctx)
	if err != nil {
		return res, closeAll, err
	}
	res.Session = perItem(before, withSessions, n)
	res.Open = withSessions
	if !streams {
		return res, closeAll, nil
	}
	gets := make([]io.Closer, n)
	var mu sync.Mutex
	var firstErr error
	forEach(n, 64, func(i int) error {
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		cl, err := ss[i].OpenGET(context.WithoutCancel(gctx))
		if err != nil {
			mu.Lock()
			res.Failed++
			firstErr = cmpErr(firstErr, err)
			mu.Unlock()
			return nil
		}
		gets[i] = cl
		return nil
	})
	closeSessions := closeAll
	closeAll = func() {
		for _, g := range gets {
			if g != nil {
				g.Close()
			}
		}
		closeSessions()
	}
	res.Streams = n - res.Failed
	if res.Streams == 0 {
		return res, closeAll, fmt.Errorf("load: no GET stream opened: %w", firstErr)
	}
	withStreams, err := mem(ctx)
	if err != nil {
		return res, closeAll, err
	}
	res.Stream = perItem(withSessions, withStreams, res.Streams)
	res.Open = withStreams
	return res, closeAll, nil
}

// openSessions initializes n sessions with up to par at a time.
func openSessions(ctx context.Context, c *Client, n, par int) ([]*Session, error) {
	ss := make([]*Session, n)
	err := forEach(n, par, func(i int) error {
		s, err := c.Initialize(ctx)
		ss[i] = s
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("load: opening %d sessions: %w", n, err)
	}
	return ss, nil
}

// forEach calls fn(0..n-1) on up to par goroutines and returns the first
// error; after one, the calls not yet started are skipped.
func forEach(n, par int, fn func(int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, par)
	for i := range n {
		mu.Lock()
		failed := first != nil
		mu.Unlock()
		if failed {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(i); err != nil {
				mu.Lock()
				first = cmpErr(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// Quantile returns the q-quantile (nearest rank) of sorted.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Median returns the median of xs (the mean of the middle two for an even
// count), or NaN for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// awaitResumable retries a resume answered 409 Conflict for up to a second.
func awaitResumable(ctx context.Context, s *Session, id string) error {
	_, err := ResumeSettled(ctx, s, id)
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return nil // the samples report any other outcome
}

// ResumeSettled is [Session.Resume], retried for up to a second while the
// server answers 409 Conflict: a stream it has not yet marked finished, or
// (the Go SDK) a resume of the same stream it has not released yet.
func ResumeSettled(ctx context.Context, s *Session, lastEventID string) (StreamStats, error) {
	for i := 0; ; i++ {
		st, err := s.Resume(ctx, lastEventID)
		if err == nil || !errors.Is(err, ErrStatus) || !strings.Contains(err.Error(), "409") || i == 100 {
			return st, err
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
