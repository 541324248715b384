package redisstore

import (
	"context"
	"time"
)

// AcquireAfterRead is AcquireLease by a caller that read the session's
// lease as value earlier and found its owner's heartbeat gone then.
func AcquireAfterRead(s *Store, ctx context.Context, session, owner string, ttl time.Duration, value string) (Lease, error) {
	return s.acquire(ctx, session, owner, ttl, value)
}
