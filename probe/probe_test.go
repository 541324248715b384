package probe_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/exampleserver"
	"github.com/mcprelay/mcprelay/probe"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/sse"
)

// allCases lists every case with verdict v, for building expectations.
func allCases(v probe.Verdict) map[string]probe.Verdict {
	m := map[string]probe.Verdict{}
	for _, c := range []string{
		probe.CaseCrossSession, probe.CaseAfterDelete, probe.CaseGarbageCursor, probe.CaseFutureCursor,
		probe.CasePostLastEventID, probe.CaseEvicted, probe.CaseFinished, probe.CaseConnected,
		probe.CaseMissingSession, probe.CaseUnknownSession, probe.CaseForeignOrigin, probe.CaseBadVersion,
		probe.CasePriming,
	} {
		m[c] = v
	}
	return m
}

func with(m map[string]probe.Verdict, kv ...any) map[string]probe.Verdict {
	for i := 0; i < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1].(probe.Verdict)
	}
	return m
}

func TestProbe(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		handler func(t *testing.T) http.Handler
		opts    probe.Options
		want    map[string]probe.Verdict
	}{
		{
			name: "mcprelay",
			handler: func(t *testing.T) http.Handler {
				return newRelay(t, nil)
			},
			opts: probe.Options{MaxEvents: 200, Timeout: 5 * time.Second},
			want: with(allCases(probe.Safe), probe.CaseEvicted, probe.NotTested, probe.CasePriming, probe.Info),
		},
		{
			name: "mcprelay with a retention the probe can outrun",
			handler: func(t *testing.T) http.Handler {
				return newRelay(t, eventlog.NewMemory(eventlog.Retention{MaxEvents: 50}))
			},
			opts: probe.Options{MaxEvents: 200, Timeout: 5 * time.Second},
			want: with(allCases(probe.Safe), probe.CasePriming, probe.Info),
		},
		{
			name:    "global buffer keyed by bare sequence numbers",
			handler: func(*testing.T) http.Handler { return newBroken(true, false) },
			opts:    probe.Options{MaxEvents: 200, Timeout: time.Second},
			want: with(allCases(probe.Safe),
				probe.CaseCrossSession, probe.Unsafe, // the seeds' leak
				probe.CaseFutureCursor, probe.Warn, // a bare number from the future is accepted
				probe.CaseEvicted, probe.NotTested, probe.CaseConnected, probe.Info, probe.CasePriming, probe.Info),
		},
		{
			name:    "finished streams replayed forever",
			handler: func(*testing.T) http.Handler { return newBroken(false, true) },
			opts:    probe.Options{MaxEvents: 200, Timeout: time.Second},
			want: with(allCases(probe.Safe),
				probe.CaseFinished, probe.Unsafe, // the hang
				probe.CaseEvicted, probe.NotTested, probe.CaseConnected, probe.Info, probe.CasePriming, probe.Info),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(tt.handler(t))
			t.Cleanup(srv.Close)
			rep, err := probe.Run(context.Background(), srv.URL+"/mcp", tt.opts)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			var buf bytes.Buffer
			rep.WriteText(&buf)
			got := rep.Verdicts()
			for c, want := range tt.want {
				if got[c] != want {
					t.Errorf("%s: got %s, want %s", c, got[c], want)
				}
			}
			if len(got) != len(tt.want) {
				t.Errorf("got %d cases, want %d", len(got), len(tt.want))
			}
			wantUnsafe := false
			for _, v := range tt.want {
				wantUnsafe = wantUnsafe || v == probe.Unsafe
			}
			if rep.Unsafe() != wantUnsafe {
				t.Errorf("Unsafe() = %v, want %v", rep.Unsafe(), wantUnsafe)
			}
			if t.Failed() {
				t.Logf("report:\n%s", buf.String())
			}
		})
	}
}

func newRelay(t *testing.T, store eventlog.Store) http.Handler {
	h, err := relay.New(relay.Options{Backend: backend.SDK(exampleserver.New(nil), nil), Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func TestRunErrors(t *testing.T) {
	t.Parallel()
	notMCP := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notMCP.Close)
	tests := []struct {
		name string
		url  string
		want error
	}{
		{"relative URL", "/mcp", probe.ErrBadURL},
		{"ftp URL", "ftp://127.0.0.1/mcp", probe.ErrBadURL},
		{"not an MCP server", notMCP.URL, probe.ErrInitialize},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := probe.Run(context.Background(), tt.url, probe.Options{Timeout: time.Second})
			if !errors.Is(err, tt.want) {
				t.Fatalf("Run(%q) = %v, want %v", tt.url, err, tt.want)
			}
		})
	}
}

// broken is a deliberately careless legacy-era MCP server. Its event IDs
// are bare sequence numbers from one counter, its events sit in one buffer,
// and its only tool, count_events(count, interval_ms), streams progress.
//
// With global set, a resume replays everything in the buffer after the
// cursor, whichever session it belongs to (the seeds' failure). Otherwise
// it replays only the same session's stream, and with hang set it then never
// ends the response (a resume of a finished stream hangs).
type broken struct {
	global, hang bool

	mu       sync.Mutex
	sessions map[string]bool
	nsess    int
	seq      int64
	log      []logged
}

type logged struct {
	seq             int64
	session, stream string
	data            []byte
}

