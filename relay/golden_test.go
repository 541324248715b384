package relay_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
	"golang.org/x/tools/txtar"
)

var update = flag.Bool("update", false, "rewrite the golden exchanges in testdata/golden")

// transcript records HTTP exchanges with the relay as readable text, with
// everything random normalized: event IDs become <id N>, stream keys
// <stream N>, in order of first appearance; the session ID <session>.
type transcript struct {
	t       *testing.T
	buf     bytes.Buffer
	ids     map[string]string
	streams map[string]string
	keys    map[string]bool // stream keys seen inside event IDs
	codec   *resume.Codec
	session string
}

func newTranscript(t *testing.T) *transcript {
	return &transcript{t: t, ids: map[string]string{}, streams: map[string]string{}, keys: map[string]bool{}, codec: codec(t)}
}

func (tr *transcript) id(raw string) string {
	if raw == "" {
		return ""
	}
	if n, ok := tr.ids[raw]; ok {
		return n
	}
	cur, err := tr.codec.Parse(raw)
	switch {
	case err == nil:
		n := fmt.Sprintf("<id %d: %s gen %d seq %d>", len(tr.ids)+1, tr.stream(cur.Stream.String()), cur.Generation, cur.Seq)
		tr.ids[raw] = n
		return n
	case errors.Is(err, resume.ErrForged):
		return "<well-formed id under another secret>"
	}
	return raw // not an event ID: shown as it is
}

func (tr *transcript) stream(key string) string {
	if n, ok := tr.streams[key]; ok {
		return n
	}
	n := fmt.Sprintf("<stream %d>", len(tr.streams)+1)
	tr.streams[key] = n
	return n
}

var streamKeyInJSON = regexp.MustCompile(`"stream":"([A-Za-z0-9_-]{22})"`)

// data normalizes an event's data: stream keys in reset events.
func (tr *transcript) data(d []byte) string {
	return streamKeyInJSON.ReplaceAllStringFunc(string(d), func(m string) string {
		key := streamKeyInJSON.FindStringSubmatch(m)[1]
		return `"stream":"` + tr.stream(key) + `"`
	})
}

func (tr *transcript) printf(format string, args ...any) {
	fmt.Fprintf(&tr.buf, format, args...)
}

// request sends a request and records it and the whole answer (an SSE
// stream is read to its end, or until n data events when n > 0).
func (tr *transcript) request(e *env, s *rawSession, method, lastEventID, body string, n int) []sse.Event {
	tr.t.Helper()
	hdr := map[string]string{}
	if s != nil {
		hdr = s.headers()
		tr.session = s.id
	}
	if lastEventID != "" {
		hdr["Last-Event-ID"] = lastEventID
	}
	line := "> " + method
	if s == nil {
		line += " (no session)"
	}
	if lastEventID != "" {
		line += " Last-Event-ID: " + tr.id(lastEventID)
	}
	tr.printf("%s\n", line)
	if body != "" {
		tr.printf("%s\n", body)
	}
	resp := e.do(method, hdr, body)
	tr.printf("< %d %s\n", resp.StatusCode, strings.Split(resp.Header.Get("Content-Type"), ";")[0])
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		if b = bytes.TrimSpace(b); len(b) > 0 {
			tr.printf("%s\n", b)
		}
		tr.printf("\n")
		return nil
	}
	evs, ended := events(tr.t, resp, n, 10*time.Second)
	for _, ev := range evs {
		var parts []string
		if ev.ID != "" {
			parts = append(parts, "id "+tr.id(ev.ID))
		}
		if ev.Type != "" {
			parts = append(parts, "event "+ev.Type)
		}
		if ev.Retry > 0 {
			parts = append(parts, "retry")
		}
		if ev.Data != nil {
			if len(ev.Data) == 0 {
				parts = append(parts, "(priming)")
			} else {
				parts = append(parts, tr.data(ev.Data))
			}
		}
		tr.printf("  %s\n", strings.Join(parts, " "))
	}
	if ended {
		tr.printf("  (end)\n")
	} else {
		tr.printf("  (open)\n")
	}
	tr.printf("\n")
	return evs
}

