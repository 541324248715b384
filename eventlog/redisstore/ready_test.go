package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
)

// Ready follows the Redis server: nil while it answers, an error once it
// is killed, nil again after it restarts.
func TestReady(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv, redisstore.Options{})
	ready := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		return st.Ready(ctx)
	}
	if err := ready(); err != nil {
		t.Fatalf("Ready with Redis up: %v", err)
	}
	srv.Kill()
	if err := ready(); err == nil {
		t.Fatal("Ready with Redis killed: nil")
	}
	srv.Restart(t)
	// The client reconnects on its own; give it a minute.
	for deadline := time.Now().Add(time.Minute); ready() != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Ready after Redis restarted: %v", ready())
		}
	}
}
