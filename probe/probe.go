package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Sentinel errors returned by [Run].
var (
	// ErrBadURL is returned for a URL that is not an absolute http(s) URL.
	ErrBadURL = errors.New("probe: URL must be an absolute http or https URL")
	// ErrInitialize is returned when the server does not complete the
	// initialize handshake, so no case can run.
	ErrInitialize = errors.New("probe: server did not complete initialize")
)

// Verdict is the outcome of one case.
type Verdict string

// Verdicts, from worst to best. Only Unsafe fails the probe.
const (
	Unsafe    Verdict = "UNSAFE"     // a leak, a silent gap or a hang
	Warn      Verdict = "WARN"       // departs from the specification or mcprelay's contract (docs/design.md), but loses or leaks nothing
	Info      Verdict = "INFO"       // worth knowing; not a fault
	NotTested Verdict = "NOT_TESTED" // the case could not be exercised against this server
	Safe      Verdict = "SAFE"       // the server answered as a careful server should
)

// Case names, in the order [Run] runs them.
const (
	CaseCrossSession    = "cross-session-cursor"
	CaseAfterDelete     = "cursor-after-delete"
	CaseGarbageCursor   = "garbage-cursor"
	CaseFutureCursor    = "future-cursor"
	CasePostLastEventID = "last-event-id-on-post"
	CaseEvicted         = "evicted-cursor"
	CaseFinished        = "resume-finished-stream"
	CaseConnected       = "resume-connected-stream"
	CaseMissingSession  = "missing-session-header"
	CaseUnknownSession  = "unknown-session"
	CaseForeignOrigin   = "foreign-origin"
	CaseBadVersion      = "unsupported-protocol-version"
	CasePriming         = "priming-and-retry"
)

// Result is the outcome of one case.
type Result struct {
	Case     string  `json:"case"`
	Verdict  Verdict `json:"verdict"`
	Observed string  `json:"observed"` // what the server did
	Reason   string  `json:"reason"`   // why that earns the verdict
}

// Report is the outcome of a probe run.
type Report struct {
	URL             string        `json:"url"`
	Server          string        `json:"server,omitempty"`          // serverInfo name and version
	ProtocolVersion string        `json:"protocolVersion,omitempty"` // as negotiated
	Tool            string        `json:"tool,omitempty"`            // the tool the probe called
	Results         []Result      `json:"results"`
	Elapsed         time.Duration `json:"elapsedNs"`
}

// Unsafe reports whether any case is [Unsafe].
func (r *Report) Unsafe() bool {
	for _, res := range r.Results {
		if res.Verdict == Unsafe {
			return true
		}
	}
	return false
}

// Verdicts returns each case's verdict by case name.
func (r *Report) Verdicts() map[string]Verdict {
	m := make(map[string]Verdict, len(r.Results))
	for _, res := range r.Results {
		m[res.Case] = res.Verdict
	}
	return m
}

