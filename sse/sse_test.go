package sse

import (
	"bytes"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestAppendEvent(t *testing.T) {
	tests := []struct {
		name string
		e    Event
		want string
	}{
		{name: "all fields", e: Event{ID: "1", Type: "t", Retry: 1500 * time.Millisecond, Data: []byte("a")},
			want: "id: 1\nevent: t\nretry: 1500\ndata: a\n\n"},
		{name: "zero event is a blank line", e: Event{}, want: "\n"},
		{name: "priming event", e: Event{ID: "p", Data: []byte{}}, want: "id: p\ndata:\n\n"},
		{name: "nil data writes no data line", e: Event{ID: "x"}, want: "id: x\n\n"},
		{name: "type only", e: Event{Type: "reset"}, want: "event: reset\n\n"},
		{name: "retry only", e: Event{Retry: 3 * time.Second}, want: "retry: 3000\n\n"},
		{name: "retry below a millisecond rounds up", e: Event{Retry: time.Nanosecond}, want: "retry: 1\n\n"},
		{name: "retry rounds up to whole ms", e: Event{Retry: 1500*time.Millisecond + 1}, want: "retry: 1501\n\n"},
		{name: "negative retry omitted", e: Event{Retry: -time.Second}, want: "\n"},
		{name: "LF lines", e: Event{Data: []byte("a\nb")}, want: "data: a\ndata: b\n\n"},
		{name: "CRLF lines", e: Event{Data: []byte("a\r\nb")}, want: "data: a\ndata: b\n\n"},
		{name: "CR lines", e: Event{Data: []byte("a\rb")}, want: "data: a\ndata: b\n\n"},
		{name: "CR CRLF is two breaks", e: Event{Data: []byte("a\r\r\nb")}, want: "data: a\ndata:\ndata: b\n\n"},
		{name: "LF CR is two breaks", e: Event{Data: []byte("a\n\rb")}, want: "data: a\ndata:\ndata: b\n\n"},
		{name: "trailing newline", e: Event{Data: []byte("a\n")}, want: "data: a\ndata:\n\n"},
		{name: "newline only", e: Event{Data: []byte("\r\n")}, want: "data:\ndata:\n\n"},
		{name: "leading space kept", e: Event{Data: []byte(" x")}, want: "data:  x\n\n"},
		{name: "JSON", e: Event{ID: "s1_7", Data: []byte(`{"jsonrpc":"2.0","id":1,"result":{}}`)},
			want: "id: s1_7\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendEvent([]byte("prefix|"), tt.e)
			if want := "prefix|" + tt.want; string(got) != want {
				t.Errorf("AppendEvent = %q, want %q", got, want)
			}
		})
	}
}

func TestAppendComment(t *testing.T) {
	tests := []struct {
		name, text, want string
	}{
		{name: "empty", text: "", want: ":\n\n"},
		{name: "keep-alive", text: "ping", want: ": ping\n\n"},
		{name: "LF split into comment lines", text: "a\nb", want: ": a\n: b\n\n"},
		{name: "CRLF and CR split", text: "a\r\nb\rc", want: ": a\n: b\n: c\n\n"},
		{name: "trailing newline", text: "a\n", want: ": a\n:\n\n"},
		{name: "field-like text stays a comment", text: "x\ndata: injected", want: ": x\n: data: injected\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendComment(nil, tt.text)
			if string(got) != tt.want {
				t.Errorf("AppendComment = %q, want %q", got, tt.want)
			}
			// A comment never produces an event, whatever its text.
			if _, evs, err := scanAll(bytes.NewReader(got), 0); len(evs) != 0 || err != io.EOF {
				t.Errorf("scanning the comment gave %s, %v", fmtEvents(evs), err)
			}
		})
	}
}

// normalize returns e as a Scanner reads it back after AppendEvent: line
// breaks in Data become "\n" and Retry is rounded up to whole milliseconds.
func normalize(e Event) Event {
	if bytes.IndexByte(e.Data, '\r') >= 0 { // ReplaceAll would turn empty Data into nil
		d := bytes.ReplaceAll(e.Data, []byte("\r\n"), []byte("\n"))
		e.Data = bytes.ReplaceAll(d, []byte("\r"), []byte("\n"))
	}
	if e.Retry <= 0 {
		e.Retry = 0
	} else if r := e.Retry % time.Millisecond; r != 0 {
		e.Retry += time.Millisecond - r
	}
	return e
}

func isZero(e Event) bool { return e.ID == "" && e.Type == "" && e.Data == nil && e.Retry == 0 }

