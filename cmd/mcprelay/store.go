package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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

// Files in the data directory.
const (
	lockName   = "lock"   // held (flock) by the relay using the directory; holds its pid
	secretName = "secret" // the relay secret event IDs are signed with
	eventsName = "events" // the disk store
)

// openStore opens the event log the flags ask for, and the relay secret
// that goes with it: kept in the data directory for the disk store (so
// event IDs survive restarts), in Redis for the Redis store (so that
// replicas share it), random for the memory store. The data directory of
// the disk store stays locked until the returned store is closed.
func openStore(kind, dir, syncPolicy string, r eventlog.Retention, log *slog.Logger) (eventlog.Store, []byte, error) {
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
	lock, err := lockDataDir(dir)
	if err != nil {
		return nil, nil, err
	}
	secret, err := loadSecretFor(dir)
	if err != nil {
		lock.Close()
		return nil, nil, err
	}
	if log != nil {
		log = log.With("component", "eventlog")
	}
	st, err := pebblestore.Open(filepath.Join(dir, eventsName), pebblestore.Options{Retention: r, Sync: policy, Logger: log})
	if err != nil {
		lock.Close()
		return nil, nil, fmt.Errorf("opening the event log in %s: %w", dir, err)
	}
	return &lockedStore{Store: st, lock: lock}, secret, nil
}

// lockedStore releases the data directory's lock when the store is closed.
type lockedStore struct {
	*pebblestore.Store
	lock *os.File
}

func (s *lockedStore) Close() error {
	err := s.Store.Close()
	s.lock.Close() // releases the flock
	return err
}

// lockDataDir takes an exclusive lock on dir (flock of dir/lock, released
// when the process exits, however it exits) and writes our pid into the
// lock file, so that a second relay on the same directory can say which
// process holds it.
func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking data dir %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir %s is in use by another mcprelay (pid %s)", dir, lockHolder(path))
		}
		return nil, fmt.Errorf("locking data dir %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking data dir %s: %w", dir, err)
	}
	return f, nil
}

// lockHolder returns the pid written in the lock file at path, or
// "unknown".
func lockHolder(path string) string {
	if b, err := os.ReadFile(path); err == nil {
		if n, err := strconv.Atoi(string(bytes.TrimSpace(b))); err == nil {
			return strconv.Itoa(n)
		}
	}
	return "unknown"
}

// loadSecretFor returns the relay secret of data directory dir, creating
// it if the directory has none yet. A missing secret next to an event log
// that holds data is an error: a new secret would silently invalidate
// every event ID that clients hold.
func loadSecretFor(dir string) ([]byte, error) {
	path := filepath.Join(dir, secretName)
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		events := filepath.Join(dir, eventsName)
		if nonEmpty, err := dirHasEntries(events); err != nil {
			return nil, fmt.Errorf("checking the event log %s: %w", events, err)
		} else if nonEmpty {
			return nil, fmt.Errorf("relay secret %s is missing but the event log %s holds data: "+
				"a new secret would invalidate every event ID clients hold; restore the secret, or remove %s to start afresh",
				path, events, events)
		}
	}
	return loadSecret(path)
}

// dirHasEntries reports whether dir exists and is not empty.
func dirHasEntries(dir string) (bool, error) {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return false, nil
	}
	return err == nil, err
}

// loadSecret reads the relay secret, creating it (32 random bytes, mode
// 0600) on first use. A secret file readable by others is refused. The
// file appears complete or not at all: it is written and fsynced under a
// temporary name, then hard-linked to path, which fails if another process
// linked its own first (its secret is then used).
func loadSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := createSecret(path); err != nil {
			return nil, err
		}
		b, err = os.ReadFile(path)
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

// createSecret writes a new secret to path unless path exists.
func createSecret(path string) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*") // mode 0600
	if err != nil {
		return fmt.Errorf("creating the relay secret: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	b := make([]byte, 32)
	rand.Read(b)
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("creating the relay secret: %w", err)
	}
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating the relay secret: %w", err)
	}
	// Make the new name durable.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
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