// WriteText writes r as a table for people.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "mcprelay probe %s\n", r.URL)
	fmt.Fprintf(tw, "server %s, protocol %s, tool %s, %s\n\n", orNone(r.Server), orNone(r.ProtocolVersion), orNone(r.Tool), r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(tw, "CASE\tVERDICT\tWHAT THE SERVER DID / WHY\n")
	count := map[Verdict]int{}
	for _, res := range r.Results {
		count[res.Verdict]++
		fmt.Fprintf(tw, "%s\t%s\t%s\n", res.Case, res.Verdict, oneLine(res.Observed))
		fmt.Fprintf(tw, "\t\t  why: %s\n", oneLine(res.Reason))
	}
	fmt.Fprintf(tw, "\n%d unsafe, %d warn, %d info, %d not tested, %d safe\n",
		count[Unsafe], count[Warn], count[Info], count[NotTested], count[Safe])
	return tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// Options configures [Run]. The zero value works.
type Options struct {
	// Tool is the tool the probe calls to make events. Empty means discover
	// one with tools/list: a tool whose name suggests progress or streaming,
	// preferring one with a count-like argument.
	Tool string
	// Args are the tool's arguments, a JSON object. Nil means the probe
	// chooses them from the tool's input schema (count-like arguments get the
	// number of events it wants, interval-like ones a short delay).
	Args json.RawMessage
	// MaxEvents bounds the events the probe asks for to outrun the server's
	// retention (the evicted-cursor case). Zero means 2000.
	MaxEvents int
	// Timeout bounds every request, including reading its stream. A resume
	// that is still open when it expires is a hang. Zero means 10s.
	Timeout time.Duration
	// ProtocolVersion is offered in initialize. Empty means "2025-11-25".
	ProtocolVersion string
	// Header is added to every request (e.g. Authorization).
	Header http.Header
	// Client sends the requests. Nil means a client on
	// http.DefaultTransport. Redirects are never followed: the probe talks
	// only to the URL it is given.
	Client *http.Client
}

// Defaults.
const (
	DefaultMaxEvents       = 2000
	DefaultTimeout         = 10 * time.Second
	DefaultProtocolVersion = "2025-11-25"
)

// tool is an entry of tools/list.
type tool struct {
	Name        string `json:"name"`
	InputSchema struct {
		Properties map[string]struct {
			Type any `json:"type"`
		} `json:"properties"`
		Required []string `json:"required"`
	} `json:"inputSchema"`
}

var (
	countArg    = regexp.MustCompile(`(?i)^(count|steps|n|num|number|events|iterations|times|total)$`)
	intervalArg = regexp.MustCompile(`(?i)(interval|delay|sleep|pause)`)
	durationArg = regexp.MustCompile(`(?i)^duration`)
	streamyName = regexp.MustCompile(`(?i)(progress|stream|count|long.?running|steps)`)
	avoidName   = regexp.MustCompile(`(?i)(sampling|elicit|reconnection|roots|error)`)
)

// countable reports whether t takes a count-like argument.
func (t *tool) countable() bool {
	for name := range t.InputSchema.Properties {
		if countArg.MatchString(name) {
			return true
		}
	}
	return false
}

// pickTool chooses the tool to call from a tools/list result.
func pickTool(tools []tool) *tool {
	best, bestScore := -1, 0
	for i := range tools {
		t := &tools[i]
		if avoidName.MatchString(t.Name) {
			continue
		}
		score := 0
		if streamyName.MatchString(t.Name) {
			score += 2
		}
		if t.countable() {
			score += 3
		}
		if score > bestScore || (score == bestScore && score > 0 && t.Name < tools[best].Name) {
			best, bestScore = i, score
		}
	}
	if best < 0 {
		return nil
	}
	return &tools[best]
}

// plan is what the probe wants from one tool call.
type plan struct {
	count      int // events wanted
	intervalMS int // milliseconds between them
}

// args returns the arguments of a call for p: opts.Args when given, else
// values chosen from the tool's schema.
func (pr *prober) args(p plan) any {
	if pr.opts.Args != nil {
		return pr.opts.Args
	}
	out := map[string]any{}
	if pr.tool == nil {
		return out
	}
	for name, prop := range pr.tool.InputSchema.Properties {
		typ, _ := prop.Type.(string)
		switch {
		case countArg.MatchString(name):
			out[name] = p.count
		case intervalArg.MatchString(name):
			out[name] = p.intervalMS
		case durationArg.MatchString(name):
			secs := float64(p.count*p.intervalMS) / 1000
			if typ == "integer" {
				secs = math.Ceil(secs)
			}
			out[name] = secs
		}
	}
	for _, name := range pr.tool.InputSchema.Required {
		if _, ok := out[name]; ok {
			continue
		}
		typ, _ := pr.tool.InputSchema.Properties[name].Type.(string)
		switch typ {
		case "integer", "number":
			out[name] = 1
		case "boolean":
			out[name] = false
		default:
			out[name] = "mcprelay probe"
		}
	}
	return out
}

// prober holds the state of one run.
type prober struct {
	c       *client
	opts    Options
	tool    *tool
	name    string // tool name called ("" if none)
	version string // negotiated protocol version
}

// Run probes the legacy-era Streamable HTTP MCP server at rawURL and
// reports each case. It returns an error only when no case can run (bad URL,
// failed initialize); the context bounds the whole run.
func Run(ctx context.Context, rawURL string, opts Options) (*Report, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: %q", ErrBadURL, rawURL)
	}
	if opts.MaxEvents <= 0 {
		opts.MaxEvents = DefaultMaxEvents
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.ProtocolVersion == "" {
		opts.ProtocolVersion = DefaultProtocolVersion
	}
	hc := http.DefaultClient
	if opts.Client != nil {
		hc = opts.Client
	}
	noRedirect := *hc
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c := &client{
		url: rawURL, hc: &noRedirect, header: opts.Header, version: opts.ProtocolVersion,
		timeout: opts.Timeout, settle: min(opts.Timeout/2, time.Second),
	}
	start := time.Now()
	pr := &prober{c: c, opts: opts}
	rep := &Report{URL: rawURL}

	s, err := c.open(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInitialize, err)
	}
	rep.ProtocolVersion = s.version
	pr.version = s.version
	rep.Server = pr.serverInfo(ctx)
	if err := pr.chooseTool(ctx, s); err == nil {
		rep.Tool = pr.name
	}
	s.close(ctx)

	for _, cs := range []struct {
		name string
		run  func(context.Context) Result
	}{
		{CaseCrossSession, pr.crossSession},
		{CaseAfterDelete, pr.afterDelete},
		{CaseGarbageCursor, pr.garbageCursor},
		{CaseFutureCursor, pr.futureCursor},
		{CasePostLastEventID, pr.postLastEventID},
		{CaseEvicted, pr.evicted},
		{CaseFinished, pr.finished},
		{CaseConnected, pr.connected},
		{CaseMissingSession, pr.missingSession},
		{CaseUnknownSession, pr.unknownSession},
		{CaseForeignOrigin, pr.foreignOrigin},
		{CaseBadVersion, pr.badVersion},
		{CasePriming, pr.priming},
	} {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		res := cs.run(ctx)
		res.Case = cs.name
		rep.Results = append(rep.Results, res)
	}
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// serverInfo returns "name version" from a fresh initialize, best effort.
func (pr *prober) serverInfo(ctx context.Context) string {
	body := rpc{JSONRPC: "2.0", ID: new(int64), Method: "initialize", Params: map[string]any{
		"protocolVersion": pr.c.version, "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "mcprelay-probe", "version": "1"},
	}}
	x := pr.c.do(ctx, request{method: http.MethodPost, body: body, stop: func(e event) bool { return e.responseTo(0) }})
	data := x.body
	for _, e := range x.events {
		if e.responseTo(0) {
			data = e.Data
		}
	}
	var res struct {
		Result struct {
			ServerInfo struct{ Name, Version string } `json:"serverInfo"`
		} `json:"result"`
	}
	json.Unmarshal(data, &res)
	if id := x.header.Get(headerSessionID); id != "" {
		(&session{c: pr.c, id: id}).close(ctx)
	}
	return strings.TrimSpace(res.Result.ServerInfo.Name + " " + res.Result.ServerInfo.Version)
}

var errNoTool = errors.New("probe: no tool to call")

// chooseTool sets pr.tool and pr.name from opts.Tool or tools/list.
func (pr *prober) chooseTool(ctx context.Context, s *session) error {
	body, id := s.call("tools/list", map[string]any{})
	x := pr.c.do(ctx, request{method: http.MethodPost, sess: s, body: body, stop: func(e event) bool { return e.responseTo(id) }})
	data := x.body
	for _, e := range x.events {
		if e.responseTo(id) {
			data = e.Data
		}
	}
	var res struct {
		Result struct {
			Tools []tool `json:"tools"`
		} `json:"result"`
	}
	json.Unmarshal(data, &res)
	if pr.opts.Tool != "" {
		pr.name = pr.opts.Tool
		for i := range res.Result.Tools {
			if res.Result.Tools[i].Name == pr.opts.Tool {
				pr.tool = &res.Result.Tools[i]
			}
		}
		return nil
	}
	t := pickTool(res.Result.Tools)
	if t == nil {
		return errNoTool
	}
	pr.tool, pr.name = t, t.Name
	return nil
}

// toolCall is one tools/call the probe made.
type toolCall struct {
	x     *exchange
	id    int64
	token string
}

// cursors returns the event IDs the call's stream carried, in order, without
// repeats.
func (tc *toolCall) cursors() []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range tc.x.events {
		if e.ID != "" && !seen[e.ID] {
			seen[e.ID] = true
			out = append(out, e.ID)
		}
	}
	return out
}

