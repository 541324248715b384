package relay

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/eventlog"
)

// brokenDelete is a store that cannot delete one session, for a reason a
// retry does not cure.
type brokenDelete struct {
	*eventlog.Memory
	id string
}

func (s brokenDelete) DeleteSession(ctx context.Context, id string) error {
	if id == s.id {
		return errors.New("the record cannot be decoded")
	}
	return s.Memory.DeleteSession(ctx, id)
}

// TestUnmadeSkipsWhatRetryCannotCure: a session whose record the store
// refuses to delete for a reason other than being out of reach is left
// to the sweep; the sessions queued after it are still removed.
// Regression (before it shipped): the remover retried it every second for
// ever, and held up every other removal.
func TestUnmadeSkipsWhatRetryCannotCure(t *testing.T) {
	mem := eventlog.NewMemory(eventlog.Retention{})
	h, err := New(Options{Backend: backend.Handler(http.NotFoundHandler()), Store: brokenDelete{mem, "x"}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, id := range []string{"x", "y"} {
		if err := mem.CreateSession(t.Context(), &eventlog.Session{ID: id, Incarnation: 1}); err != nil {
			t.Fatal(err)
		}
		h.unmake(id)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		_, err := mem.Session(t.Context(), "y")
		if errors.Is(err, eventlog.ErrNotFound) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session queued after one the store cannot delete is still there 3 s on (%v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// badRecord is a store whose record of one session cannot be read, for a
// reason a retry does not cure, and which lists that session first.
type badRecord struct {
	*eventlog.Memory
	id string
}

func (s badRecord) Session(ctx context.Context, id string) (*eventlog.Session, error) {
	if id == s.id {
		return nil, errors.New("the record cannot be decoded")
	}
	return s.Memory.Session(ctx, id)
}

func (s badRecord) IdleSessions(ctx context.Context, before time.Time, limit int) ([]string, error) {
	ids, err := s.Memory.IdleSessions(ctx, before, limit)
	var rest []string
	for _, id := range ids {
		if id != s.id {
			rest = append(rest, id)
		}
	}
	return append([]string{s.id}, rest...), err
}

// TestSweepSkipsWhatItCannotRead: a session whose record cannot be read
// is skipped, and the sweep goes on with the others. Regression (before it
// shipped): the sweep stopped at it, every time, so that nothing listed
// after it was ever removed.
func TestSweepSkipsWhatItCannotRead(t *testing.T) {
	mem := eventlog.NewMemory(eventlog.Retention{})
	h, err := New(Options{Backend: backend.Handler(http.NotFoundHandler()), Store: badRecord{mem, "bad"}, SessionIdleTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	long := time.Now().Add(-3 * time.Hour)
	for _, id := range []string{"bad", "old"} {
		if err := mem.CreateSession(t.Context(), &eventlog.Session{ID: id, Incarnation: 1, Created: long}); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.sweep(); n != 1 {
		t.Errorf("sweep removed %d sessions, want 1 (the readable one)", n)
	}
	if _, err := mem.Session(t.Context(), "old"); !errors.Is(err, eventlog.ErrNotFound) {
		t.Errorf("the readable idle session after the sweep: %v, want ErrNotFound", err)
	}
}
