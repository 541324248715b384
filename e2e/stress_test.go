package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/internal/mcptest"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Bounds of the stress runs. Events flow every few milliseconds while a
// call runs, so a connection silent for connWait is hung.
const (
	connWait     = 8 * time.Second  // one connection, from request to end
	callWait     = 20 * time.Second // one call, across all its connections
	finishedWait = 2 * time.Second  // a resume of a finished stream must answer and end within this
	maxConns     = 40               // connections per call
	maxCuts      = 6                // cuts per call; later connections are read to their end
)

// stressVariant configures one stress run.
type stressVariant struct {
	name         string
	retention    eventlog.Retention
	sessions     int
	calls        int           // sequential calls per session
	count        int           // progress notifications per call (plus the session's index)
	intervalMS   int           // between two notifications
	restartAfter time.Duration // backend restart, after every session is initialized
	maxPause     time.Duration // between a cut and its resume
}

var stressVariants = []stressVariant{
	{name: "restart", sessions: 16, calls: 3, count: 30, intervalMS: 8, restartAfter: 200 * time.Millisecond, maxPause: 30 * time.Millisecond},
	// Six events per session: any pause longer than a few notifications
	// leaves an eviction hole behind the client's cursor.
	{name: "tiny retention", retention: eventlog.Retention{MaxEvents: 6}, sessions: 16, calls: 3, count: 30, intervalMS: 8, restartAfter: 200 * time.Millisecond, maxPause: 120 * time.Millisecond},
}

// The never-events of docs/design.md, as keys of stressReport.violations (0: the run
// itself could not be set up).
const (
	ruleSetup        = 0
	ruleCrossSession = 1 // never-event 1
	ruleSilentGap    = 2 // never-event 2
	ruleHang         = 3 // never-event 3
	ruleIDRepeat     = 4 // never-event 4
	ruleLost         = 5 // never-event 5
)

// stressReport is what a stress run observed.
type stressReport struct {
	mu         sync.Mutex
	violations map[int][]string
	stats      map[string]int
	ids        map[string]idRecord // every event ID delivered with data, run-wide
}

type idRecord struct {
	call string // "s03/c2"
	data string
}

func (r *stressReport) violate(rule int, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.violations[rule]) < 20 {
		r.violations[rule] = append(r.violations[rule], fmt.Sprintf(format, args...))
	} else {
		r.stats[fmt.Sprintf("violations/%d/dropped", rule)]++
	}
}

func (r *stressReport) count(name string) {
	r.mu.Lock()
	r.stats[name]++
	r.mu.Unlock()
}

func (r *stressReport) stat(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats[name]
}

// check fails t with rule's violations, and with setup failures.
func (r *stressReport) check(t *testing.T, rule int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	t.Logf("stats %v", r.stats)
	for _, v := range r.violations[ruleSetup] {
		t.Errorf("setup: %s", v)
	}
	for _, v := range r.violations[rule] {
		t.Errorf("never-event %d: %s", rule, v)
	}
	if n := r.stats[fmt.Sprintf("violations/%d/dropped", rule)]; n > 0 {
		t.Errorf("never-event %d: %d more violations", rule, n)
	}
}

var (
	stressMu   sync.Mutex
	stressRuns = map[string]*stressReport{}
)

