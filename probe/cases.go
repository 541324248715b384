package probe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// smallPlan is a short call: a few events, quickly.
var smallPlan = plan{count: 5, intervalMS: 20}

// connectedPlan is a call that runs long enough to resume it while its
// first connection is still open, well inside the request timeout.
func (pr *prober) connectedPlan() plan {
	total := min(3*time.Second, pr.opts.Timeout/3)
	return plan{count: 20, intervalMS: int(total.Milliseconds() / 20)}
}

// opened opens a session and makes one small tool call in it; the result is
// set when the case cannot go on.
func (pr *prober) opened(ctx context.Context) (*session, *toolCall, Result, bool) {
	s, res, ok := pr.openWithTool(ctx)
	if !ok {
		return s, nil, res, false
	}
	tc := pr.callTool(ctx, s, smallPlan, nil)
	if res, ok := pr.streamed(tc); !ok {
		return s, tc, res, false
	}
	return s, tc, Result{}, true
}

// openWithTool opens a session for a case that needs a tool; the result is
// set when the case cannot go on (no session, or no tool to call). The
// caller closes a non-nil session.
func (pr *prober) openWithTool(ctx context.Context) (*session, Result, bool) {
	s, err := pr.c.open(ctx)
	if err != nil {
		return nil, Result{Verdict: NotTested, Observed: err.Error(), Reason: "could not open a session"}, false
	}
	if pr.name == "" {
		res, _ := pr.streamed(nil)
		return s, res, false
	}
	return s, Result{}, true
}

// pickCursors returns up to three of cs: first, middle, last.
func pickCursors(cs []string) []string {
	switch len(cs) {
	case 0, 1, 2, 3:
		return cs
	}
	return []string{cs[0], cs[len(cs)/2], cs[len(cs)-1]}
}

func describeEvents(evs []event) string {
	var parts []string
	for i, e := range evs {
		if i == 2 {
			parts = append(parts, fmt.Sprintf("… %d more", len(evs)-2))
			break
		}
		d := string(e.Data)
		if len(d) > 100 {
			d = d[:100] + "…"
		}
		parts = append(parts, fmt.Sprintf("id %q %s", e.ID, d))
	}
	return strings.Join(parts, "; ")
}

func (pr *prober) crossSession(ctx context.Context) Result {
	a, ta, res, ok := pr.opened(ctx)
	if a != nil {
		defer a.close(ctx)
	}
	if !ok {
		return res
	}
	b, tb, res, ok := pr.opened(ctx)
	if b != nil {
		defer b.close(ctx)
	}
	if !ok {
		return res
	}
	_ = tb
	statuses := map[string]int{}
	var leaked []event
	for _, cur := range pickCursors(ta.cursors()) {
		x := b.resume(ctx, cur, untilSettle, nil)
		statuses[x.describe()]++
		leaked = append(leaked, foreignTo(x, b, ta)...)
	}
	obs := fmt.Sprintf("session A's cursors presented under session B: %s", sortedStatuses(statuses))
	if len(leaked) > 0 {
		return Result{Verdict: Unsafe, Observed: obs + fmt.Sprintf("; LEAK: %d events of A delivered to B: %s", len(leaked), describeEvents(leaked)),
			Reason: "a cursor is not bound to its session: one tenant's events reach another"}
	}
	return Result{Verdict: Safe, Observed: obs, Reason: "no event of session A reached session B"}
}

func (pr *prober) afterDelete(ctx context.Context) Result {
	s, tc, res, ok := pr.opened(ctx)
	if !ok {
		if s != nil {
			s.close(ctx)
		}
		return res
	}
	del := s.close(ctx)
	if del.err != nil || del.status == http.StatusMethodNotAllowed {
		return Result{Verdict: NotTested, Observed: "DELETE: " + del.describe(), Reason: "the server does not let clients end sessions"}
	}
	x := s.resume(ctx, tc.cursors()[0], untilSettle, nil)
	obs := fmt.Sprintf("DELETE %d, then resume: %s", del.status, x.describe())
	switch {
	case x.err != nil:
		return Result{Verdict: Info, Observed: obs, Reason: "the resume failed at the transport level"}
	case len(x.dataEvents()) > 0 && !x.hasReset():
		return Result{Verdict: Unsafe, Observed: obs, Reason: "a deleted session's events were replayed: physical presence in a buffer is not authorization to deliver"}
	case x.status == http.StatusNotFound:
		return Result{Verdict: Safe, Observed: obs, Reason: "404: the session is gone and the client must re-initialize"}
	case x.status >= 400 && x.status < 500:
		return Result{Verdict: Safe, Observed: obs, Reason: "rejected; 404 would tell the client to re-initialize"}
	default:
		return Result{Verdict: Warn, Observed: obs, Reason: "a GET on a deleted session was accepted (expected 404)"}
	}
}