// gotResponse reports whether the call's own stream carried its response.
func (tc *toolCall) gotResponse() bool {
	for _, e := range tc.x.events {
		if e.responseTo(tc.id) {
			return true
		}
	}
	return false
}

// callTool calls the chosen tool in s with a progressToken unique to the
// call and reads its response stream to the end.
func (pr *prober) callTool(ctx context.Context, s *session, p plan, onEvent func(event)) *toolCall {
	token := fmt.Sprintf("%s-%d", s.token, s.nextID+1) // s.call assigns id nextID+1
	body, id := s.call("tools/call", map[string]any{
		"name":      pr.name,
		"arguments": pr.args(p),
		"_meta":     map[string]any{"progressToken": token},
	})
	x := pr.c.do(ctx, request{method: http.MethodPost, sess: s, body: body,
		stop: func(e event) bool {
			if onEvent != nil {
				onEvent(e)
			}
			return e.responseTo(id)
		}})
	return &toolCall{x: x, id: id, token: token}
}

// streamed checks that tc produced an SSE stream with event IDs; if not, it
// returns the NOT_TESTED result that explains why.
func (pr *prober) streamed(tc *toolCall) (Result, bool) {
	switch {
	case pr.name == "":
		return Result{Verdict: NotTested, Observed: "no tool to call", Reason: "tools/list offered no tool the probe can drive; pass --tool and --args"}, false
	case tc.x.err != nil || tc.x.status != http.StatusOK:
		return Result{Verdict: NotTested, Observed: "tools/call " + pr.name + ": " + tc.x.describe(), Reason: "the tool call failed, so there are no cursors to present"}, false
	case tc.x.ctype != "text/event-stream":
		return Result{Verdict: NotTested, Observed: "tools/call answered with " + tc.x.ctype, Reason: "the server did not stream the call, so there are no cursors to present"}, false
	case len(tc.cursors()) == 0:
		return Result{Verdict: NotTested, Observed: "the call's SSE events carry no id", Reason: "without event IDs the server offers no resumption to attack"}, false
	}
	return Result{}, true
}