// stress runs v once per test binary run and returns what it observed;
// each never-event test checks its own rule against the same runs.
func stress(t *testing.T, v stressVariant) *stressReport {
	t.Helper()
	stressMu.Lock()
	defer stressMu.Unlock()
	if r, ok := stressRuns[v.name]; ok {
		return r
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("stress run %q, seed %d", v.name, seed)
	r := runStress(v, seed)
	stressRuns[v.name] = r
	return r
}

func runStress(v stressVariant, seed uint64) *stressReport {
	r := &stressReport{violations: map[int][]string{}, stats: map[string]int{}, ids: map[string]idRecord{}}
	be := mcptest.NewRestartable(func() http.Handler {
		srv := exampleserver.New(nil)
		addRequestStreamTool(srv)
		return backend.SDKHandler(srv, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	})
	defer be.Stop()
	up := backend.Handler(be)
	up.StatelessURL = up.URL + "/stateless"
	h, err := relay.New(relay.Options{Backend: up, Secret: testSecret, Store: eventlog.NewMemory(v.retention)})
	if err != nil {
		r.violate(ruleSetup, "relay.New: %v", err)
		return r
	}
	srv := httptest.NewServer(h)
	defer func() {
		h.Close()
		srv.CloseClientConnections()
		srv.Close()
	}()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()

	rnd := newRand(seed)
	stopRestart := make(chan struct{})
	restarted := make(chan struct{})
	// The victim is a call that cannot end before the restart (it would
	// stream for hours) and has its first progress when the restart's
	// clock starts: at least one call is lost by the restart, every run.
	victimRunning := make(chan struct{})
	var inits sync.WaitGroup // the restart comes once every session has its first call running
	inits.Add(v.sessions)
	go func() {
		defer close(restarted)
		inits.Wait()
		select {
		case <-victimRunning:
		case <-stopRestart:
			return
		}
		select {
		case <-time.After(v.restartAfter):
			be.Restart()
			r.count("backend restarts")
		case <-stopRestart:
		}
	}()
	var wg sync.WaitGroup
	wg.Go(func() {
		s := &rawClient{url: srv.URL, client: client, auth: "Bearer victim", name: "victim", rep: r, rnd: rnd, v: v, running: victimRunning}
		if err := s.initialize(); err != nil {
			r.violate(ruleSetup, "%s: %v", s.name, err)
			close(victimRunning)
			return
		}
		if c := s.call(1, 1<<20); c.lost {
			r.count("victim lost")
		}
	})

	var finished []*callState
	var finMu sync.Mutex
	for i := range v.sessions {
		wg.Go(func() {
			s := &rawClient{url: srv.URL, client: client, auth: fmt.Sprintf("Bearer tenant-%02d", i), name: fmt.Sprintf("s%02d", i), rep: r, rnd: rnd, v: v}
			err := s.initialize()
			inits.Done()
			if err != nil {
				r.violate(ruleSetup, "%s: %v", s.name, err)
				return
			}
			for k := 1; k <= v.calls; k++ {
				c := s.call(k, v.count+i)
				finMu.Lock()
				finished = append(finished, c)
				finMu.Unlock()
			}
		})
	}
	wg.Wait()
	close(stopRestart)
	<-restarted

	// Every finished stream, resumed once more after the run (and after
	// the backend restart): it answers and ends within the bound.
	for _, c := range finished {
		wg.Go(func() { c.s.resumeFinished(c, c.terminalID, "after the run") })
	}
	wg.Wait()
	r.mu.Lock()
	for k, n := range h.Counts() {
		r.stats["relay "+k] = int(n)
	}
	r.mu.Unlock()
	return r
}

// rawClient is one session spoken by hand over HTTP.
type rawClient struct {
	url    string
	client *http.Client
	auth   string
	name   string
	id     string
	rep    *stressReport
	rnd    *lockedRand
	v      stressVariant

	running     chan struct{} // if not nil, closed at the first progress notification
	runningOnce sync.Once
}

func (s *rawClient) request(ctx context.Context, method, body, lastEventID string) (*http.Response, error) {
	hdr := map[string]string{"Authorization": s.auth, "Last-Event-ID": lastEventID}
	if s.id != "" {
		hdr["Mcp-Session-Id"] = s.id
		hdr["Mcp-Protocol-Version"] = "2025-11-25"
	}
	req, err := mcptest.NewRequest(ctx, method, s.url, hdr, body)
	if err != nil {
		return nil, err
	}
	return s.client.Do(req)
}

func (s *rawClient) initialize() error {
	ctx, cancel := context.WithTimeout(context.Background(), connWait)
	defer cancel()
	resp, err := s.request(ctx, "POST", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"stress","version":"1"}}}`, "")
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Mcp-Session-Id") == "" {
		return fmt.Errorf("initialize: %s", resp.Status)
	}
	s.id = resp.Header.Get("Mcp-Session-Id")
	resp, err = s.request(ctx, "POST", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("notifications/initialized: %s", resp.Status)
	}
	return nil
}

// callState is what the client knows of one call's stream.
type callState struct {
	s          *rawClient
	name       string // "s03/c2"
	id         int
	token      string
	count      int
	order      []string          // data event IDs in first-delivery order
	pos        map[string]int    // index in order
	data       map[string]string // event data by ID
	progress   map[string]int    // progress value by ID (0: not a progress notification)
	priming    string            // the priming event's ID
	resets     []string
	done       bool // response received
	lost       bool // the response was the request-lost error
	terminalID string
}

// call runs one stream_progress-like call (requestStreamTool) to its end,
// cutting and resuming its stream.
func (s *rawClient) call(k, count int) *callState {
	c := &callState{s: s, name: fmt.Sprintf("%s/c%d", s.name, k), id: k, token: fmt.Sprintf("%s-c%d", s.name, k), count: count,
		pos: map[string]int{}, data: map[string]string{}, progress: map[string]int{}}
	ctx, cancel := context.WithTimeout(context.Background(), callWait)
	defer cancel()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":{"count":%d,"interval_ms":%d},"_meta":{"progressToken":%q}}}`,
		k, requestStreamTool, count, s.v.intervalMS, c.token)
	resp, err := s.request(ctx, "POST", body, "")
	if err != nil {
		s.rep.violate(ruleLost, "%s: POST tools/call: %v", c.name, err)
		return c
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body.Close()
		s.rep.violate(ruleLost, "%s: POST tools/call: %s %s", c.name, resp.Status, resp.Header.Get("Content-Type"))
		return c
	}
	cuts := 0
	cursor := ""
	for conn := 0; ; conn++ {
		limit := 0
		if cuts < maxCuts && s.rnd.between(0, 10) < 7 {
			limit = s.rnd.between(100, 2500)
			cuts++
		}
		cut, err := c.consume(resp, cursor, limit, "live")
		if cut {
			s.rep.count("cuts")
		}
		if c.done {
			break
		}
		if err != nil && !cut {
			s.rep.violate(ruleLost, "%s: connection %d ended with %v before the response", c.name, conn, err)
		}
		if conn+1 >= maxConns || ctx.Err() != nil {
			s.rep.violate(ruleLost, "%s: no response or error after %d connections: %v", c.name, conn+1, c.resets)
			return c
		}
		if p := s.v.maxPause; p > 0 {
			time.Sleep(time.Duration(s.rnd.between(0, int(p))))
		}
		cursor = c.pickCursor()
		resp, err = s.request(ctx, "GET", "", cursor)
		if err != nil {
			s.rep.violate(ruleLost, "%s: resume: %v", c.name, err)
			return c
		}
		s.rep.count("resumes")
		if resp.StatusCode != 200 {
			resp.Body.Close()
			s.rep.violate(ruleLost, "%s: resume before the response: %s", c.name, resp.Status)
			return c
		}
	}
	// The response ended the stream. Resuming it now must answer at once:
	// from its terminal event, 204; from an earlier cursor, the rest, then
	// the end.
	s.resumeFinished(c, c.terminalID, "at the terminal event")
	if len(c.order) > 1 {
		s.resumeFinished(c, c.order[s.rnd.between(0, len(c.order)-1)], "before the terminal event")
	}
	return c
}