func (pr *prober) garbageCursor(ctx context.Context) Result {
	s, _, res, ok := pr.opened(ctx)
	if s != nil {
		defer s.close(ctx)
	}
	if !ok {
		return res
	}
	x := s.resume(ctx, "mcprelay-probe:not-a-cursor", untilSettle, nil)
	return judgeForged(x, "a garbage cursor")
}

// judgeForged grades the answer to a cursor the server never issued.
func judgeForged(x *exchange, what string) Result {
	obs := x.describe()
	switch {
	case x.err != nil && !x.hung:
		return Result{Verdict: Info, Observed: obs, Reason: "the request failed at the transport level"}
	case x.status == http.StatusBadRequest:
		return Result{Verdict: Safe, Observed: obs, Reason: what + " is rejected as malformed"}
	case x.hasReset():
		return Result{Verdict: Safe, Observed: obs, Reason: "explicit reset"}
	case x.status == http.StatusNotFound:
		return Result{Verdict: Warn, Observed: obs, Reason: "404 claims the session is dead and makes the client re-initialize; 400 fits " + what}
	case x.status >= 400 && x.status < 500:
		return Result{Verdict: Safe, Observed: obs, Reason: what + " is rejected"}
	case x.status >= 500:
		return Result{Verdict: Warn, Observed: obs, Reason: "the server failed on " + what + " (expected 400)"}
	case x.status == http.StatusNoContent:
		return Result{Verdict: Info, Observed: obs, Reason: "204 says the stream is over; the server cannot tell " + what + " from a real one"}
	case len(x.dataEvents()) > 0:
		return Result{Verdict: Warn, Observed: obs, Reason: "events were replayed for " + what + " without a reset"}
	default:
		return Result{Verdict: Warn, Observed: obs, Reason: what + " was accepted without a reset: events before it would be skipped silently (expected 400)"}
	}
}

var trailingNumber = regexp.MustCompile(`^(.*?)(\d+)$`)

func (pr *prober) futureCursor(ctx context.Context) Result {
	s, tc, res, ok := pr.opened(ctx)
	if s != nil {
		defer s.close(ctx)
	}
	if !ok {
		return res
	}
	cs := tc.cursors()
	last := cs[len(cs)-1]
	var cursor, what string
	if m := trailingNumber.FindStringSubmatch(last); m != nil && len(m[2]) < 18 {
		n, _ := strconv.ParseInt(m[2], 10, 64)
		cursor, what = m[1]+strconv.FormatInt(n+1000, 10), "a cursor from the future"
	} else {
		b := []byte(last)
		b[len(b)-1] ^= 1
		cursor, what = string(b), "a tampered opaque cursor"
	}
	r := judgeForged(s.resume(ctx, cursor, untilSettle, nil), what)
	r.Observed = fmt.Sprintf("%s (%q after %q): %s", what, cursor, last, r.Observed)
	return r
}

func (pr *prober) postLastEventID(ctx context.Context) Result {
	s, tc, res, ok := pr.opened(ctx)
	if s != nil {
		defer s.close(ctx)
	}
	if !ok {
		return res
	}
	body, id := s.call("ping", nil)
	x := pr.c.do(ctx, request{method: http.MethodPost, sess: s, body: body,
		header: map[string]string{headerLastEventID: tc.cursors()[0]},
		stop:   func(e event) bool { return e.responseTo(id) }})
	obs := "POST ping with Last-Event-ID: " + x.describe()
	replayed := 0
	for _, e := range x.events {
		if bytesContains(e.Data, tc.token) || e.responseTo(tc.id) {
			replayed++
		}
	}
	switch {
	case replayed > 0:
		return Result{Verdict: Warn, Observed: obs, Reason: fmt.Sprintf("%d events of another stream were replayed on a POST response", replayed)}
	case x.status == http.StatusBadRequest:
		return Result{Verdict: Safe, Observed: obs, Reason: "Last-Event-ID has no meaning on POST and is rejected"}
	default:
		return Result{Verdict: Info, Observed: obs, Reason: "the header was ignored (mcprelay answers 400); nothing was replayed"}
	}
}

