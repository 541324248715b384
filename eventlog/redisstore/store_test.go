package redisstore_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
	"github.com/mcprelay/mcprelay/eventlog/storetest"
)

// prefixes gives every store of a test its own key space on a shared server.
var prefixes atomic.Int64

func freshPrefix() string { return fmt.Sprintf("t%d", prefixes.Add(1)) }

// open opens a store on srv with its own prefix, closed when t ends.
func open(t testing.TB, srv *redistest.Server, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	if opts.URL == "" {
		opts.URL = srv.URL()
	}
	if opts.Prefix == "" {
		opts.Prefix = freshPrefix()
	}
	st, err := redisstore.Open(t.Context(), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	storetest.Run(t, func(t *testing.T, r eventlog.Retention) eventlog.Store {
		st, err := redisstore.Open(t.Context(), redisstore.Options{URL: srv.URL(), Prefix: freshPrefix(), Retention: r})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return st
	})
}

// TestSize: Redis's used_memory follows what is written.
func TestSize(t *testing.T) {
	srv := redistest.Start(t)
	storetest.SizeGrows(t, open(t, srv, redisstore.Options{}), 8<<20)
}
