package resume

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"sync"
)

// Errors returned by NewCodec and Codec.Parse. Callers branch with errors.Is.
var (
	ErrWeakSecret = errors.New("resume: secret shorter than 32 bytes")
	ErrMalformed  = errors.New("resume: malformed event ID")
	ErrForged     = errors.New("resume: event ID not issued by this relay")
)

const (
	version    = 1
	minSecret  = 32
	keyLen     = 16
	macLen     = 12
	headerLen  = 1 + keyLen                                   // version | stream key
	minRawLen  = headerLen + 1 + 1 + macLen                   // two one-byte varints
	maxRawLen  = headerLen + 2*binary.MaxVarintLen64 + macLen // 49
	maxInput   = 128                                          // Parse rejects longer input before decoding
	domainText = "mcprelay-event-id-v1"
)

// domainTag separates event-ID MACs from any other use of the relay secret.
var domainTag = []byte(domainText)

// b64 is the one encoding for event IDs and stream keys: base64url, no padding,
// and strict about the unused low bits of the last character, so that two
// different strings never decode to the same bytes.
var b64 = base64.RawURLEncoding.Strict()

// StreamKey names one stream; 16 random bytes minted by the relay.
type StreamKey [16]byte

// NewStreamKey returns a fresh random key from crypto/rand. It panics only if
// crypto/rand fails, which the runtime treats as fatal anyway.
func NewStreamKey() StreamKey {
	var k StreamKey
	if _, err := rand.Read(k[:]); err != nil {
		panic(fmt.Sprintf("resume: crypto/rand failed: %v", err))
	}
	return k
}

// String returns k as unpadded base64url (22 characters), for logs and map keys.
func (k StreamKey) String() string {
	return b64.EncodeToString(k[:])
}

// ParseStreamKey is the inverse of [StreamKey.String]. It wraps
// ErrMalformed for anything String cannot have produced.
func ParseStreamKey(s string) (StreamKey, error) {
	var k StreamKey
	if len(s) != 22 {
		return k, fmt.Errorf("%w: stream key of length %d", ErrMalformed, len(s))
	}
	n, err := b64.Decode(k[:], []byte(s))
	if err != nil || n != len(k) || b64.EncodeToString(k[:]) != s {
		return StreamKey{}, fmt.Errorf("%w: stream key %q", ErrMalformed, s)
	}
	return k, nil
}

// Cursor is what an event ID names.
type Cursor struct {
	Stream     StreamKey
	Generation uint64 // the session incarnation that produced the stream (starts at 1)
	Seq        uint64 // event sequence within the stream, 1-based; 0 = "before the first event" (priming)
}

// Codec mints and verifies event IDs. Safe for concurrent use.
//
// Every replica that must accept another replica's IDs needs a codec built
// from the same secret.
type Codec struct {
	macs sync.Pool // of *macState, each keyed with the codec's secret
}

// macState is one pooled HMAC with scratch space, so that neither the payload
// nor the sum has to escape to the heap through the hash.Hash interface.
type macState struct {
	h   hash.Hash
	raw [maxRawLen]byte
	sum [sha256.Size]byte
}

// NewCodec returns a codec keyed by secret, which must be at least 32 bytes
// long, else the error wraps ErrWeakSecret. The codec keeps its own copy of
// secret.
func NewCodec(secret []byte) (*Codec, error) {
	if len(secret) < minSecret {
		return nil, fmt.Errorf("%w (got %d)", ErrWeakSecret, len(secret))
	}
	key := append([]byte(nil), secret...)
	c := &Codec{}
	c.macs.New = func() any {
		return &macState{h: hmac.New(sha256.New, key)}
	}
	return c, nil
}

// mac computes the truncated MAC of m.raw[:n] into m.sum[:macLen].
func (m *macState) mac(n int) []byte {
	m.h.Reset()
	m.h.Write(domainTag)
	m.h.Write(m.raw[:n])
	return m.h.Sum(m.sum[:0])[:macLen]
}

