package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
)

// sessionsCmd is "mcprelay sessions": the sessions of a store, read-only.
func sessionsCmd(args []string) error {
	fs := flag.NewFlagSet("sessions", flag.ContinueOnError)
	storeKind := fs.String("store", "disk", "the relay's event log: disk (in --data-dir); memory and redis:// stores cannot be listed")
	dataDir := fs.String("data-dir", defaultDataDir(), "the relay's data directory")
	asJSON := fs.Bool("json", false, "write the list as JSON")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: mcprelay sessions [flags]\n\n"+
			"Lists the sessions of a relay's disk store, read-only: session ID, principal tag (a short hash, never\n"+
			"the principal), age, idle time, incarnation, protocol version, streams, events and bytes retained.\n"+
			"Reads MCPRELAY_STORE, MCPRELAY_DATA_DIR and --config like serve. The store cannot be read while a relay\n"+
			"runs on it.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, fromEnvAndConfig(fs, true)...); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("sessions: unexpected arguments %q", fs.Args())
	}
	switch {
	case *storeKind == "memory":
		return errors.New("sessions: the memory store lives in the relay's own process: there is nothing to list from outside")
	case strings.HasPrefix(*storeKind, "redis://") || strings.HasPrefix(*storeKind, "rediss://"):
		return errors.New("sessions: the Redis store cannot be listed: its only index of sessions (by last use, for the sweep of idle sessions) holds their IDs, and misses those written before it existed")
	case *storeKind != "disk":
		return fmt.Errorf("sessions: --store must be disk, got %q", *storeKind)
	}
	list, err := listDiskSessions(context.Background(), *dataDir)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeSessionsJSON(os.Stdout, list, time.Now())
	}
	return writeSessions(os.Stdout, list, time.Now())
}

// listDiskSessions lists the sessions of the disk store in data directory
// dir, opened read-only. It fails, naming the process, while a relay holds
// the directory: Pebble locks its directory even for reading.
func listDiskSessions(ctx context.Context, dir string) ([]eventlog.SessionSummary, error) {
	events := filepath.Join(dir, eventsName)
	if _, err := os.Stat(events); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("sessions: no disk store in %s (no %s)", dir, events)
	}
	// The relay's own lock, taken without writing our pid in it: a relay
	// starting meanwhile is refused as if another relay held the directory.
	path := filepath.Join(dir, lockName)
	if f, err := os.Open(path); err == nil {
		defer f.Close() // releases the lock
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("sessions: data dir %s is in use by mcprelay (pid %s): its disk store cannot be read while the relay runs "+
				"(the database locks its directory, even for reading); stop that relay to list its sessions", dir, lockHolder(path))
		} else if err != nil {
			return nil, fmt.Errorf("sessions: locking data dir %s: %w", dir, err)
		}
	}
	st, err := pebblestore.Open(events, pebblestore.Options{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("sessions: opening the event log in %s: %w", dir, err)
	}
	defer st.Close()
	list, err := st.ListSessions(ctx)
	if err != nil {
		return nil, fmt.Errorf("sessions: %w", err)
	}
	slices.SortFunc(list, func(a, b eventlog.SessionSummary) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return list, nil
}

// principalTag is a short tag for a session's principal that does not
// reveal it: the first 8 hex digits of its SHA-256, "-" for anonymous.
func principalTag(p string) string {
	if p == "" {
		return "-"
	}
	sum := sha256.Sum256([]byte(p))
	return hex.EncodeToString(sum[:4])
}

// idleSince is when the session was last used, as recorded.
func idleSince(s *eventlog.Session) time.Time {
	if s.LastUsed.IsZero() {
		return s.Created
	}
	return s.LastUsed
}

// writeSessions writes list as a table, ages measured at now.
func writeSessions(w io.Writer, list []eventlog.SessionSummary, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tPRINCIPAL\tAGE\tIDLE\tINCARNATION\tPROTOCOL\tSTREAMS\tEVENTS\tBYTES")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%d\n", s.ID, principalTag(s.Principal),
			now.Sub(s.Created).Round(time.Second), now.Sub(idleSince(&s.Session)).Round(time.Second),
			s.Incarnation, s.ProtocolVersion, s.Streams, s.Events, s.Bytes)
	}
	return tw.Flush()
}

// sessionJSON is one session in "mcprelay sessions --json".
type sessionJSON struct {
	Session         string    `json:"session"`
	PrincipalTag    string    `json:"principal_tag"`
	Created         time.Time `json:"created"`
	LastUsed        time.Time `json:"last_used"`
	AgeSeconds      int64     `json:"age_seconds"`
	Incarnation     uint64    `json:"incarnation"`
	ProtocolVersion string    `json:"protocol_version"`
	Streams         int       `json:"streams"`
	Events          int       `json:"events"`
	Bytes           int64     `json:"bytes"`
}

// writeSessionsJSON writes list as a JSON array, ages measured at now.
func writeSessionsJSON(w io.Writer, list []eventlog.SessionSummary, now time.Time) error {
	out := make([]sessionJSON, len(list))
	for i, s := range list {
		out[i] = sessionJSON{
			Session: s.ID, PrincipalTag: principalTag(s.Principal), Created: s.Created, LastUsed: idleSince(&s.Session),
			AgeSeconds: int64(now.Sub(s.Created) / time.Second), Incarnation: s.Incarnation, ProtocolVersion: s.ProtocolVersion,
			Streams: s.Streams, Events: s.Events, Bytes: s.Bytes,
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
