package sse

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// scanAll reads events until Next fails and returns them with that error.
func scanAll(r io.Reader, maxEventBytes int) (*Scanner, []Event, error) {
	sc := NewScanner(r)
	sc.MaxEventBytes = maxEventBytes
	var evs []Event
	for {
		ev, err := sc.Next()
		if err != nil {
			return sc, evs, err
		}
		evs = append(evs, ev)
	}
}

// readers are the ways each scanner case is fed: the split points must not
// change the result.
var readers = []struct {
	name string
	wrap func(string) io.Reader
}{
	{"whole", func(s string) io.Reader { return strings.NewReader(s) }},
	{"one-byte", func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) }},
	{"half", func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) }},
	{"data-err", func(s string) io.Reader { return iotest.DataErrReader(strings.NewReader(s)) }},
}

func TestScanner(t *testing.T) {
	empty := []byte{}
	tests := []struct {
		name   string
		in     string
		max    int
		want   []Event
		err    error
		lastID string
	}{
		{name: "LF", in: "id: 1\nevent: e\ndata: a\n\n",
			want: []Event{{ID: "1", Type: "e", Data: []byte("a")}}, err: io.EOF, lastID: "1"},
		{name: "CRLF", in: "id: 1\r\ndata: a\r\ndata: b\r\n\r\n",
			want: []Event{{ID: "1", Data: []byte("a\nb")}}, err: io.EOF, lastID: "1"},
		{name: "CR only", in: "data: a\rdata: b\r\r",
			want: []Event{{Data: []byte("a\nb")}}, err: io.EOF},
		{name: "mixed endings", in: "data: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r\n",
			want: []Event{{Data: []byte("a\nb\nc")}, {Data: []byte("d")}}, err: io.EOF},
		{name: "CR LF is one ending not a blank line", in: "data: a\r\ndata: b\r\n\r\n",
			want: []Event{{Data: []byte("a\nb")}}, err: io.EOF},
		{name: "BOM skipped", in: "\xEF\xBB\xBFdata: a\n\n",
			want: []Event{{Data: []byte("a")}}, err: io.EOF},
		{name: "BOM only once", in: "\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n", err: io.EOF},
		{name: "BOM alone", in: "\xEF\xBB\xBF", err: io.EOF},
		{name: "multi-line data", in: "data: a\ndata:\ndata: b\n\n",
			want: []Event{{Data: []byte("a\n\nb")}}, err: io.EOF},
		{name: "data without colon", in: "data\n\n",
			want: []Event{{Data: empty}}, err: io.EOF},
		{name: "two data without colon", in: "data\ndata\n\n",
			want: []Event{{Data: []byte("\n")}}, err: io.EOF},
		{name: "no space after colon", in: "data:x\n\n",
			want: []Event{{Data: []byte("x")}}, err: io.EOF},
		{name: "one space removed", in: "data: x\n\n",
			want: []Event{{Data: []byte("x")}}, err: io.EOF},
		{name: "second space kept", in: "data:  x\n\n",
			want: []Event{{Data: []byte(" x")}}, err: io.EOF},
		{name: "value may hold colons", in: "data: a:b: c\n\n",
			want: []Event{{Data: []byte("a:b: c")}}, err: io.EOF},
		{name: "comments ignored", in: ": hello\ndata: a\n: mid\n\n",
			want: []Event{{Data: []byte("a")}}, err: io.EOF},
		{name: "comment-only block produces nothing", in: ": ping\n\n:\n\n", err: io.EOF},
		{name: "unknown fields ignored", in: "foo: bar\ndata: a\nDATA: b\n data: c\n\n",
			want: []Event{{Data: []byte("a")}}, err: io.EOF},
		{name: "unknown field alone produces nothing", in: "foo: bar\n\n", err: io.EOF},
		{name: "id with NUL ignored", in: "id: 1\n\nid: a\x00b\ndata: x\n\n",
			want: []Event{{ID: "1"}, {Data: []byte("x")}}, err: io.EOF, lastID: "1"},
		{name: "id with NUL keeps earlier id in block", in: "id: 1\nid: \x00\ndata: x\n\n",
			want: []Event{{ID: "1", Data: []byte("x")}}, err: io.EOF, lastID: "1"},
		{name: "last id and event win", in: "id: 1\nid: 2\nevent: a\nevent: b\ndata\n\n",
			want: []Event{{ID: "2", Type: "b", Data: empty}}, err: io.EOF, lastID: "2"},
		{name: "id is per block, last id persists", in: "id: 1\ndata: a\n\ndata: b\n\n",
			want: []Event{{ID: "1", Data: []byte("a")}, {Data: []byte("b")}}, err: io.EOF, lastID: "1"},
		{name: "bare id clears last id without an event", in: "id: 1\n\nid\n\n",
			want: []Event{{ID: "1"}}, err: io.EOF, lastID: ""},
		{name: "event type resets per block", in: "event: up\ndata: a\n\ndata: b\n\n",
			want: []Event{{Type: "up", Data: []byte("a")}, {Data: []byte("b")}}, err: io.EOF},
		{name: "retry alone", in: "retry: 1500\n\n",
			want: []Event{{Retry: 1500 * time.Millisecond}}, err: io.EOF},
		{name: "retry with data", in: "retry:10\ndata: a\n\n",
			want: []Event{{Retry: 10 * time.Millisecond, Data: []byte("a")}}, err: io.EOF},
		{name: "retry non-digits ignored",
			in:   "retry: 1.5\ndata: a\n\nretry: -1\n\nretry: 1x\n\nretry:  15\n\nretry:\n\nretry: +1\n\n",
			want: []Event{{Data: []byte("a")}}, err: io.EOF},
		{name: "retry zero ignored", in: "retry: 0\n\n", err: io.EOF},
		{name: "retry overflow ignored", in: "retry: 99999999999999999999\n\n", err: io.EOF},
		{name: "priming event", in: "id: p1\ndata:\n\n",
			want: []Event{{ID: "p1", Data: empty}}, err: io.EOF, lastID: "p1"},
		{name: "priming with retry then data", in: "id: p1\nretry: 3000\ndata:\n\nid: 2\ndata: {}\n\n",
			want: []Event{{ID: "p1", Retry: 3 * time.Second, Data: empty}, {ID: "2", Data: []byte("{}")}},
			err:  io.EOF, lastID: "2"},
		{name: "empty blocks produce nothing", in: "\n\n\r\n\r\r\n", err: io.EOF},
		{name: "empty input", in: "", err: io.EOF},
		{name: "ends after blank line", in: "data: a\n\n\n",
			want: []Event{{Data: []byte("a")}}, err: io.EOF},
		{name: "truncated final event", in: "data: a\n\ndata: b\n",
			want: []Event{{Data: []byte("a")}}, err: io.ErrUnexpectedEOF},
		{name: "truncated inside a line", in: "data: a\n\ndata: b",
			want: []Event{{Data: []byte("a")}}, err: io.ErrUnexpectedEOF},
		{name: "truncated id is not committed", in: "id: 1\ndata: a\n\nid: 2\n",
			want: []Event{{ID: "1", Data: []byte("a")}}, err: io.ErrUnexpectedEOF, lastID: "1"},
		{name: "truncated unknown field", in: "foo\n", err: io.ErrUnexpectedEOF},
		{name: "truncated inside a comment is clean", in: "data: a\n\n: keep",
			want: []Event{{Data: []byte("a")}}, err: io.EOF},
		{name: "complete comment then end is clean", in: "data: a\n\n: keep\n",
			want: []Event{{Data: []byte("a")}}, err: io.EOF},
		{name: "too large one line", in: "data: 0123456789abcdef\n\n", max: 16, err: ErrTooLarge},
		{name: "too large unterminated", in: "data: 0123456789abcdef", max: 16, err: ErrTooLarge},
		{name: "too large accumulated", in: "data: 12345\ndata: 12345\ndata: 12345\n\n", max: 30,
			err: ErrTooLarge},
		{name: "too large counts comments", in: ": 123456789\ndata: 12345\n\n", max: 20, err: ErrTooLarge},
		{name: "exactly at limit", in: "data: 12345\n\ndata: 12345\n\n", max: 11,
			want: []Event{{Data: []byte("12345")}, {Data: []byte("12345")}}, err: io.EOF},
		{name: "events before too large are delivered", in: "data: a\n\ndata: 0123456789abcdef\n\n", max: 16,
			want: []Event{{Data: []byte("a")}}, err: ErrTooLarge},
	}
	for _, tt := range tests {
		for _, rd := range readers {
			t.Run(tt.name+"/"+rd.name, func(t *testing.T) {
				sc, got, err := scanAll(rd.wrap(tt.in), tt.max)
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("events:\n got %s\nwant %s", fmtEvents(got), fmtEvents(tt.want))
				}
				if err != tt.err {
					t.Errorf("err = %v, want %v", err, tt.err)
				}
				if id := sc.LastEventID(); id != tt.lastID {
					t.Errorf("LastEventID() = %q, want %q", id, tt.lastID)
				}
				if _, again := sc.Next(); again != err {
					t.Errorf("Next after error = %v, want the same %v", again, err)
				}
			})
		}
	}
}