func (pr *prober) evicted(ctx context.Context) Result {
	s, res, ok := pr.openWithTool(ctx)
	if s != nil {
		defer s.close(ctx)
	}
	if !ok {
		return res
	}
	budget := pr.opts.MaxEvents
	flood := plan{count: budget}
	countable := pr.opts.Args == nil && pr.tool != nil && pr.tool.countable()
	first := smallPlan
	if countable {
		first = flood
	}
	t1 := pr.callTool(ctx, s, first, nil)
	if res, ok := pr.streamed(t1); !ok {
		return res
	}
	produced := len(t1.x.dataEvents())
	calls := 1
	deadline := time.Now().Add(3 * pr.opts.Timeout)
	for !countable && produced < budget && calls < budget && time.Now().Before(deadline) {
		t := pr.callTool(ctx, s, smallPlan, nil)
		n := len(t.x.dataEvents())
		if n == 0 {
			break
		}
		produced += n
		calls++
	}
	cursor := t1.cursors()[0]
	// What the first stream carried after the cursor.
	want := map[string]int{}
	after := false
	wantN := 0
	for _, e := range t1.x.events {
		if after && e.isMsg {
			want[string(e.Data)]++
			wantN++
		}
		if e.ID == cursor {
			after = true
		}
	}
	x := s.resume(ctx, cursor, untilEnd, func(e event) bool { return e.responseTo(t1.id) })
	got := 0
	for _, e := range x.dataEvents() {
		if want[string(e.Data)] > 0 {
			want[string(e.Data)]--
			got++
		}
	}
	missing := wantN - got
	obs := fmt.Sprintf("%d events in %d calls, then resume from the first cursor: %s, %d of %d later events of that stream replayed",
		produced, calls, x.describe(), got, wantN)
	switch {
	case x.err != nil && !x.hung:
		return Result{Verdict: Info, Observed: obs, Reason: "the resume failed at the transport level"}
	case x.hasReset():
		return Result{Verdict: Safe, Observed: obs, Reason: "the lost events are announced by a reset"}
	case x.status >= 400:
		return Result{Verdict: Safe, Observed: obs, Reason: "the cursor is rejected explicitly"}
	case missing > 0:
		return Result{Verdict: Unsafe, Observed: obs, Reason: fmt.Sprintf("silent gap: %d events after the cursor were skipped without a reset", missing)}
	case produced < budget/2 && countable:
		return Result{Verdict: NotTested, Observed: obs, Reason: fmt.Sprintf("asked for %d events, the stream carried only %d (the server dropped or capped them); nothing was evicted", budget, produced)}
	case produced < budget/2:
		return Result{Verdict: NotTested, Observed: obs, Reason: fmt.Sprintf("the tool produced only %d events (budget %d); nothing was evicted", produced, budget)}
	default:
		return Result{Verdict: NotTested, Observed: obs, Reason: fmt.Sprintf("retention was not outrun by %d events (raise --max-events)", produced)}
	}
}

func (pr *prober) finished(ctx context.Context) Result {
	s, tc, res, ok := pr.opened(ctx)
	if s != nil {
		defer s.close(ctx)
	}
	if !ok {
		return res
	}
	if !tc.gotResponse() {
		return Result{Verdict: NotTested, Observed: "tools/call: " + tc.x.describe(), Reason: "the call's stream did not carry its response"}
	}
	cs := tc.cursors()
	last, first := cs[len(cs)-1], cs[0]
	xl := s.resume(ctx, last, untilEnd, nil)
	xf := s.resume(ctx, first, untilEnd, nil)
	obs := fmt.Sprintf("from the last cursor: %s; from the first: %s", xl.describe(), xf.describe())
	hung := func(x *exchange) bool { return x.hung && (x.status == 0 || x.status == http.StatusOK) }
	if hung(xl) || hung(xf) {
		return Result{Verdict: Unsafe, Observed: obs, Reason: fmt.Sprintf("a resume of a finished stream did not end within %s: the client waits forever", pr.opts.Timeout)}
	}
	redelivered := false
	for _, e := range xl.events {
		if e.responseTo(tc.id) {
			redelivered = true
		}
	}
	firstOK := xf.hasReset() || (xf.status >= 400 && xf.status < 500)
	for _, e := range xf.events {
		if e.responseTo(tc.id) {
			firstOK = true
		}
	}
	switch {
	case !firstOK:
		return Result{Verdict: Warn, Observed: obs, Reason: "a resume before the end did not redeliver the call's response, nor say it could not"}
	case redelivered && !xl.hasReset():
		return Result{Verdict: Info, Observed: obs, Reason: "a resume after the final response redelivered it as new"}
	default:
		return Result{Verdict: Safe, Observed: obs, Reason: "both resumes answered and ended"}
	}
}

