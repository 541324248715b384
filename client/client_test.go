package client

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

func TestBackoff(t *testing.T) {
	lo, hi := 100*time.Millisecond, 10*time.Second
	cases := []struct {
		name      string
		attempt   int
		r         float64
		want      time.Duration
		retryWant time.Duration // delay with a server retry of 500ms
	}{
		{name: "first_low_jitter", attempt: 1, r: 0, want: 50 * time.Millisecond},
		{name: "first_high_jitter", attempt: 1, r: 0.999999, want: 99999950 * time.Nanosecond},
		{name: "third", attempt: 3, r: 0, want: 200 * time.Millisecond},
		{name: "capped", attempt: 20, r: 0, want: 5 * time.Second},
		{name: "huge_attempt_no_overflow", attempt: 1000, r: 0, want: 5 * time.Second},
		{name: "zero_attempt_is_first", attempt: 0, r: 0, want: 50 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := backoff(tc.attempt, lo, hi, tc.r); got != tc.want {
				t.Errorf("backoff(%d, r=%v) = %v, want %v", tc.attempt, tc.r, got, tc.want)
			}
		})
	}
}

func TestDelayHonoursRetry(t *testing.T) {
	c := newConn(New(Options{Endpoint: "x", MinBackoff: 10 * time.Millisecond, MaxBackoff: time.Second}).opts)
	cases := []struct {
		name    string
		attempt int
		retry   time.Duration
		lo, hi  time.Duration
	}{
		{name: "retry_sets_first_wait", attempt: 1, retry: 500 * time.Millisecond, lo: 500 * time.Millisecond, hi: 500 * time.Millisecond},
		{name: "retry_is_a_floor_later", attempt: 3, retry: 500 * time.Millisecond, lo: 500 * time.Millisecond, hi: 500 * time.Millisecond},
		{name: "backoff_beyond_retry", attempt: 10, retry: 50 * time.Millisecond, lo: 500 * time.Millisecond, hi: time.Second},
		{name: "no_retry", attempt: 1, lo: 5 * time.Millisecond, hi: 10 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.delay(tc.attempt, tc.retry); got < tc.lo || got > tc.hi {
				t.Errorf("delay(%d, %v) = %v, want in [%v, %v]", tc.attempt, tc.retry, got, tc.lo, tc.hi)
			}
		})
	}
}

func TestResumeCursor(t *testing.T) {
	cases := []struct {
		name       string
		cursor     string
		cursorSess string
		sess       string
		want       string
		refused    bool
	}{
		{name: "relay_id", cursor: "AbFKk7-e2dy810aa", cursorSess: "s1", sess: "s1", want: "AbFKk7-e2dy810aa"},
		{name: "sdk_style_id", cursor: "0_47", cursorSess: "s1", sess: "s1", want: "0_47"},
		{name: "no_session_ids", cursor: "event-2", want: "event-2"},
		{name: "none", refused: true},
		{name: "bare_integer", cursor: "47", cursorSess: "s1", sess: "s1", refused: true},
		{name: "other_session", cursor: "AbFKk7", cursorSess: "s1", sess: "s2", refused: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := &streamState{cursor: tc.cursor, cursorSess: tc.cursorSess}
			got, why := st.resumeCursor(tc.sess)
			if got != tc.want || (why != "") != tc.refused {
				t.Errorf("resumeCursor = %q, %q; want %q, refused %v", got, why, tc.want, tc.refused)
			}
		})
	}
}

func TestIDSet(t *testing.T) {
	var s idSet
	for i := range maxSeen + 10 {
		if !s.add(fmt.Sprint(i)) {
			t.Fatalf("add(%d) reported a duplicate", i)
		}
	}
	cases := []struct {
		name string
		id   string
		new  bool
	}{
		{name: "recent_is_duplicate", id: fmt.Sprint(maxSeen + 9), new: false},
		{name: "oldest_forgotten", id: "0", new: true},
		{name: "unseen", id: "x", new: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.add(tc.id); got != tc.new {
				t.Errorf("add(%q) = %v, want %v", tc.id, got, tc.new)
			}
		})
	}
}

func TestReadOnly(t *testing.T) {
	cases := []struct {
		method string
		want   bool
	}{
		{"tools/list", true}, {"resources/templates/list", true}, {"resources/read", true},
		{"prompts/get", true}, {"ping", true},
		{"tools/call", false}, {"initialize", false}, {"logging/setLevel", false}, {"completion/complete", false},
	}
	for _, tc := range cases {
		t.Run(tc.method, func(t *testing.T) {
			if got := ReadOnly(tc.method); got != tc.want {
				t.Errorf("ReadOnly(%q) = %v", tc.method, got)
			}
		})
	}
}

func TestIsLost(t *testing.T) {
	wire := &jsonrpc.Error{Code: CodeRequestLost, Message: "lost"}
	cases := []struct {
		name   string
		err    error
		lost   bool
		isWire bool
	}{
		{name: "nil", err: nil},
		{name: "sentinel_wrapped", err: fmt.Errorf("calling: %w", ErrRequestLost), lost: true},
		{name: "lost_error", err: fmt.Errorf("calling: %w", &LostError{Method: "tools/call", Reason: ReasonSessionLost}), lost: true},
		{name: "lost_error_with_wire", err: &LostError{Reason: ReasonBackendLost, Wire: wire}, lost: true, isWire: true},
		{name: "bare_wire_code", err: fmt.Errorf("calling: %w", wire), lost: true, isWire: true},
		{name: "other_wire_code", err: &jsonrpc.Error{Code: jsonrpc.CodeInternalError}},
		{name: "other", err: errors.New("boom")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsLost(tc.err); got != tc.lost {
				t.Errorf("IsLost = %v, want %v", got, tc.lost)
			}
			var w *jsonrpc.Error
			if got := errors.As(tc.err, &w) && w.Code == CodeRequestLost; got != tc.isWire {
				t.Errorf("errors.As(*jsonrpc.Error) with code -32001 = %v, want %v", got, tc.isWire)
			}
		})
	}
}

func TestWithProtocolVersion(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{name: "replaced", in: `{"protocolVersion":"2026-07-28","clientInfo":{"name":"a"}}`, want: `{"clientInfo":{"name":"a"},"protocolVersion":"2025-11-25"}`},
		{name: "added", in: `{}`, want: `{"protocolVersion":"2025-11-25"}`},
		{name: "not_an_object_kept", in: `[1]`, want: `[1]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(withProtocolVersion([]byte(tc.in), "2025-11-25")); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}