func newBroken(global, hang bool) *broken {
	return &broken{global: global, hang: hang, sessions: map[string]bool{}}
}

func (b *broken) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Origin") != "" {
		http.Error(w, "forbidden origin", http.StatusForbidden)
		return
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Arguments struct {
				Count      int `json:"count"`
				IntervalMS int `json:"interval_ms"`
			} `json:"arguments"`
			Meta struct {
				ProgressToken json.RawMessage `json:"progressToken"`
			} `json:"_meta"`
		} `json:"params"`
	}
	if r.Method == http.MethodPost {
		if json.NewDecoder(r.Body).Decode(&msg) != nil || r.Header.Get("Last-Event-ID") != "" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		if msg.Method == "initialize" {
			b.mu.Lock()
			b.nsess++
			sid := fmt.Sprintf("session-%d", b.nsess)
			b.sessions[sid] = true
			b.mu.Unlock()
			w.Header().Set("Mcp-Session-Id", sid)
			writeJSON(w, msg.ID, `{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"broken","version":"0"}}`)
			return
		}
	}
	sid := r.Header.Get("Mcp-Session-Id")
	b.mu.Lock()
	known := b.sessions[sid]
	b.mu.Unlock()
	switch {
	case sid == "":
		http.Error(w, "missing session", http.StatusBadRequest)
		return
	case !known:
		http.Error(w, "unknown session", http.StatusNotFound)
		return
	case r.Header.Get("Mcp-Protocol-Version") != "2025-11-25":
		http.Error(w, "unsupported version", http.StatusBadRequest)
		return
	}
	switch r.Method {
	case http.MethodDelete:
		b.mu.Lock()
		delete(b.sessions, sid)
		b.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	case http.MethodGet:
		b.resume(w, r, sid)
	case http.MethodPost:
		switch {
		case msg.ID == nil:
			w.WriteHeader(http.StatusAccepted)
		case msg.Method == "tools/list":
			writeJSON(w, msg.ID, `{"tools":[{"name":"count_events","inputSchema":{"type":"object","properties":{"count":{"type":"integer"},"interval_ms":{"type":"integer"}}}}]}`)
		case msg.Method == "tools/call":
			args := msg.Params.Arguments
			b.call(w, sid, string(msg.ID), msg.ID, msg.Params.Meta.ProgressToken, min(args.Count, 10000), args.IntervalMS)
		default:
			writeJSON(w, msg.ID, `{}`)
		}
	}
}

func writeJSON(w http.ResponseWriter, id json.RawMessage, result string) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, id, result)
}

// emit logs data on the session's stream and writes it with its sequence number.
func (b *broken) emit(w http.ResponseWriter, sid, stream string, data []byte) {
	b.mu.Lock()
	b.seq++
	b.log = append(b.log, logged{b.seq, sid, stream, data})
	id := strconv.FormatInt(b.seq, 10)
	b.mu.Unlock()
	w.Write(sse.AppendEvent(nil, sse.Event{ID: id, Data: data}))
	w.(http.Flusher).Flush()
}

func (b *broken) call(w http.ResponseWriter, sid, stream string, id, token json.RawMessage, count, intervalMS int) {
	w.Header().Set("Content-Type", "text/event-stream")
	b.emit(w, sid, stream, []byte{}) // priming
	for i := 1; i <= count && token != nil; i++ {
		if i > 1 && intervalMS > 0 {
			time.Sleep(time.Duration(intervalMS) * time.Millisecond)
		}
		b.emit(w, sid, stream, fmt.Appendf(nil, `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":%s,"progress":%d,"total":%d}}`, token, i, count))
	}
	b.emit(w, sid, stream, fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"done"}]}}`, id))
}

func (b *broken) resume(w http.ResponseWriter, r *http.Request, sid string) {
	cursor, err := strconv.ParseInt(r.Header.Get("Last-Event-ID"), 10, 64)
	if err != nil {
		http.Error(w, "bad cursor", http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	var replay [][]byte
	stream, found := "", b.global
	for _, l := range b.log {
		if l.seq == cursor && l.session == sid {
			stream, found = l.stream, true
		}
	}
	for _, l := range b.log {
		if l.seq > cursor && (b.global || (l.session == sid && l.stream == stream)) {
			replay = append(replay, l.data)
		}
	}
	b.mu.Unlock()
	if !found {
		http.Error(w, "unknown cursor", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, d := range replay {
		if len(d) > 0 {
			w.Write(sse.AppendEvent(nil, sse.Event{Data: d}))
		}
	}
	w.(http.Flusher).Flush()
	if b.hang {
		<-r.Context().Done()
	}
}

func TestWriteText(t *testing.T) {
	t.Parallel()
	rep := &probe.Report{URL: "http://127.0.0.1:1/mcp", Results: []probe.Result{
		{Case: probe.CaseCrossSession, Verdict: probe.Unsafe, Observed: "LEAK", Reason: "cursor not bound"},
		{Case: probe.CaseFinished, Verdict: probe.Safe, Observed: "204", Reason: "ended"},
	}}
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(buf.String()), " "), "cross-session-cursor UNSAFE LEAK why: cursor not bound") {
		t.Errorf("table lacks the case row:\n%s", buf.String())
	}
	for _, want := range []string{"1 unsafe, 0 warn, 0 info, 0 not tested, 1 safe"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
}