// pickCursor returns the last event ID seen, or now and then an older one
// (a client that lost some state): what follows must then be a faithful
// replay.
func (c *callState) pickCursor() string {
	if len(c.order) == 0 {
		return c.priming
	}
	if len(c.order) > 2 && c.s.rnd.between(0, 4) == 0 {
		c.s.rep.count("resumes from an older cursor")
		return c.order[c.s.rnd.between(0, len(c.order)-1)]
	}
	return c.order[len(c.order)-1]
}

// resumeFinished resumes a finished stream at cursor and checks that the
// relay answers 204, or a replay that ends, within finishedWait.
func (s *rawClient) resumeFinished(c *callState, cursor, when string) {
	if cursor == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), finishedWait)
	defer cancel()
	resp, err := s.request(ctx, "GET", "", cursor)
	if err != nil {
		s.rep.violate(ruleHang, "%s: resume of the finished stream %s: %v", c.name, when, err)
		return
	}
	s.rep.count("finished resumes")
	switch {
	case resp.StatusCode == http.StatusNoContent:
		resp.Body.Close()
		s.rep.count("finished resumes answered 204")
		if cursor != c.terminalID {
			s.rep.violate(ruleSilentGap, "%s: resume %s answered 204 though events follow the cursor", c.name, when)
		}
	case resp.StatusCode == http.StatusOK:
		_, err := c.consume(resp, cursor, 0, "finished "+when)
		if errors.Is(err, context.DeadlineExceeded) {
			s.rep.violate(ruleHang, "%s: resume of the finished stream %s did not end within %v", c.name, when, finishedWait)
		}
	default:
		resp.Body.Close()
		s.rep.violate(ruleHang, "%s: resume of the finished stream %s: %s", c.name, when, resp.Status)
	}
}

