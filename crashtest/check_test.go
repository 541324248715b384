package crashtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
)

// violations collects what must never happen, from any goroutine, and
// reports the first few (a broken relay would otherwise flood the output).
type violations struct {
	mu   sync.Mutex
	msgs []string
}

func (v *violations) addf(format string, args ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.msgs = append(v.msgs, fmt.Sprintf(format, args...))
}

func (v *violations) report(t *testing.T) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, m := range v.msgs {
		if i == 25 {
			t.Errorf("… and %d more violations", len(v.msgs)-i)
			break
		}
		t.Error(m)
	}
}

// idBook remembers every event ID delivered to any client, across every
// restart: an ID seen twice was either redelivered as new (same event) or
// reused for another event (never-event 4 of docs/design.md); both are violations, since
// every client resumes after the last ID it received.
type idBook struct {
	mu   sync.Mutex
	seen map[string]string // event ID → "call: data"
}

// note records id and returns what it was first delivered as, if it was.
func (b *idBook) note(id, what string) (prev string, dup bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen == nil {
		b.seen = make(map[string]string)
	}
	if prev, dup = b.seen[id]; !dup {
		b.seen[id] = what
	}
	return prev, dup
}

// logged is one event with an ID as a client received it, comparable with
// the event log.
type logged struct {
	Seq  uint64
	Type string
	Data string
}

// call is one tools/call of stream_progress and everything its client saw,
// over the POST stream and every resume of it.
type call struct {
	name  string // "s3-c7": session 3, call 7; the JSON-RPC id and the progress token
	count int

	key      string // stream key, from the priming event
	gen      uint64
	cursor   string // last event ID received
	lastSeq  uint64
	progress int      // last progress value received
	got      []logged // events with an ID and data, in order
	data     map[string]bool

	lostReset         bool   // a backend_lost reset naming this call was received
	gapped            bool   // a gap reset was the last thing received
	gaps              int    // gap resets received
	gapsAcrossRestart int    // resumes answered with a gap by another process than the cursor's
	pauses            int    // times the client stopped reading and came back (see client.pause)
	via               string // the replica that served the last connection (replica tests)
	genReset          bool   // a generation_changed reset was received (the stream must end)
	outcome           string // "result", "lost" (error -32001), or why neither: "unsent", "rejected", "uncursored", "failed"
	resumes           int
	statuses          []int // of the resumes
}

func (c *call) done() bool { return c.outcome == "result" || c.outcome == "lost" }

type resetMsg = resume.Reset

// checker applies the per-event checks of one client (one session).
type checker struct {
	codec *resume.Codec
	ids   *idBook
	v     *violations
	sid   string
	data  map[string]string // data of every ID'd event of the session → its ID, to catch the same event under two IDs
	gapOK bool              // gap resets are expected (the store lost events); progress may jump after one
}

