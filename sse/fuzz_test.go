package sse

import (
	"bytes"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func FuzzScanner(f *testing.F) {
	for _, s := range []string{
		"id: 1\nevent: e\ndata: a\n\n",
		"data: a\r\ndata: b\rdata: c\n\r\n",
		"\xEF\xBB\xBFdata: a\r\r\n",
		"id: p1\nretry: 3000\ndata:\n\n",
		"id: a\x00b\ndata\n\nretry: 99999999999999999999\n\n",
		": ping\n\nfoo: bar\n\ndata:  x\n",
		"data: 0123456789abcdef\n\n",
	} {
		f.Add([]byte(s), uint8(1), uint16(0))
		f.Add([]byte(s), uint8(3), uint16(16))
	}
	f.Fuzz(func(t *testing.T, in []byte, chunk uint8, maxEventBytes uint16) {
		_, whole, wholeErr := scanAll(bytes.NewReader(in), int(maxEventBytes))

		// Where reads split the input must not matter.
		split := &chunkedReader{b: in, n: 1 + int(chunk)%17}
		_, chunked, chunkedErr := scanAll(split, int(maxEventBytes))
		if !reflect.DeepEqual(whole, chunked) || wholeErr != chunkedErr {
			t.Fatalf("split reads changed the result:\nwhole   %s %v\nchunked %s %v",
				fmtEvents(whole), wholeErr, fmtEvents(chunked), chunkedErr)
		}
		// SkipEventIDs changes only Event.ID: the same events otherwise,
		// and the same last event ID after each.
		full, skip := NewScanner(bytes.NewReader(in)), NewScanner(bytes.NewReader(in))
		full.MaxEventBytes, skip.MaxEventBytes, skip.SkipEventIDs = int(maxEventBytes), int(maxEventBytes), true
		for {
			a, errA := full.Next()
			b, errB := skip.Next()
			a.ID = ""
			if !reflect.DeepEqual(a, b) || errA != errB || full.LastEventID() != skip.LastEventID() {
				t.Fatalf("SkipEventIDs changed more than Event.ID: %s %v (last %q) against %s %v (last %q)",
					fmtEvents([]Event{a}), errA, full.LastEventID(), fmtEvents([]Event{b}), errB, skip.LastEventID())
			}
			if errA != nil {
				break
			}
		}

		switch wholeErr {
		case io.EOF, io.ErrUnexpectedEOF, ErrTooLarge:
		default:
			t.Fatalf("unexpected error %v", wholeErr)
		}
		// Every event takes at least two bytes, so the scanner cannot have
		// invented events.
		if len(whole) > len(in)/2 {
			t.Fatalf("%d events from %d bytes", len(whole), len(in))
		}

		// Each event re-encoded and re-scanned is itself.
		var buf []byte
		for _, e := range whole {
			if isZero(e) {
				t.Fatalf("zero event returned")
			}
			if !validID(e.ID) || !validType(e.Type) || bytes.IndexByte(e.Data, '\r') >= 0 ||
				e.Retry < 0 || e.Retry%time.Millisecond != 0 {
				t.Fatalf("scanner returned an event it cannot have read: %s", fmtEvents([]Event{e}))
			}
			buf = AppendEvent(buf, e)
		}
		_, again, err := scanAll(bytes.NewReader(buf), 0)
		if err != io.EOF || !reflect.DeepEqual(whole, again) {
			t.Fatalf("re-encoded events differ:\nfirst %s\nagain %s %v\nwire %q",
				fmtEvents(whole), fmtEvents(again), err, buf)
		}
	})
}

func FuzzRoundTrip(f *testing.F) {
	f.Add("1", "", []byte("hello"), false, uint32(0))
	f.Add("p", "", []byte{}, false, uint32(3000))
	f.Add("", "reset", []byte("a\r\nb\rc\n"), false, uint32(0))
	f.Add(" x", " y", []byte(" z"), false, uint32(1))
	f.Add("", "", []byte(nil), true, uint32(0))
	f.Fuzz(func(t *testing.T, id, typ string, data []byte, nilData bool, retryMs uint32) {
		if !validID(id) || !validType(typ) {
			t.Skip("AppendEvent's precondition does not hold")
		}
		if nilData {
			data = nil
		} else if data == nil {
			data = []byte{}
		}
		e := Event{ID: id, Type: typ, Data: data, Retry: time.Duration(retryMs) * time.Millisecond}
		wire := AppendEvent(nil, e)
		wire = AppendComment(wire, "between")
		wire = AppendEvent(wire, e)

		var want []Event
		if !isZero(e) {
			want = []Event{normalize(e), normalize(e)}
		}
		for _, rd := range []struct {
			name string
			r    io.Reader
		}{
			{"whole", bytes.NewReader(wire)},
			{"one-byte", iotest.OneByteReader(bytes.NewReader(wire))},
		} {
			sc, got, err := scanAll(rd.r, 0)
			if err != io.EOF || !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: wire %q\n got %s %v\nwant %s", rd.name, wire, fmtEvents(got), err, fmtEvents(want))
			}
			if sc.LastEventID() != id {
				t.Fatalf("%s: LastEventID() = %q, want %q", rd.name, sc.LastEventID(), id)
			}
		}
	})
}

// chunkedReader returns at most n bytes per Read.
type chunkedReader struct {
	b []byte
	n int
}

func (r *chunkedReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.n)], r.b)
	r.b = r.b[n:]
	return n, nil
}

func validID(s string) bool   { return !strings.ContainsAny(s, "\r\n\x00") }
func validType(s string) bool { return !strings.ContainsAny(s, "\r\n") }
