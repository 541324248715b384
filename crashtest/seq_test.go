package crashtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
)

// received is one event with an ID as a client received it.
type received struct {
	id   string
	cur  resume.Cursor
	typ  string
	data string
}

// seqClient is one session streaming one long call per round.
type seqClient struct {
	sid    string
	call   string
	got    []received // every ID'd event of the current call, in order
	cursor string
}

// TestCrashSeqsNeverReused kills `mcprelay serve` with SIGKILL while eight
// sessions stream fast tool calls, under each --sync policy, restarts it and
// has every client resume with the last event ID it really received. Under
// every policy: the resume is answered 200 (never 400, whatever the crash
// lost), it carries the backend_lost reset and the -32001 error of the lost
// call under event IDs the client never received before, and, audited
// against the event log on disk afterwards, no event ID any client received
// names a different event in the log. Under --sync always nothing a client
// received may be missing from the log.
func TestCrashSeqsNeverReused(t *testing.T) {
	needBinary(t)
	for _, policy := range []string{"always", "interval", "none"} {
		t.Run(policy, func(t *testing.T) { crashSeqs(t, policy) })
	}
}

func crashSeqs(t *testing.T, policy string) {
	const (
		sessions = 8
		rounds   = 2
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	p := newRelaySync(t, policy)
	codec := p.codec()
	v := &violations{}
	ids := &idBook{}
	clients := make([]*seqClient, sessions)
	for i := range clients {
		sid, err := initialize(ctx, p.url())
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = &seqClient{sid: sid}
	}
	var all []received // every ID'd event any client received, for the audit
	lostInCrash := 0
	for round := range rounds {
		// Start one fast call per session and read it until the kill.
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i, cl := range clients {
			cl.call, cl.got, cl.cursor = fmt.Sprintf("r%d-s%d", round, i), nil, ""
			resp, err := do(ctx, p.url(), http.MethodPost, sessionHeaders(cl.sid, ""), callBody(cl.call, cl.call, 5000, 1))
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: POST: %v %v", cl.call, resp, err)
			}
			wg.Go(func() {
				defer resp.Body.Close()
				scan(resp, func(ev sse.Event) bool {
					if ev.ID == "" {
						return true
					}
					c, err := codec.Parse(ev.ID)
					if err != nil {
						v.addf("%s: event ID %q: %v", cl.call, ev.ID, err)
						return false
					}
					mu.Lock()
					cl.got = append(cl.got, received{id: ev.ID, cur: c, typ: ev.Type, data: string(ev.Data)})
					cl.cursor = ev.ID
					mu.Unlock()
					return true
				})
			})
		}
		// Kill while every stream is busy.
		deadline := time.Now().Add(20 * time.Second)
		for {
			mu.Lock()
			busy := 0
			for _, cl := range clients {
				if len(cl.got) > 100 {
					busy++
				}
			}
			mu.Unlock()
			if busy == len(clients) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: only %d of %d streams got 100 events in 20s", round, busy, len(clients))
			}
			time.Sleep(5 * time.Millisecond)
		}
		p.kill()
		wg.Wait()
		p.start()

		for _, cl := range clients {
			for _, r := range cl.got {
				if prev, dup := ids.note(r.id, cl.call+": "+r.data); dup {
					v.addf("%s: event ID %s delivered twice before the crash: %q, %q", cl.call, r.id, prev, r.data)
				}
			}
			all = append(all, cl.got...)
			last, _ := codec.Parse(cl.cursor)
			resp, err := do(ctx, p.url(), http.MethodGet, sessionHeaders(cl.sid, cl.cursor), "")
			if err != nil {
				t.Fatalf("%s: resume: %v", cl.call, err)
			}
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				// A 400 here is the relay refusing a genuine cursor that the
				// crash put ahead of the log (future_cursor): it must answer
				// with a reset and the lost call's error instead.
				v.addf("%s: resume after seq %d answered %s: %q", cl.call, last.Seq, resp.Status, b)
				continue
			}
			evs, err := collect(resp, nil)
			resp.Body.Close()
			if err != nil {
				v.addf("%s: resume did not end: %v", cl.call, err)
			}
			var lostReset, lostError, genReset bool
			for _, ev := range evs {
				if ev.ID != "" {
					c, err := codec.Parse(ev.ID)
					if err != nil || c.Stream != last.Stream || c.Seq <= last.Seq {
						v.addf("%s: resume after seq %d sent %+v (%v): %q", cl.call, last.Seq, c, err, ev.Data)
						continue
					}
					if prev, dup := ids.note(ev.ID, cl.call+": "+string(ev.Data)); dup {
						v.addf("%s: event ID %s (seq %d) reused: first %q, now %q", cl.call, ev.ID, c.Seq, prev, ev.Data)
					}
					all = append(all, received{id: ev.ID, cur: c, typ: ev.Type, data: string(ev.Data)})
				}
				var r resetMsg
				var m mcptest.Message
				switch {
				case ev.Type == "reset" && json.Unmarshal(ev.Data, &r) == nil && r.Reason == resume.ReasonBackendLost:
					want, _ := json.Marshal(cl.call)
					lostReset = ev.ID != "" && len(r.Lost) == 1 && string(r.Lost[0]) == string(want)
				case ev.Type == "reset" && json.Unmarshal(ev.Data, &r) == nil && r.Reason == resume.ReasonGenerationChanged:
					genReset = true
				case ev.Type == "" && json.Unmarshal(ev.Data, &m) == nil && m.Error != nil:
					lostError = m.HasID(cl.call) && m.Error.Code == resume.CodeRequestLost && lostReset
				}
			}
			if !lostReset || !lostError || !genReset {
				v.addf("%s: resume after seq %d: backend_lost reset %v, -32001 error %v, generation_changed %v: %q",
					cl.call, last.Seq, lostReset, lostError, genReset, describe(evs))
			}
		}
	}
	p.kill()

	// The audit: every event ID a client received names, in the log, that
	// event or nothing (lost in a crash); never another one.
	st := p.openStore()
	logged := map[string]map[uint64]string{}
	for _, r := range all {
		key := r.cur.Stream.String()
		if logged[key] == nil {
			logged[key] = map[uint64]string{}
			_, evs, err := readLog(ctx, st, key)
			if err != nil {
				v.addf("stream %s not in the log: %v", key, err)
				continue
			}
			for _, e := range evs {
				logged[key][e.Seq] = e.Type + " " + string(e.Data)
			}
		}
		got, ok := logged[key][r.cur.Seq]
		switch {
		case !ok && len(r.data) > 0:
			lostInCrash++
		case ok && got != r.typ+" "+r.data:
			v.addf("event ID %s (stream %s seq %d) was received as %q, the log holds %q", r.id, key, r.cur.Seq, r.data, got)
		}
	}
	t.Logf("--sync %s: %d rounds of kill -9, %d event IDs received, %d of them lost in the crashes", policy, rounds, len(all), lostInCrash)
	if policy == "always" && lostInCrash > 0 {
		v.addf("--sync always: %d events clients received are not in the log", lostInCrash)
	}
	v.report(t)
}