func TestRoundTrip(t *testing.T) {
	ids := []string{"", "1", "s9_gen2_42", " lead", "trail ", "ü", "a:b"}
	types := []string{"", "message", "reset", " x"}
	datas := [][]byte{nil, {}, []byte("x"), []byte(`{"a":1}`), []byte("a\nb"), []byte("a\r\nb\rc\n"),
		[]byte("\n"), []byte(" space"), []byte(":colon"), []byte("data: nested\n\n")}
	retries := []time.Duration{0, time.Millisecond, 2500 * time.Millisecond, time.Microsecond}

	var evs []Event
	for _, id := range ids {
		for _, typ := range types {
			for _, d := range datas {
				for _, r := range retries {
					evs = append(evs, Event{ID: id, Type: typ, Data: d, Retry: r})
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })

	var buf []byte
	var want []Event
	lastID := ""
	for i, e := range evs {
		buf = AppendEvent(buf, e)
		if i%7 == 0 {
			buf = AppendComment(buf, "keep-alive")
		}
		if !isZero(e) {
			want = append(want, normalize(e))
		}
		if e.ID != "" {
			lastID = e.ID
		}
	}
	for _, rd := range readers {
		t.Run(rd.name, func(t *testing.T) {
			sc, got, err := scanAll(rd.wrap(string(buf)), 0)
			if err != io.EOF {
				t.Fatalf("err = %v, want io.EOF", err)
			}
			if len(got) != len(want) {
				t.Fatalf("got %d events, want %d", len(got), len(want))
			}
			for i := range want {
				if !reflect.DeepEqual(got[i], want[i]) {
					t.Fatalf("event %d:\n got %s\nwant %s", i, fmtEvents(got[i:i+1]), fmtEvents(want[i:i+1]))
				}
			}
			if sc.LastEventID() != lastID {
				t.Errorf("LastEventID() = %q, want %q", sc.LastEventID(), lastID)
			}
		})
	}
}

func TestAppendEventAllocs(t *testing.T) {
	e := Event{ID: "s1_42", Type: "message", Retry: time.Second, Data: []byte("line one\nline two\r\nline three")}
	dst := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { dst = AppendEvent(dst[:0], e) }); n != 0 {
		t.Errorf("AppendEvent allocates %v times per call, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { dst = AppendComment(dst[:0], "keep-alive") }); n != 0 {
		t.Errorf("AppendComment allocates %v times per call, want 0", n)
	}
}

// TestScannerAllocs pins the per-event allocation budget: the Data copy and
// the ID string (Type is reused while it repeats), nothing per line.
func TestScannerAllocs(t *testing.T) {
	var buf []byte
	const n = 1000
	for i := range n {
		buf = AppendEvent(buf, Event{ID: "id" + string(rune('a'+i%26)), Type: "message",
			Data: []byte("{\"a\":1}\n{\"b\":2}")})
		buf = AppendComment(buf, "ping")
	}
	r := bytes.NewReader(buf)
	allocs := testing.AllocsPerRun(10, func() {
		r.Reset(buf)
		sc := NewScanner(r)
		for {
			if _, err := sc.Next(); err != nil {
				break
			}
		}
	})
	// 2 per event, plus the scanner, its buffer (grown from 512 B to 64 KiB
	// in 7 steps) and a few growing slices.
	if limit := float64(2*n + 20); allocs > limit {
		t.Errorf("scanning %d events made %v allocations, want at most %v", n, allocs, limit)
	}
}

// benchData is a typical 150-byte JSON-RPC message.
var benchData = []byte(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"tok-1234","progress":50,"total":100,"message":"half way there"}}`)

func BenchmarkAppendEvent(b *testing.B) {
	e := Event{ID: "c2VzczE_Z2VuMg_0000000042_mac0123456789", Data: benchData}
	dst := make([]byte, 0, 512)
	b.SetBytes(int64(len(AppendEvent(nil, e))))
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendEvent(dst[:0], e)
	}
}

func BenchmarkScanner(b *testing.B) {
	const perBuf = 10000
	var buf []byte
	for i := range perBuf {
		id := "c2VzczE_Z2VuMg_" + strings.Repeat("0", 6) + string(rune('0'+i%10)) + "_mac0123456789"
		buf = AppendEvent(buf, Event{ID: id, Data: benchData})
	}
	r := bytes.NewReader(buf)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	events := 0
	for b.Loop() {
		r.Reset(buf)
		sc := NewScanner(r)
		for {
			if _, err := sc.Next(); err != nil {
				if err != io.EOF {
					b.Fatal(err)
				}
				break
			}
			events++
		}
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
}