// chunkReader returns one chunk per Read and fails if read past the last one,
// which shows whether the scanner reads further than it must.
type chunkReader struct{ chunks []string }

var errReadTooFar = errors.New("test: read past the last chunk")

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, errReadTooFar
	}
	n := copy(p, r.chunks[0])
	r.chunks[0] = r.chunks[0][n:]
	if r.chunks[0] == "" {
		r.chunks = r.chunks[1:]
	}
	return n, nil
}

func TestScannerReads(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
		want   []Event // delivered before the scanner reads past the chunks
	}{
		{name: "CR at end of read then LF", chunks: []string{"data: a\r", "\ndata: b\r", "\n\r", "\n"},
			want: []Event{{Data: []byte("a\nb")}}},
		{name: "CR blank line dispatches without waiting", chunks: []string{"data: a\r", "\r"},
			want: []Event{{Data: []byte("a")}}},
		{name: "LF after CR blank line is not another line", chunks: []string{"data: a\r\r", "\ndata: b\n\n"},
			want: []Event{{Data: []byte("a")}, {Data: []byte("b")}}},
		{name: "BOM split over reads", chunks: []string{"\xEF", "\xBB", "\xBF", "data: a\n\n"},
			want: []Event{{Data: []byte("a")}}},
		{name: "line split over reads", chunks: []string{"da", "ta: a", "bc\n", "\n"},
			want: []Event{{Data: []byte("abc")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, got, err := scanAll(&chunkReader{chunks: tt.chunks}, 0)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("events:\n got %s\nwant %s", fmtEvents(got), fmtEvents(tt.want))
			}
			if err != errReadTooFar {
				t.Errorf("err = %v, want the reader's own error %v", err, errReadTooFar)
			}
		})
	}
}