// handle checks one event received for c and records it.
func (k *checker) handle(c *call, ev sse.Event) {
	if c.data == nil {
		c.data = make(map[string]bool)
	}
	if ev.Data == nil && ev.Retry > 0 {
		// A close asking the client to come back (polling, shutdown): no
		// event is dispatched; its id is where to resume, the last one.
		if ev.ID != "" && ev.ID != c.cursor && c.cursor != "" {
			k.v.addf("%s: retry names %q, not the last event %q", c.name, ev.ID, c.cursor)
		}
		return
	}
	if ev.ID != "" {
		cur, err := k.codec.Parse(ev.ID)
		if err != nil {
			k.v.addf("%s: event ID %q does not parse under the persisted secret: %v", c.name, ev.ID, err)
			return
		}
		if c.key == "" {
			if cur.Seq != 0 || ev.Data == nil || len(ev.Data) != 0 {
				k.v.addf("%s: first event is not a priming event: seq %d data %q", c.name, cur.Seq, ev.Data)
			}
			c.key, c.gen = cur.Stream.String(), cur.Generation
		} else {
			if cur.Stream.String() != c.key || cur.Generation != c.gen {
				k.v.addf("%s: event of stream %s gen %d on the stream of a call on %s gen %d: %q",
					c.name, cur.Stream, cur.Generation, c.key, c.gen, ev.Data)
			}
			if cur.Seq <= c.lastSeq {
				k.v.addf("%s: seq %d after %d: redelivered or out of order: %q", c.name, cur.Seq, c.lastSeq, ev.Data)
			}
			if cur.Seq > c.lastSeq+1 && !c.gapped {
				k.v.addf("%s: seq %d after %d without a gap reset right before it: %q", c.name, cur.Seq, c.lastSeq, ev.Data)
			}
		}
		if prev, dup := k.ids.note(ev.ID, c.name+": "+string(ev.Data)); dup {
			k.v.addf("%s: event ID %s delivered twice: first as %q, now as %q", c.name, ev.ID, prev, c.name+": "+string(ev.Data))
		}
		c.lastSeq, c.cursor = cur.Seq, ev.ID
		if len(ev.Data) > 0 {
			if c.done() {
				k.v.addf("%s: event after the final response: %q", c.name, ev.Data)
			}
			if other, ok := k.data[string(ev.Data)]; ok && other != ev.ID {
				k.v.addf("%s: the same event delivered under two IDs (%s, then %s): %q", c.name, other, ev.ID, ev.Data)
			}
			k.data[string(ev.Data)] = ev.ID
			c.got = append(c.got, logged{Seq: cur.Seq, Type: ev.Type, Data: string(ev.Data)})
		}
	}
	if len(ev.Data) == 0 {
		return // the priming event, or a bare retry
	}
	// A gap reset excuses a jump in the next event only.
	gapped := c.gapped
	if ev.ID != "" {
		c.gapped = false
	}
	if c.genReset {
		k.v.addf("%s: event after the generation_changed reset: %q", c.name, ev.Data)
	}
	switch ev.Type {
	case "reset":
		k.reset(c, ev)
		return
	case "":
	default:
		k.v.addf("%s: unexpected event type %q: %q", c.name, ev.Type, ev.Data)
		return
	}
	m, err := mcptest.DecodeMessage(ev.Data)
	if err != nil {
		k.v.addf("%s: undecodable message %q: %v", c.name, ev.Data, err)
		return
	}
	switch {
	case m.Method == "notifications/progress":
		if tok, _ := m.Params.ProgressToken.(string); tok != c.name {
			k.v.addf("%s (session %s): progress of %v delivered here: %q", c.name, k.sid, m.Params.ProgressToken, ev.Data)
			return
		}
		if c.lostReset || c.done() {
			k.v.addf("%s: progress after the call ended: %q", c.name, ev.Data)
		}
		if gapped && int(m.Params.Progress) > c.progress {
			c.progress = int(m.Params.Progress) - 1 // announced by the gap reset
		}
		if int(m.Params.Progress) != c.progress+1 || int(m.Params.Total) != c.count {
			k.v.addf("%s: progress %v/%v after %d/%d: a silent gap or a repeat", c.name, m.Params.Progress, m.Params.Total, c.progress, c.count)
		}
		c.progress = int(m.Params.Progress)
	case m.Method == "" && len(m.ID) > 0:
		if !m.HasID(c.name) {
			k.v.addf("%s (session %s): response of request %s delivered here: %q", c.name, k.sid, m.ID, ev.Data)
			return
		}
		switch {
		case m.Result != nil:
			want := fmt.Sprintf("streamed %d events", c.count)
			if len(m.Result.Content) != 1 || m.Result.Content[0].Text != want || m.Result.IsError {
				k.v.addf("%s: result %q, want %q", c.name, ev.Data, want)
			}
			if c.progress != c.count && !gapped {
				k.v.addf("%s: result after %d of %d progress notifications without a gap reset right before it", c.name, c.progress, c.count)
			}
			if c.lostReset {
				k.v.addf("%s: result after the request was reported lost", c.name)
			}
			c.outcome = "result"
		case m.Error != nil:
			if m.Error.Code != resume.CodeRequestLost || !c.lostReset {
				k.v.addf("%s: error %q (backend_lost reset before it: %v)", c.name, ev.Data, c.lostReset)
			}
			c.outcome = "lost"
		default:
			k.v.addf("%s: response with neither result nor error: %q", c.name, ev.Data)
		}
	default:
		k.v.addf("%s: unexpected message: %q", c.name, ev.Data)
	}
}

