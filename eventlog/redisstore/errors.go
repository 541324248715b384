package redisstore

import "errors"

// Errors returned by the store besides the eventlog sentinels.
var (
	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("redisstore: store is closed")
	// ErrCorrupt reports a stored record the store cannot decode.
	ErrCorrupt = errors.New("redisstore: corrupt record")
	// ErrLeaseHeld is wrapped by the *HeldError that AcquireLease returns
	// when another owner holds the session's lease.
	ErrLeaseHeld = errors.New("redisstore: lease held by another owner")
	// ErrLeaseLost is returned by RenewLease and ReleaseLease when the
	// lease is no longer held by the caller: it expired and another owner
	// acquired it since, or it was released.
	ErrLeaseLost = errors.New("redisstore: lease lost")
	// ErrNoLease is returned by Holder when nobody holds the session's lease.
	ErrNoLease = errors.New("redisstore: no lease")

	errEmptyID       = errors.New("redisstore: empty session ID")
	errEmptyKey      = errors.New("redisstore: empty stream key")
	errEmptyTerminal = errors.New("redisstore: terminal append without events")
	errEmptyOwner    = errors.New("redisstore: empty lease owner")
	errBadTTL        = errors.New("redisstore: lease TTL must be at least 1ms")
	errBadURL        = errors.New("redisstore: bad URL")
)