type zeroReader struct{}

func (zeroReader) Read([]byte) (int, error) { return 0, nil }

// endless returns 'a' forever: a line that never ends.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, errors.New("test: Read called with an empty buffer")
	}
	for i := range p {
		p[i] = 'a'
	}
	return len(p), nil
}

func TestScannerReadErrors(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name string
		r    io.Reader
		max  int
		want []Event
		err  error
	}{
		{name: "error returned as is", r: io.MultiReader(strings.NewReader("data: a\n\ndata: b\n"), iotest.ErrReader(errBoom)),
			want: []Event{{Data: []byte("a")}}, err: errBoom},
		{name: "timeout", r: iotest.TimeoutReader(strings.NewReader("data: a\n\n")),
			want: []Event{{Data: []byte("a")}}, err: iotest.ErrTimeout},
		{name: "reader making no progress", r: zeroReader{}, err: io.ErrNoProgress},
		{name: "endless line is bounded", r: endless{}, max: 100 << 10, err: ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, got, err := scanAll(tt.r, tt.max)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("events:\n got %s\nwant %s", fmtEvents(got), fmtEvents(tt.want))
			}
			if err != tt.err {
				t.Errorf("err = %v, want %v", err, tt.err)
			}
		})
	}
}

// TestScannerDataIsCopied checks that an event's Data is not overwritten by
// later events (the scanner reuses its buffers).
func TestScannerDataIsCopied(t *testing.T) {
	_, evs, err := scanAll(strings.NewReader("data: first\n\ndata: second\n\n"), 0)
	if err != io.EOF || len(evs) != 2 {
		t.Fatalf("got %d events, err %v", len(evs), err)
	}
	if string(evs[0].Data) != "first" || string(evs[1].Data) != "second" {
		t.Errorf("data = %q, %q", evs[0].Data, evs[1].Data)
	}
}

func fmtEvents(evs []Event) string {
	var b strings.Builder
	b.WriteString("[")
	for i, e := range evs {
		if i > 0 {
			b.WriteString(", ")
		}
		data := "nil"
		if e.Data != nil {
			data = strconv.Quote(string(e.Data))
		}
		fmt.Fprintf(&b, "{ID:%q Type:%q Data:%s Retry:%v}", e.ID, e.Type, data, e.Retry)
	}
	b.WriteString("]")
	return b.String()
}

// TestScannerBufferAdapts: an idle stream keeps a small buffer; a busy one
// grows to read in large chunks.
func TestScannerBufferAdapts(t *testing.T) {
	s := NewScanner(strings.NewReader("data: x\n\n"))
	if _, err := s.Next(); err != nil {
		t.Fatal(err)
	}
	if len(s.buf) > initialBufSize {
		t.Fatalf("idle buffer %d bytes, want <= %d", len(s.buf), initialBufSize)
	}
	var b strings.Builder
	for range 2000 {
		b.WriteString("id: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n")
	}
	s = NewScanner(strings.NewReader(b.String()))
	for {
		if _, err := s.Next(); err != nil {
			break
		}
	}
	if len(s.buf) < busyBufSize {
		t.Fatalf("busy buffer %d bytes, want %d", len(s.buf), busyBufSize)
	}
}
