package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/relay"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
)

// syncCountingStore is a memory store that counts the writes a durable
// store would fsync for (every write but CreateStreamUnsynced), by kind,
// the way eventlog/pebblestore commits them under SyncAlways.
type syncCountingStore struct {
	*eventlog.Memory
	mu     sync.Mutex
	synced map[string]int
}

func (s *syncCountingStore) count(kind string) {
	s.mu.Lock()
	s.synced[kind]++
	s.mu.Unlock()
}

func (s *syncCountingStore) snapshot() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.synced))
	for k, v := range s.synced {
		out[k] = v
	}
	return out
}

func (s *syncCountingStore) CreateStream(ctx context.Context, st *eventlog.Stream) error {
	s.count("CreateStream")
	return s.Memory.CreateStream(ctx, st)
}

func (s *syncCountingStore) CreateStreamUnsynced(ctx context.Context, st *eventlog.Stream) error {
	return s.Memory.CreateStream(ctx, st)
}

func (s *syncCountingStore) Sync(context.Context) error {
	s.count("Sync")
	return nil
}

func (s *syncCountingStore) Append(ctx context.Context, key string, terminal bool, evs ...eventlog.Event) (uint64, error) {
	s.count("Append")
	return s.Memory.Append(ctx, key, terminal, evs...)
}

func (s *syncCountingStore) UpdateSession(ctx context.Context, rec *eventlog.Session) error {
	s.count("UpdateSession")
	return s.Memory.UpdateSession(ctx, rec)
}

// TestOneSyncPerCall: a call answered at once costs one synced write (its
// response, which also makes its stream's record durable), and the client
// still gets the priming event first, in the same write. A call whose
// first event comes before the priming delay costs no more than its
// appends; a call with nothing to send for longer costs one Sync (the
// record is made durable before the priming event names it).
func TestOneSyncPerCall(t *testing.T) {
	cases := []struct {
		name       string
		primeDelay time.Duration
		call       func(s *rawSession) []sse.Event
		perCall    map[string]int
	}{
		{"answered before the priming delay", time.Minute, func(s *rawSession) []sse.Event {
			_, resp := s.call(0, 0, false)
			return streamOf(t, resp)
		}, map[string]int{"Append": 1}},
		{"a progress notification before the priming delay", time.Minute, func(s *rawSession) []sse.Event {
			_, resp := s.call(2, 30, true) // progress, 30 ms, progress, 30 ms, the answer
			return streamOf(t, resp)
		}, map[string]int{"Append": 3}},
		{"nothing before the priming delay", time.Millisecond, func(s *rawSession) []sse.Event {
			id := s.nextID
			s.nextID++
			resp := s.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"block","arguments":{}}}`, id))
			sc := sse.NewScanner(resp.Body)
			priming, err := sc.Next()
			if err != nil {
				t.Fatal(err)
			}
			s.post(fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":%d}}`, id))
			evs := []sse.Event{priming}
			for {
				ev, err := sc.Next()
				if err != nil {
					return evs
				}
				evs = append(evs, ev)
			}
		}, map[string]int{"Sync": 1, "Append": 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer relay.SetPrimeDelay(tc.primeDelay)()
			store := &syncCountingStore{Memory: eventlog.NewMemory(eventlog.Retention{}), synced: map[string]int{}}
			e := newEnv(t, relay.Options{Store: store, SessionIdleTimeout: -1})
			s := e.initialize("2025-11-25", "")
			before := store.snapshot()
			const calls = 5
			for range calls {
				evs := tc.call(s)
				if len(evs) < 2 || evs[0].ID == "" || len(evs[0].Data) != 0 {
					t.Fatalf("events %+v, want a priming event (an id, no data) first", evs)
				}
				if last := evs[len(evs)-1]; !strings.Contains(string(last.Data), `"id":`) {
					t.Fatalf("last event %q, want the response", last.Data)
				}
			}
			after := store.snapshot()
			for _, kind := range []string{"CreateStream", "Append", "Sync", "UpdateSession"} {
				if got, want := after[kind]-before[kind], calls*tc.perCall[kind]; got != want {
					t.Errorf("%d calls: %d synced %s, want %d", calls, got, kind, want)
				}
			}
		})
	}
}

// streamOf reads a call's whole stream.
func streamOf(t *testing.T, resp *http.Response) []sse.Event {
	t.Helper()
	evs, ended := events(t, resp, 0, 10*time.Second)
	if !ended {
		t.Fatalf("the call's stream did not end: %+v", evs)
	}
	return evs
}

// failingSyncStore is a syncCountingStore whose Sync fails (a disk that
// stopped taking writes).
type failingSyncStore struct{ *syncCountingStore }

func (failingSyncStore) Sync(context.Context) error { return eventlog.ErrUnavailable }

// TestUnsyncedStreamSyncFails: when a call's stream cannot be made durable
// before its priming event, no cursor naming it goes out (a crash could
// make it name nothing), and the client is not left with a stream that
// ends without an answer: it gets the request-lost error under its id.
func TestUnsyncedStreamSyncFails(t *testing.T) {
	defer relay.SetPrimeDelay(time.Millisecond)()
	store := failingSyncStore{&syncCountingStore{Memory: eventlog.NewMemory(eventlog.Retention{}), synced: map[string]int{}}}
	e := newEnv(t, relay.Options{Store: store, SessionIdleTimeout: -1})
	s := e.initialize("2025-11-25", "")
	resp := s.post(`{"jsonrpc":"2.0","id":"slow-1","method":"tools/call","params":{"name":"block","arguments":{}}}`)
	evs, ended := events(t, resp, 0, 10*time.Second)
	if !ended {
		t.Fatalf("the stream did not end: %+v", evs)
	}
	if len(evs) != 1 || evs[0].ID != "" {
		t.Fatalf("events %+v, want one event without an id", evs)
	}
	m := mcptest.Decode(t, evs[0].Data)
	if string(m.ID) != `"slow-1"` || m.Error == nil || m.Error.Code != resume.CodeRequestLost {
		t.Fatalf("event %s, want the request-lost error for slow-1", evs[0].Data)
	}
}

// TestOneSyncPerHeldAnswer: an answer the connector holds whole when the
// call returns (an in-process handler that wrote progress and the result
// without flushing, then returned) is logged in one synced Append, not one
// per message.
func TestOneSyncPerHeldAnswer(t *testing.T) {
	defer relay.SetPrimeDelay(time.Minute)()
	chatty := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.Unmarshal(body, &m)
		if m.Method != "tools/call" {
			r.Body = io.NopCloser(bytes.NewReader(body))
			answerBackend().ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 1; i <= 5; i++ {
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":%d}}\n\n", i)
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{}}\n\n", m.ID)
	})
	store := &syncCountingStore{Memory: eventlog.NewMemory(eventlog.Retention{}), synced: map[string]int{}}
	e := newEnv(t, relay.Options{Backend: backend.Handler(chatty), Store: store, SessionIdleTimeout: -1})
	s := e.initialize("2025-11-25", "")
	before := store.snapshot()
	const calls = 5
	for range calls {
		_, resp := s.call(0, 0, false)
		evs := streamOf(t, resp)
		if data := dataEvents(evs); len(data) != 6 || !strings.Contains(string(data[5].Data), `"result"`) {
			t.Fatalf("events %+v, want 5 progress notifications and the result", evs)
		}
	}
	if got := store.snapshot()["Append"] - before["Append"]; got != calls {
		t.Errorf("%d calls: %d synced Appends, want %d", calls, got, calls)
	}
}