func (k *checker) reset(c *call, ev sse.Event) {
	var r resetMsg
	if err := json.Unmarshal(ev.Data, &r); err != nil {
		k.v.addf("%s: undecodable reset %q: %v", c.name, ev.Data, err)
		return
	}
	if r.Stream != c.key || r.Generation != c.gen {
		k.v.addf("%s: reset for stream %s gen %d on the call's stream %s gen %d", c.name, r.Stream, r.Generation, c.key, c.gen)
	}
	switch r.Reason {
	case resume.ReasonBackendLost:
		// The seal the restored relay wrote to the log: it has an ID.
		if ev.ID == "" || c.lostReset || c.done() {
			k.v.addf("%s: unexpected backend_lost reset (id %q, already lost %v, outcome %q)", c.name, ev.ID, c.lostReset, c.outcome)
		}
		want, _ := json.Marshal(c.name)
		if !slices.ContainsFunc(r.Lost, func(id json.RawMessage) bool { return bytes.Equal(id, want) }) {
			k.v.addf("%s: backend_lost reset does not list the call: %q", c.name, ev.Data)
		}
		c.lostReset = true
	case resume.ReasonGenerationChanged:
		// Row 6's closing reset, sent by the relay (not from the log).
		if ev.ID != "" {
			k.v.addf("%s: generation_changed reset with an ID", c.name)
		}
		c.genReset = true
	case resume.ReasonGap:
		if !k.gapOK {
			k.v.addf("%s: unexpected gap reset %q", c.name, ev.Data)
		}
		c.gapped = true
		c.gaps++
	default:
		// Retention is far above what this test writes: no gap, and every
		// stream is known.
		k.v.addf("%s: unexpected reset %q", c.name, ev.Data)
	}
}

// audit compares what each call's client received with what the event log
// on disk holds for its stream: with --sync always, everything logged was
// durable before any client could see it, so the two must be equal. With
// evicts (a retention smaller than a call), the log keeps only a tail: what
// the client received from the log's first event on must equal it.
func audit(ctx context.Context, st eventlog.Store, sid string, calls []*call, v *violations, evicts bool) {
	for _, c := range calls {
		if c.key == "" {
			continue
		}
		rec, evs, err := readLog(ctx, st, c.key)
		if err != nil {
			v.addf("%s: stream %s not in the log: %v", c.name, c.key, err)
			continue
		}
		if rec.Session != sid || rec.Generation != c.gen {
			v.addf("%s: stream %s logged for session %s gen %d, delivered on session %s gen %d", c.name, c.key, rec.Session, rec.Generation, sid, c.gen)
		}
		got := c.got
		if evicts {
			i := 0
			for i < len(got) && got[i].Seq < rec.FirstSeq {
				i++
			}
			got = got[i:]
		} else if rec.FirstSeq != 1 {
			v.addf("%s: the log evicted events of stream %s (first seq %d)", c.name, c.key, rec.FirstSeq)
		}
		if !c.done() {
			continue // the client gave up before the end (reported elsewhere)
		}
		if !rec.Terminal {
			v.addf("%s: ended with %s but its stream is not terminal in the log", c.name, c.outcome)
		}
		want := make([]logged, len(evs))
		for i, e := range evs {
			want[i] = logged{Seq: e.Seq, Type: e.Type, Data: string(e.Data)}
		}
		if !slices.Equal(got, want) {
			v.addf("%s: delivered %d events (from the log's first), the log holds %d; first difference %s", c.name, len(got), len(want), firstDiff(got, want))
		}
	}
}

func firstDiff(got, want []logged) string {
	for i := range max(len(got), len(want)) {
		var g, w logged
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return fmt.Sprintf("at %d: got %+v, log %+v", i, g, w)
		}
	}
	return "none"
}

// countOutcomes summarises calls for the log.
func countOutcomes(calls []*call) map[string]int {
	n := map[string]int{}
	for _, c := range calls {
		n[c.outcome]++
		n["resume attempts"] += c.resumes
		for _, s := range c.statuses {
			n[fmt.Sprintf("resume %d", s)]++
		}
	}
	return n
}
