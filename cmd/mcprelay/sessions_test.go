package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
)

// TestSessionsCommand: "mcprelay sessions" lists a stopped relay's disk
// store, oldest first, with a principal tag that does not reveal the
// principal; while a relay holds the data dir it says which process does
// and why it cannot read; memory and Redis stores are refused clearly.
func TestSessionsCommand(t *testing.T) {
	dir := t.TempDir()
	st, _, err := openStore("disk", dir, "always", eventlog.Retention{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	created := time.Now().Add(-2 * time.Hour).UTC()
	for i, s := range []*eventlog.Session{
		{ID: "sess-new", Principal: "oauth:0123456789abcdef", Incarnation: 1, ProtocolVersion: "2025-11-25", Created: created.Add(time.Hour)},
		{ID: "sess-old", Incarnation: 3, ProtocolVersion: "2025-06-18", Created: created, LastUsed: created.Add(90 * time.Minute)},
	} {
		if err := st.CreateSession(ctx, s); err != nil {
			t.Fatal(err)
		}
		for j := range i + 1 {
			key := fmt.Sprintf("%s-%d", s.ID, j)
			if err := st.CreateStream(ctx, &eventlog.Stream{Key: key, Session: s.ID, Generation: 1}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Append(ctx, key, false, eventlog.Event{Data: []byte("0123456789")}); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Held by a relay (this process): refused, naming it.
	_, stderr, status := runMain(t, "sessions", "--data-dir", dir)
	want := fmt.Sprintf("mcprelay: sessions: data dir %s is in use by mcprelay (pid %d): its disk store cannot be read while the relay runs", dir, os.Getpid())
	if status != 1 || !strings.HasPrefix(stderr, want) {
		t.Fatalf("while held: exit %d, stderr:\n%s\nwant exit 1 and\n%s...", status, stderr, want)
	}
	st.Close()

	stdout, stderr, status := runMain(t, "sessions", "--data-dir", dir)
	if status != 0 {
		t.Fatalf("exit %d: %s", status, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and 2 sessions, got:\n%s", stdout)
	}
	for i, want := range [][]string{
		{"SESSION", "PRINCIPAL", "AGE", "IDLE", "INCARNATION", "PROTOCOL", "STREAMS", "EVENTS", "BYTES"},
		{"sess-old", "-", "2h0m0s", "30m0s", "3", "2025-06-18", "2", "2", "20"},
		{"sess-new", principalTag("oauth:0123456789abcdef"), "1h0m0s", "1h0m0s", "1", "2025-11-25", "1", "1", "10"},
	} {
		got := strings.Fields(lines[i])
		if len(got) != len(want) || i == 0 && !slices.Equal(got, want) {
			t.Fatalf("line %d: %q, want %q", i, lines[i], want)
		}
		for j := range want {
			if i > 0 && (j == 2 || j == 3) { // ages: to the second, as the clock runs
				if d, err := time.ParseDuration(got[j]); err != nil || (d-mustDuration(want[j])).Abs() > time.Minute {
					t.Errorf("line %d column %d: %q, want about %s", i, j, got[j], want[j])
				}
				continue
			}
			if got[j] != want[j] {
				t.Errorf("line %d column %d: %q, want %q", i, j, got[j], want[j])
			}
		}
	}
	if strings.Contains(stdout, "0123456789abcdef") {
		t.Errorf("the principal shows:\n%s", stdout)
	}

	stdout, _, status = runMain(t, "sessions", "--data-dir", dir, "--json")
	var list []sessionJSON
	if err := json.Unmarshal([]byte(stdout), &list); status != 0 || err != nil || len(list) != 2 {
		t.Fatalf("--json: exit %d, %v:\n%s", status, err, stdout)
	}
	if got := list[1]; got.Session != "sess-new" || got.Streams != 1 || got.Events != 1 || got.Bytes != 10 || got.PrincipalTag != principalTag("oauth:0123456789abcdef") {
		t.Errorf("--json: %+v", got)
	}

	// Listing left the directory to the relay.
	if st, _, err = openStore("disk", dir, "always", eventlog.Retention{}, nil); err != nil {
		t.Fatalf("a relay after the listing: %v", err)
	}
	st.Close()

	for _, c := range []struct{ args, want string }{
		{"--store memory", "the memory store lives in the relay's own process"},
		{"--store redis://127.0.0.1:6379/0", "the Redis store cannot be listed"},
		{"--data-dir " + t.TempDir(), "no disk store in"},
	} {
		_, stderr, status := runMain(t, append([]string{"sessions"}, strings.Fields(c.args)...)...)
		if status != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("%s: exit %d, stderr %q, want %q", c.args, status, stderr, c.want)
		}
	}
}

func mustDuration(s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return d
}
