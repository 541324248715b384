package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
)

// defaultDataDir is $XDG_STATE_HOME/mcprelay, else ~/.local/state/mcprelay,
// else ./mcprelay-data.
func defaultDataDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "mcprelay")
	}
	if home, err := os.UserHomeDir(); err == nil && home != "" {
		return filepath.Join(home, ".local", "state", "mcprelay")
	}
	return "mcprelay-data"
}

// openStore opens the event log the flags ask for, and the relay secret
// that goes with it: kept in the data directory for the disk store (so
// event IDs survive restarts), in Redis for the Redis store (so that
// replicas share it), random for the memory store.
func openStore(kind, dir, syncPolicy string, r eventlog.Retention) (eventlog.Store, []byte, error) {
	switch {
	case kind == "memory":
		return eventlog.NewMemory(r), nil, nil
	case strings.HasPrefix(kind, "redis://") || strings.HasPrefix(kind, "rediss://"):
		return openRedisStore(kind, os.Getenv(redisPasswordEnv), r)
	case kind == "disk":
	default:
		return nil, nil, fmt.Errorf("--store must be disk, memory or a redis:// or rediss:// URL, got %q", kind)
	}
	policy, err := pebblestore.ParseSyncPolicy(syncPolicy)
	if err != nil {
		return nil, nil, fmt.Errorf("--sync: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("--data-dir: %w", err)
	}
	secret, err := loadSecret(filepath.Join(dir, "secret"))
	if err != nil {
		return nil, nil, err
	}
	st, err := pebblestore.Open(filepath.Join(dir, "events"), pebblestore.Options{Retention: r, Sync: policy})
	if err != nil {
		return nil, nil, fmt.Errorf("opening the event log in %s: %w", dir, err)
	}
	return st, secret, nil
}

// loadSecret reads the relay secret, creating it (32 random bytes, mode
// 0600) on first use. A secret file readable by others is refused.
func loadSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		b = make([]byte, 32)
		rand.Read(b)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			if errors.Is(err, fs.ErrExist) { // another process created it first
				return loadSecret(path)
			}
			return nil, err
		}
		if _, err := f.Write(b); err != nil {
			f.Close()
			return nil, err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, err
		}
		return b, f.Close()
	}
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("relay secret %s is readable by others (mode %v): chmod 600 it", path, fi.Mode().Perm())
	}
	if len(b) < 32 {
		return nil, fmt.Errorf("relay secret %s: %d bytes, want at least 32", path, len(b))
	}
	return b, nil
}

// redisPasswordEnv names the environment variable with the Redis password,
// used when the --store URL has none (a password in a URL shows in ps).
const redisPasswordEnv = "MCPRELAY_REDIS_PASSWORD"

// redisOpenTimeout bounds connecting to Redis and loading the secret.
const redisOpenTimeout = 10 * time.Second

// openRedisStore opens the Redis store at url (redis://HOST:PORT/DB or
// rediss://...) and loads the relay secret shared by the replicas, creating
// it on first use. envPassword is used when the URL has no password.
func openRedisStore(url, envPassword string, r eventlog.Retention) (eventlog.Store, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), redisOpenTimeout)
	defer cancel()
	opts := redisstore.Options{URL: url, Retention: r}
	if !redisURLHasPassword(url) {
		opts.Password = envPassword
	}
	st, err := redisstore.Open(ctx, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("--store: %w", err)
	}
	secret, err := st.LoadOrCreateSecret(ctx)
	if err != nil {
		st.Close()
		return nil, nil, fmt.Errorf("loading the relay secret from Redis: %w", err)
	}
	return st, secret, nil
}

// redisURLHasPassword reports whether url's userinfo carries a password.
func redisURLHasPassword(url string) bool {
	rest, ok := strings.CutPrefix(url, "redis://")
	if !ok {
		rest, _ = strings.CutPrefix(url, "rediss://")
	}
	host, _, _ := strings.Cut(rest, "/")
	at := strings.LastIndexByte(host, '@')
	if at < 0 {
		return false
	}
	_, pass, ok := strings.Cut(host[:at], ":")
	return ok && pass != ""
}

// loadSecretFile reads a relay secret that must already exist (mode 0600,
// at least 32 bytes): replicas given one file share it.
func loadSecretFile(path string) ([]byte, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("--secret-file: %w", err)
	}
	return loadSecret(path)
}
