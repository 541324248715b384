package relay_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
	"github.com/mcprelay/mcprelay/relay"
)

// benchTarget is an MCP endpoint to measure: the relay in front of the
// test server, or the SDK handler alone (the baseline, same run).
func benchTarget(b *testing.B, viaRelay bool) string {
	return benchTargetStore(b, viaRelay, nil)
}

// benchTargetStore is benchTarget with the relay on the given store (nil:
// memory).
func benchTargetStore(b *testing.B, viaRelay bool, store eventlog.Store) string {
	b.Helper()
	var h http.Handler = backend.SDKHandler(testServer(nil), nil)
	if viaRelay {
		rh, err := relay.New(relay.Options{Backend: backend.Handler(h), Store: store})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { rh.Close() })
		h = rh
	}
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	return srv.URL
}

func benchPost(b *testing.B, url, sid, body string) *http.Response {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	return resp
}

func benchSession(b *testing.B, url string) string {
	resp := benchPost(b, url, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	sid := resp.Header.Get("Mcp-Session-Id")
	resp = benchPost(b, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	resp.Body.Close()
	return sid
}

// BenchmarkStreamProgressDurable is BenchmarkStreamProgress through the
// relay on the disk store with SyncAlways, the default of mcprelay serve:
// every event is fsynced before the client sees it, so batching appends is
// what keeps one stream from running at the disk's fsync rate.
func BenchmarkStreamProgressDurable(b *testing.B) {
	st, err := pebblestore.Open(b.TempDir(), pebblestore.Options{Retention: eventlog.Retention{MaxEvents: 1 << 20, MaxBytes: 1 << 30}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	url := benchTargetStore(b, true, st)
	benchStream(b, url)
}

// BenchmarkStreamProgress measures one tools/call streaming b.N progress
// notifications, counted as received by the client (events/s), through the
// relay and, as the baseline, from the SDK handler directly.
func BenchmarkStreamProgress(b *testing.B) {
	for _, viaRelay := range []bool{false, true} {
		name := "sdk-direct"
		if viaRelay {
			name = "via-relay"
		}
		b.Run(name, func(b *testing.B) {
			benchStream(b, benchTarget(b, viaRelay))
		})
	}
}

// benchStream runs one tools/call of b.N progress notifications against
// url and reports the events/s the client received.
func benchStream(b *testing.B, url string) {
	sid := benchSession(b, url)
	b.ResetTimer()
	resp := benchPost(b, url, sid, fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count","arguments":{"n":%d},"_meta":{"progressToken":"t"}}}`, b.N))
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	got := 0
	for {
		line, err := br.ReadSlice('\n')
		if bytes.HasPrefix(line, []byte("data: {")) {
			if bytes.Contains(line, []byte(`"notifications/progress"`)) {
				got++
			} else if bytes.Contains(line, []byte(`"result"`)) {
				break
			}
		}
		if err != nil && err != bufio.ErrBufferFull {
			b.Fatalf("stream ended after %d events: %v", got, err)
		}
	}
	b.StopTimer()
	if got != b.N {
		b.Fatalf("received %d of %d events", got, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkIdleSessions measures the heap held per initialized, idle
// session (no open client stream), with the SDK server in process: the
// relay's cost is the via-relay figure minus the sdk-direct one.
func BenchmarkIdleSessions(b *testing.B) {
	const n = 2000
	for _, viaRelay := range []bool{false, true} {
		name := "sdk-direct"
		if viaRelay {
			name = "via-relay"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				url := benchTarget(b, viaRelay)
				benchSession(b, url) // warm up
				settle()             // the previous run's relay closing its backend sessions
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				g0 := runtime.NumGoroutine()
				for range n {
					benchSession(b, url)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heapB/session")
				b.ReportMetric(float64(runtime.NumGoroutine()-g0)/n, "goroutines/session")
			}
		})
	}
}

// settle waits until the number of goroutines has not changed for 1.5 s
// (20 s at most): a relay closed by an earlier run ends its backend
// sessions in the background (Handler.Close does not wait for them), in
// steps that paused for up to 500 ms, and its in-process handlers'
// goroutines end a second after their last request. A measurement taken
// meanwhile saw memory and goroutines go away (0.18 goroutines per session).
func settle() {
	n, since := runtime.NumGoroutine(), time.Now()
	for deadline := time.Now().Add(20 * time.Second); time.Since(since) < 1500*time.Millisecond && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if m := runtime.NumGoroutine(); m != n {
			n, since = m, time.Now()
		}
	}
}

// answerBackend is the least a Streamable HTTP MCP server can be: every
// request is answered at once with a JSON result (initialize with a
// session ID), notifications with 202. In front of it the relay's own cost
// per call shows, as peers.Minimal shows it in mcpbench.
func answerBackend() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if body, err := io.ReadAll(r.Body); err != nil || json.Unmarshal(body, &m) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if len(m.ID) == 0 {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		result := `{"content":[{"type":"text","text":"ok"}]}`
		if m.Method == "initialize" {
			w.Header().Set("Mcp-Session-Id", "s1")
			result = `{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"answer","version":"1"}}`
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, m.ID, result)
	})
}

// BenchmarkRoundTrip measures tools/call round trips from concurrent
// sessions (one per goroutine) over loopback: the SDK server reached
// directly (the baseline), through the relay, and the relay in front of
// answerBackend (its own cost). allocs/op counts the client's too, the
// same for every target.
//
//	go test -run '^$' -bench RoundTrip -benchmem -count 6 ./relay/
func BenchmarkRoundTrip(b *testing.B) {
	targets := []struct {
		name string
		url  func(b *testing.B) string
	}{
		{"sdk-direct", func(b *testing.B) string { return benchTarget(b, false) }},
		{"via-relay", func(b *testing.B) string { return benchTarget(b, true) }},
		{"via-relay-answer", func(b *testing.B) string {
			rh, err := relay.New(relay.Options{Backend: backend.Handler(answerBackend())})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { rh.Close() })
			srv := httptest.NewServer(rh)
			b.Cleanup(srv.Close)
			return srv.URL
		}},
	}
	for _, tg := range targets {
		b.Run(tg.name, func(b *testing.B) {
			url := tg.url(b)
			b.ReportAllocs()
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				sid := benchSession(b, url)
				for pb.Next() {
					resp := benchPost(b, url, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count","arguments":{"n":0}}}`)
					body, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"result"`)) {
						b.Errorf("status %d, %v: %s", resp.StatusCode, err, body)
						return
					}
				}
			})
		})
	}
}