// foreignTo returns the events of x that belong to the calls in other and
// not to the session s: their IDs, progress tokens or response ids.
func foreignTo(x *exchange, s *session, other ...*toolCall) []event {
	ids := map[string]bool{}
	for _, tc := range other {
		for _, c := range tc.cursors() {
			ids[c] = true
		}
	}
	var out []event
	for _, e := range x.events {
		leak := false
		for _, tc := range other {
			if bytesContains(e.Data, tc.token) {
				leak = true
			}
			if e.responseTo(tc.id) && !s.ids[tc.id] {
				leak = true
			}
		}
		if e.ID != "" && ids[e.ID] && e.isMsg && !ownEvent(e, s) {
			leak = true
		}
		if leak {
			out = append(out, e)
		}
	}
	return out
}

// ownEvent reports whether e visibly belongs to s (its token or request id).
func ownEvent(e event, s *session) bool {
	if bytesContains(e.Data, s.token) {
		return true
	}
	var id int64
	return json.Unmarshal(e.msg.ID, &id) == nil && s.ids[id]
}

func bytesContains(b []byte, s string) bool { return s != "" && strings.Contains(string(b), s) }

// sortedStatuses renders a status histogram: "409 ×3".
func sortedStatuses(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		if m[k] > 1 {
			parts = append(parts, fmt.Sprintf("%s (×%d)", k, m[k]))
		} else {
			parts = append(parts, k)
		}
	}
	return strings.Join(parts, "; ")
}