// AppendID appends the event ID for cur to dst and returns the extended
// slice. The ID is opaque, visible ASCII (unpadded base64url), and at most 66
// bytes long. AppendID does not allocate when dst has room for the ID.
func (c *Codec) AppendID(dst []byte, cur Cursor) []byte {
	m := c.macs.Get().(*macState)
	n := encodeBody(&m.raw, cur)
	n += copy(m.raw[n:], m.mac(n))
	dst = b64.AppendEncode(dst, m.raw[:n])
	c.macs.Put(m)
	return dst
}

// ID returns the event ID for cur as a string.
func (c *Codec) ID(cur Cursor) string {
	var buf [maxInput]byte
	return string(c.AppendID(buf[:0], cur))
}

// Parse verifies and decodes an event ID. It returns an error wrapping
// ErrMalformed if id is not something this codec could have minted (length,
// alphabet, version, varints, trailing bytes), or ErrForged if id is well
// formed but its MAC does not verify under this codec's secret (compared in
// constant time). Parse never panics.
func (c *Codec) Parse(id string) (Cursor, error) {
	if len(id) > maxInput {
		return Cursor{}, fmt.Errorf("%w: %d bytes", ErrMalformed, len(id))
	}
	// Copy into a stack buffer, checking the alphabet: the base64 decoder
	// would otherwise skip '\r' and '\n', and two IDs would share one cursor.
	var text [maxInput]byte
	for i := 0; i < len(id); i++ {
		if !isB64URL(id[i]) {
			return Cursor{}, fmt.Errorf("%w: byte %#x at offset %d", ErrMalformed, id[i], i)
		}
		text[i] = id[i]
	}
	var raw [maxInput]byte // decoded length ≤ 3/4 of the input
	n, err := b64.Decode(raw[:], text[:len(id)])
	if err != nil {
		return Cursor{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	cur, bodyLen, err := decodeBody(raw[:n])
	if err != nil {
		return Cursor{}, err
	}
	m := c.macs.Get().(*macState)
	copy(m.raw[:], raw[:bodyLen])
	ok := hmac.Equal(m.mac(bodyLen), raw[bodyLen:n])
	c.macs.Put(m)
	if !ok {
		return Cursor{}, ErrForged
	}
	return cur, nil
}

// encodeBody writes everything before the MAC into raw and returns its length.
func encodeBody(raw *[maxRawLen]byte, cur Cursor) int {
	raw[0] = version
	copy(raw[1:headerLen], cur.Stream[:])
	n := headerLen
	n += binary.PutUvarint(raw[n:], cur.Generation)
	n += binary.PutUvarint(raw[n:], cur.Seq)
	return n
}

// decodeBody parses raw (body and MAC) and returns the cursor and the length
// of the body, which is where the MAC starts.
func decodeBody(raw []byte) (Cursor, int, error) {
	if len(raw) < minRawLen || len(raw) > maxRawLen {
		return Cursor{}, 0, fmt.Errorf("%w: %d decoded bytes", ErrMalformed, len(raw))
	}
	if raw[0] != version {
		return Cursor{}, 0, fmt.Errorf("%w: version %d", ErrMalformed, raw[0])
	}
	var cur Cursor
	copy(cur.Stream[:], raw[1:headerLen])
	body := raw[:len(raw)-macLen]
	n := headerLen
	gen, k := uvarint(body[n:])
	if k <= 0 {
		return Cursor{}, 0, fmt.Errorf("%w: bad generation", ErrMalformed)
	}
	n += k
	seq, k := uvarint(body[n:])
	if k <= 0 {
		return Cursor{}, 0, fmt.Errorf("%w: bad sequence", ErrMalformed)
	}
	n += k
	if n != len(body) {
		return Cursor{}, 0, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(body)-n)
	}
	cur.Generation, cur.Seq = gen, seq
	return cur, n, nil
}

// uvarint is binary.Uvarint that also rejects non-minimal encodings (a
// trailing 0x00 continuation byte), so each value has exactly one encoding.
func uvarint(b []byte) (uint64, int) {
	v, n := binary.Uvarint(b)
	if n > 1 && b[n-1] == 0 {
		return 0, -n
	}
	return v, n
}

func isB64URL(ch byte) bool {
	return 'A' <= ch && ch <= 'Z' || 'a' <= ch && ch <= 'z' || '0' <= ch && ch <= '9' || ch == '-' || ch == '_'
}