func (pr *prober) connected(ctx context.Context) Result {
	s, res, ok := pr.openWithTool(ctx)
	if s != nil {
		defer s.close(ctx)
	}
	if !ok {
		return res
	}
	firstID := make(chan string, 1)
	done := make(chan *toolCall, 1)
	go func() {
		done <- pr.callTool(ctx, s, pr.connectedPlan(), func(e event) {
			if e.ID != "" {
				select {
				case firstID <- e.ID:
				default:
				}
			}
		})
	}()
	var cursor string
	select {
	case cursor = <-firstID:
	case tc := <-done:
		res, ok := pr.streamed(tc)
		if ok {
			res = Result{Verdict: NotTested, Observed: "tools/call: " + tc.x.describe(), Reason: "the call finished before the probe saw an event ID"}
		}
		return res
	}
	var tcID int64 = s.nextID // the call's id (no other call is in flight)
	x := s.resume(ctx, cursor, untilEnd, func(e event) bool { return e.responseTo(tcID) })
	tc := <-done
	onGet := false
	for _, e := range x.events {
		if e.responseTo(tc.id) {
			onGet = true
		}
	}
	onPost := tc.gotResponse()
	obs := fmt.Sprintf("second connection: %s; first connection: %s", x.describe(), tc.x.describe())
	switch {
	case onGet && !onPost:
		return Result{Verdict: Safe, Observed: obs, Reason: "the second connection took the stream over and got the response"}
	case !onGet && !onPost:
		return Result{Verdict: Unsafe, Observed: obs, Reason: "the call's response reached neither connection"}
	case onGet && onPost:
		return Result{Verdict: Info, Observed: obs, Reason: "the response was delivered on both connections"}
	case x.status >= 400:
		return Result{Verdict: Warn, Observed: obs, Reason: "a second connection is refused while the first looks alive: a client behind a half-open connection is locked out"}
	default:
		return Result{Verdict: Info, Observed: obs, Reason: "no takeover: the response stayed on the first connection"}
	}
}

func (pr *prober) missingSession(ctx context.Context) Result {
	anon := &session{c: pr.c, version: pr.version, ids: map[int64]bool{}}
	body, _ := anon.call("tools/list", map[string]any{})
	xp := pr.c.do(ctx, request{method: http.MethodPost, sess: anon, body: body, mode: untilSettle})
	xg := pr.c.do(ctx, request{method: http.MethodGet, sess: anon, mode: untilSettle})
	obs := fmt.Sprintf("POST tools/list: %s; GET: %s", xp.describe(), xg.describe())
	switch {
	case xp.status == http.StatusBadRequest && (xg.status == http.StatusBadRequest || xg.status == http.StatusMethodNotAllowed):
		return Result{Verdict: Safe, Observed: obs, Reason: "requests without Mcp-Session-Id are rejected with 400"}
	case xp.status/100 == 2 || xg.status/100 == 2:
		return Result{Verdict: Warn, Observed: obs, Reason: "a request without Mcp-Session-Id was served (expected 400)"}
	default:
		return Result{Verdict: Info, Observed: obs, Reason: "rejected, but not with the 400 the specification asks for"}
	}
}