// golden compares the transcript with testdata/golden/name.txtar (or
// writes it with -update).
func (tr *transcript) golden(name, comment string) {
	tr.t.Helper()
	path := filepath.Join("testdata", "golden", name+".txtar")
	got := txtar.Format(&txtar.Archive{
		Comment: []byte(comment + "\n"),
		Files:   []txtar.File{{Name: "exchange", Data: tr.buf.Bytes()}},
	})
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			tr.t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			tr.t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		tr.t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		tr.t.Errorf("%s differs from the exchange (run with -update to accept):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// callBody is a tools/call of the test server's count tool with progress.
func countCall(id, n int) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"count","arguments":{"n":%d},"_meta":{"progressToken":"p%d"}}}`, id, n, id)
}

// TestGolden replays one exchange per row of the decision table and per
// reset kind against the relay and compares it with the golden files in
// testdata/golden (go test ./relay -run TestGolden -update rewrites them).
func TestGolden(t *testing.T) {
	tests := []struct {
		name, comment string
		opts          relay.Options
		run           func(t *testing.T, tr *transcript, e *env)
	}{
		{"row01_missing_session", "Row 1: a GET with Last-Event-ID and no Mcp-Session-Id is a 400.", relay.Options{},
			func(t *testing.T, tr *transcript, e *env) {
				s := e.initialize("2025-11-25", "")
				evs := tr.request(e, s, "POST", "", countCall(1, 1), 0)
				tr.request(e, nil, "GET", evs[1].ID, "", 0)
			}},
		{"row02_unknown_session", "Row 2: a deleted session is a 404, whatever the cursor; the cursor is never read.", relay.Options{},
			func(t *testing.T, tr *transcript, e *env) {
				s := e.initialize("2025-11-25", "")
				evs := tr.request(e, s, "POST", "", countCall(1, 1), 0)
				tr.request(e, s, "DELETE", "", "", 0)
				tr.request(e, s, "GET", evs[1].ID, "", 0)
				tr.request(e, s, "GET", "garbage", "", 0)
			}},
		{"row03_rejected_cursor", "Row 3: a malformed cursor, one forged under another secret, and one naming a generation its stream never had are 400s, never 404s.", relay.Options{},
			func(t *testing.T, tr *transcript, e *env) {
				s := e.initialize("2025-11-25", "")
				evs := tr.request(e, s, "POST", "", countCall(1, 1), 0)
				cur, _ := tr.codec.Parse(evs[1].ID)
				other, _ := resume.NewCodec([]byte("another relay's secret, 32 bytes!"))
				tr.request(e, s, "GET", "4471", "", 0)
				tr.request(e, s, "GET", other.ID(cur), "", 0)
				cur.Generation++
				tr.request(e, s, "GET", tr.codec.ID(cur), "", 0)
			}},
		{"row04_foreign_stream", "Row 4: a genuine cursor of another session's stream is a 409 (a tenant-isolation event), never a replay.", relay.Options{},
			func(t *testing.T, tr *transcript, e *env) {
				a := e.initialize("2025-11-25", "")
				b := e.initialize("2025-11-25", "")
				evs := tr.request(e, a, "POST", "", countCall(1, 2), 0)
				tr.request(e, b, "GET", evs[1].ID, "", 0)
			}},
		{"row05_unknown_stream", "Row 5 (reset unknown_stream): a genuine cursor of a stream the log does not hold: a reset, then the end.", relay.Options{},
			func(t *testing.T, tr *transcript, e *env) {
				s := e.initialize("2025-11-25", "")
				tr.request(e, s, "GET", tr.codec.ID(resume.Cursor{Stream: resume.StreamKey{7}, Generation: 1, Seq: 3}), "", 0)
			}},
		{"row06_generation_changed", "Row 6 (reset generation_changed): the backend lost the session and the relay re-created it; a cursor of the old generation replays what the log holds up to the seal, then the reset.", relay.Options{},
			func(t *testing.T, tr *transcript, e *env) {
				s := e.initialize("2025-11-25", "")
				evs := tr.request(e, s, "POST", "", countCall(1, 2), 0)
				e.backend.Restart()
				tr.request(e, s, "POST", "", `{"jsonrpc":"2.0","id":2,"method":"ping"}`, 0)
				tr.request(e, s, "GET", evs[1].ID, "", 0)
			}},
		{"row07_gap", "Row 7 (reset gap): retention (3 events per session) evicted the events after the cursor: the reset first, then what is retained (nothing), then the end of the finished stream.", relay.Options{Store: eventlog.NewMemory(eventlog.Retention{MaxEvents: 3})},
			func(t *testing.T, tr *transcript, e *env) {
				s := e.initialize("2025-11-25", "")
				evs := tr.request(e, s, "POST", "", countCall(1, 1), 0)
				tr.request(e, s, "POST", "", countCall(2, 2), 0) // its 3 events evict the first call's
				tr.request(e, s, "GET", evs[0].ID, "", 0)
			}},
		{"row07_ahead_of_log", "Row 7 (ahead_of_log): a genuine cursor past what the log holds (delivered, then lost in a crash) gets a gap reset, never a 400.", relay.Options{},
			func(t *testing.T, tr *transcript, e *env) {
				s := e.initialize("2025-11-25", "")
				evs := tr.request(e, s, "POST", "", countCall(1, 1), 0)
				cur, _ := tr.codec.Parse(evs[len(evs)-1].ID)
				cur.Seq += 10
				tr.request(e, s, "GET", tr.codec.ID(cur), "", 0)
			}},
		{"row08_finished", "Row 8: a cursor at the terminal event: 204, nothing more will come.", relay.Options{},
			func(t *testing.T, tr *transcript, e *env) {
				s := e.initialize("2025-11-25", "")
				evs := tr.request(e, s, "POST", "", countCall(1, 1), 0)
				tr.request(e, s, "GET", evs[len(evs)-1].ID, "", 0)
			}},
		{"row09_replay_to_end", "Row 9: a cursor before the terminal event replays through it, then ends.", relay.Options{},
			func(t *testing.T, tr *transcript, e *env) {
				s := e.initialize("2025-11-25", "")
				evs := tr.request(e, s, "POST", "", countCall(1, 3), 0)
				tr.request(e, s, "GET", evs[1].ID, "", 0)
			}},
		{"row10_replay_then_live", "Row 10: a cursor on a stream still running replays after it, then goes on live until the response.", relay.Options{},
			func(t *testing.T, tr *transcript, e *env) {
				s := e.initialize("2025-11-25", "")
				body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count","arguments":{"n":3,"interval_ms":100},"_meta":{"progressToken":"p1"}}}`
				evs := tr.request(e, s, "POST", "", body, 2) // priming and the first progress, then cut
				tr.request(e, s, "GET", evs[0].ID, "", 0)
			}},
		{"reset_backend_lost", "Reset backend_lost: the backend is lost while a call runs; the call's stream is sealed with the reset naming the lost request and a -32001 error under its id; a resume replays both, then says the generation changed.", relay.Options{},
			func(t *testing.T, tr *transcript, e *env) {
				s := e.initialize("2025-11-25", "")
				body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"block","arguments":{}}}`
				resp := s.post(body)
				first, _ := events(t, resp, 0, 300*time.Millisecond) // the priming event; the call goes on
				tr.printf("> POST\n%s\n< %d (the connection is closed after the priming event; the backend restarts)\n\n", body, resp.StatusCode)
				e.backend.Restart()
				deadline := time.Now().Add(10 * time.Second)
				for e.relay.Counts()["lost"] == 0 && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				tr.request(e, s, "GET", lastID(first), "", 0)
			}},
	}
	names := map[string]bool{}
	for _, tt := range tests {
		names[tt.name+".txtar"] = true
		t.Run(tt.name, func(t *testing.T) {
			opts := tt.opts
			opts.Secret = testSecret
			e := newEnv(t, opts)
			tr := newTranscript(t)
			tt.run(t, tr, e)
			tr.golden(tt.name, tt.comment)
		})
	}
	if *update {
		return
	}
	files, _ := filepath.Glob(filepath.Join("testdata", "golden", "*.txtar"))
	var stale []string
	for _, f := range files {
		if !names[filepath.Base(f)] {
			stale = append(stale, f)
		}
	}
	sort.Strings(stale)
	if len(stale) > 0 {
		t.Errorf("golden files without a test: %v", stale)
	}
}