// consume reads one connection of c's stream, resumed at cursor ("" for
// the POST), cutting it after limit bytes (0: never), and checks every
// event. It reports whether it cut the connection, and the error that
// ended it (nil at a clean end).
func (c *callState) consume(resp *http.Response, cursor string, limit int, what string) (cut bool, err error) {
	rep := c.s.rep
	body := io.ReadCloser(resp.Body)
	if limit > 0 {
		body = &cutBody{rc: resp.Body, limit: limit}
	}
	defer body.Close()
	sc := sse.NewScanner(body)
	// Where this connection starts in what the client knows.
	lastPos := -1
	expect := 1
	if p, ok := c.pos[cursor]; ok {
		lastPos = p
		expect = c.progress[cursor] + 1
	}
	// afterGap: a gap reset came and no data event since. Only then may
	// the next event jump ahead of what the client has (the events between
	// were evicted); no other reset excuses a jump, and no jump goes back.
	afterGap := false
	sawResponse := false
	for {
		ev, err := sc.Next()
		if err != nil {
			if errors.Is(err, errCut) {
				return true, err
			}
			if errors.Is(err, io.EOF) {
				return false, nil
			}
			if errors.Is(err, context.DeadlineExceeded) {
				if sawResponse || c.done {
					rep.violate(ruleHang, "%s (%s): the stream did not end after its response", c.name, what)
				} else {
					rep.violate(ruleLost, "%s (%s): neither response nor error within the bound", c.name, what)
				}
			}
			return false, err
		}
		if ev.Type == resume.EventReset {
			var d resume.Reset
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				rep.violate(ruleSilentGap, "%s (%s): undecodable reset %q", c.name, what, ev.Data)
			}
			c.resets = append(c.resets, string(d.Reason))
			rep.count("reset " + string(d.Reason))
			afterGap = d.Reason == resume.ReasonGap
			continue
		}
		if len(ev.Data) == 0 {
			if ev.ID != "" && c.priming == "" && cursor == "" {
				c.priming = ev.ID
			}
			continue
		}
		gapBefore := afterGap
		afterGap = false
		if ev.ID == "" {
			rep.violate(ruleIDRepeat, "%s (%s): a message without an event ID: %s", c.name, what, ev.Data)
			continue
		}
		if p, seen := c.pos[ev.ID]; seen {
			// A redelivery: only as a replay of an event after the cursor,
			// with the same data.
			rep.count("replayed events")
			if c.data[ev.ID] != string(ev.Data) {
				rep.violate(ruleIDRepeat, "%s (%s): event ID %s redelivered with different data:\n\t%s\n\t%s", c.name, what, ev.ID, c.data[ev.ID], ev.Data)
			}
			if p <= lastPos {
				rep.violate(ruleIDRepeat, "%s (%s): event %d (ID %s) delivered again, not after the cursor (position %d)", c.name, what, p, ev.ID, lastPos)
			} else if p != lastPos+1 && !gapBefore {
				rep.violate(ruleSilentGap, "%s (%s): replay skipped events %d..%d without a reset", c.name, what, lastPos+1, p-1)
			}
			lastPos = p
		} else {
			if lastPos != len(c.order)-1 && !gapBefore {
				rep.violate(ruleSilentGap, "%s (%s): new event after position %d, but the client knows events up to %d: skipped without a reset", c.name, what, lastPos, len(c.order)-1)
			}
			rep.mu.Lock()
			prev, dup := rep.ids[ev.ID]
			if !dup {
				rep.ids[ev.ID] = idRecord{call: c.name, data: string(ev.Data)}
			}
			rep.mu.Unlock()
			if dup {
				rep.violate(ruleIDRepeat, "%s (%s): event ID %s was already delivered as new, on %s (%s), now with %s", c.name, what, ev.ID, prev.call, prev.data, ev.Data)
			}
			c.pos[ev.ID] = len(c.order)
			c.order = append(c.order, ev.ID)
			c.data[ev.ID] = string(ev.Data)
			lastPos = len(c.order) - 1
		}
		m, err := mcptest.DecodeMessage(ev.Data)
		if err != nil {
			rep.violate(ruleLost, "%s (%s): undecodable message %q", c.name, what, ev.Data)
			continue
		}
		switch {
		case m.Method == "notifications/progress":
			tok, _ := m.Params.ProgressToken.(string)
			if tok != c.token {
				rule := ruleSilentGap // another call of this session: a misrouted event
				if !strings.HasPrefix(tok, c.s.name+"-") {
					rule = ruleCrossSession
				}
				rep.violate(rule, "%s (%s): progress for token %q on this session's stream (own token %q)", c.name, what, tok, c.token)
				continue
			}
			n := int(m.Params.Progress)
			c.progress[ev.ID] = n
			if c.s.running != nil {
				c.s.runningOnce.Do(func() { close(c.s.running) })
			}
			if n != expect && !(gapBefore && n > expect) {
				rep.violate(ruleSilentGap, "%s (%s): progress %d after %d without a gap reset right before it", c.name, what, n, expect-1)
			}
			expect = n + 1
		case len(m.ID) > 0 && (m.Result != nil || m.Error != nil):
			sawResponse = true
			if !m.HasID(c.id) {
				rep.violate(ruleCrossSession, "%s (%s): response for id %s on the stream of id %d: %s", c.name, what, m.ID, c.id, ev.Data)
				continue
			}
			if m.Error != nil {
				if m.Error.Code != resume.CodeRequestLost {
					rep.violate(ruleLost, "%s (%s): error response %s, want a result or code %d", c.name, what, ev.Data, resume.CodeRequestLost)
				}
				if !c.done {
					rep.count("calls lost with an error")
				}
				c.lost = true
			} else {
				want := fmt.Sprintf("streamed %d events", c.count)
				if len(m.Result.Content) != 1 || m.Result.Content[0].Text != want {
					rule := ruleLost
					if len(m.Result.Content) == 1 && strings.HasPrefix(m.Result.Content[0].Text, "streamed ") {
						rule = ruleCrossSession // another session's count
					}
					rep.violate(rule, "%s (%s): result %s, want %q", c.name, what, ev.Data, want)
				}
				if !c.done {
					rep.count("calls with a result")
				}
				if expect != c.count+1 && !gapBefore {
					rep.violate(ruleSilentGap, "%s (%s): result after progress %d of %d without a gap reset right before it", c.name, what, expect-1, c.count)
				}
			}
			c.done = true
			c.terminalID = ev.ID
		default:
			rep.violate(ruleLost, "%s (%s): unexpected message %s", c.name, what, ev.Data)
		}
	}
}