func randomHex() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (pr *prober) unknownSession(ctx context.Context) Result {
	a, ta, res, ok := pr.opened(ctx)
	if a != nil {
		defer a.close(ctx)
	}
	ghost := &session{c: pr.c, id: "mcprelay-probe-" + randomHex(), version: pr.version, ids: map[int64]bool{}}
	body, _ := ghost.call("tools/list", map[string]any{})
	xp := pr.c.do(ctx, request{method: http.MethodPost, sess: ghost, body: body, mode: untilSettle})
	obs := "POST under an unknown session: " + xp.describe()
	var leaked []event
	if ok {
		xg := ghost.resume(ctx, ta.cursors()[0], untilSettle, nil)
		obs += "; GET with another session's cursor: " + xg.describe()
		leaked = foreignTo(xg, ghost, ta)
		if len(leaked) > 0 {
			return Result{Verdict: Unsafe, Observed: obs + "; LEAK: " + describeEvents(leaked), Reason: "a cursor under an unknown session replays a live session's events"}
		}
		if xg.status != http.StatusNotFound {
			return Result{Verdict: Warn, Observed: obs, Reason: "expected 404 so that the client re-initializes"}
		}
	} else {
		obs += " (no cursor to present: " + res.Observed + ")"
	}
	if xp.status == http.StatusNotFound {
		return Result{Verdict: Safe, Observed: obs, Reason: "404: the client must re-initialize"}
	}
	return Result{Verdict: Warn, Observed: obs, Reason: "expected 404 so that the client re-initializes"}
}

func (pr *prober) foreignOrigin(ctx context.Context) Result {
	body := rpc{JSONRPC: "2.0", ID: new(int64), Method: "initialize", Params: map[string]any{
		"protocolVersion": pr.c.version, "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "mcprelay-probe", "version": "1"},
	}}
	const origin = "http://mcprelay-probe.invalid"
	x := pr.c.do(ctx, request{method: http.MethodPost, body: body, header: map[string]string{"Origin": origin},
		stop: func(e event) bool { return e.responseTo(0) }})
	if id := x.header.Get(headerSessionID); id != "" {
		(&session{c: pr.c, id: id, version: pr.version}).close(ctx)
	}
	obs := "initialize with Origin " + origin + ": " + x.describe()
	switch {
	case x.status == http.StatusForbidden:
		return Result{Verdict: Safe, Observed: obs, Reason: "a foreign Origin is refused (DNS-rebinding protection)"}
	case x.status >= 400 && x.status < 500:
		return Result{Verdict: Info, Observed: obs, Reason: "refused, but 2025-11-25 asks for 403"}
	default:
		return Result{Verdict: Warn, Observed: obs, Reason: "a foreign Origin is served: a web page could drive this server through DNS rebinding"}
	}
}

func (pr *prober) badVersion(ctx context.Context) Result {
	s, err := pr.c.open(ctx)
	if err != nil {
		return Result{Verdict: NotTested, Observed: err.Error(), Reason: "could not open a session"}
	}
	defer s.close(ctx)
	body, id := s.call("ping", nil)
	x := pr.c.do(ctx, request{method: http.MethodPost, sess: s, body: body,
		header: map[string]string{headerProtocolVersion: "1999-01-01"}, stop: func(e event) bool { return e.responseTo(id) }})
	obs := "POST ping with MCP-Protocol-Version 1999-01-01: " + x.describe()
	if x.status == http.StatusBadRequest {
		return Result{Verdict: Safe, Observed: obs, Reason: "an unsupported protocol version is rejected with 400"}
	}
	return Result{Verdict: Warn, Observed: obs, Reason: "expected 400 for an unsupported MCP-Protocol-Version"}
}

func (pr *prober) priming(ctx context.Context) Result {
	if pr.version < "2025-11-25" {
		return Result{Verdict: NotTested, Observed: "negotiated " + pr.version, Reason: "priming and retry apply to 2025-11-25 and later"}
	}
	s, tc, res, ok := pr.opened(ctx)
	if s != nil {
		defer s.close(ctx)
	}
	if !ok && (tc == nil || tc.x.ctype != "text/event-stream") {
		return res
	}
	evs := tc.x.events
	primed := len(evs) > 0 && evs[0].ID != "" && len(evs[0].Data) == 0
	var retry time.Duration
	for _, e := range evs {
		if e.Retry > 0 {
			retry = e.Retry
			break
		}
	}
	obs := "no priming event"
	if primed {
		obs = fmt.Sprintf("priming event id %q", evs[0].ID)
	}
	if retry > 0 {
		obs += fmt.Sprintf(", retry %s", retry)
	} else {
		obs += ", no retry"
	}
	if !primed {
		return Result{Verdict: Warn, Observed: obs, Reason: "a 2025-11-25 client cannot resume a stream cut before its first message"}
	}
	return Result{Verdict: Info, Observed: obs, Reason: "the stream is resumable from its start"}
}
