package e2e_test

import (
	"errors"
	"io"
	"math/rand/v2"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/mcprelay/mcprelay/relay"
)

// testSecret keys event IDs; fixed so that failures reproduce.
var testSecret = []byte("e2e-test-secret-0123456789abcdef")

// startRelay serves a relay with opts on a loopback httptest server and
// returns its URL. Everything is torn down when the test ends.
func startRelay(t testing.TB, opts relay.Options) (*relay.Handler, string) {
	t.Helper()
	if opts.Secret == nil {
		opts.Secret = testSecret
	}
	h, err := relay.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		h.Close()
		srv.CloseClientConnections()
		srv.Close()
	})
	return h, srv.URL
}

// errCut is what a cut response body returns: like a connection reset in
// the middle of a stream (not a clean end, which would let an SSE parser
// take a half-received event as whole).
var errCut = errors.New("e2e: connection cut by the test")

// cutBody is a response body that fails with errCut after limit bytes,
// closing the underlying body (so that the server sees the client leave).
type cutBody struct {
	rc    io.ReadCloser
	limit int
	read  int
	cut   bool
	onCut func()
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.cut {
		return 0, errCut
	}
	if left := b.limit - b.read; len(p) > left {
		p = p[:left]
	}
	if len(p) == 0 {
		b.cut = true
		b.rc.Close()
		if b.onCut != nil {
			b.onCut()
		}
		return 0, errCut
	}
	n, err := b.rc.Read(p)
	b.read += n
	return n, err
}

func (b *cutBody) Close() error { return b.rc.Close() }

// lockedRand is a seeded random source safe for concurrent use.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newRand(seed uint64) *lockedRand {
	return &lockedRand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// intn returns a number in [lo, hi).
func (l *lockedRand) between(lo, hi int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return lo + l.r.IntN(hi-lo)
}