func TestNoCrossSessionDelivery(t *testing.T) {
	for _, v := range stressVariants {
		t.Run(v.name, func(t *testing.T) {
			r := stress(t, v)
			r.check(t, ruleCrossSession)
			if r.stat("cuts") == 0 || r.stat("resumes") == 0 {
				t.Error("the run cut and resumed no stream")
			}
		})
	}
}

func TestNoSilentGap(t *testing.T) {
	for _, v := range stressVariants {
		t.Run(v.name, func(t *testing.T) {
			r := stress(t, v)
			r.check(t, ruleSilentGap)
			if r.stat("resumes from an older cursor") == 0 {
				t.Error("no resume from an older cursor: replay untested")
			}
			if v.retention.MaxEvents > 0 && r.stat("reset gap") == 0 {
				t.Error("tiny retention made no gap reset: eviction untested")
			}
		})
	}
}

func TestFinishedStreamsNeverHang(t *testing.T) {
	for _, v := range stressVariants {
		t.Run(v.name, func(t *testing.T) {
			r := stress(t, v)
			r.check(t, ruleHang)
			if r.stat("finished resumes answered 204") == 0 {
				t.Error("no resume of a finished stream answered 204")
			}
		})
	}
}

func TestEventIDsNeverRepeat(t *testing.T) {
	for _, v := range stressVariants {
		t.Run(v.name, func(t *testing.T) {
			r := stress(t, v)
			r.check(t, ruleIDRepeat)
			if r.stat("backend restarts") != 1 {
				t.Error("the backend was not restarted mid-run")
			}
		})
	}
}

func TestNoRequestLostSilently(t *testing.T) {
	for _, v := range stressVariants {
		t.Run(v.name, func(t *testing.T) {
			r := stress(t, v)
			r.check(t, ruleLost)
			calls := r.stat("calls with a result") + r.stat("calls lost with an error")
			if want := v.sessions*v.calls + 1; calls != want { // + the victim
				t.Errorf("%d calls ended, want %d", calls, want)
			}
			if r.stat("victim lost") != 1 {
				t.Error("the call in flight at the backend restart (the victim) did not end with the lost-request error")
			}
		})
	}
}
