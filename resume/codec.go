package resume

import (
	"crypto/aes"
	"crypto/cipher"
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
	version1   = 1 // MAC: HMAC-SHA256 over the whole body (still parsed: IDs minted before v2)
	version    = 2 // MAC: AES over the stream's PRF and the seq (minted)
	minSecret  = 32
	keyLen     = 16
	macLen     = 12
	headerLen  = 1 + keyLen                                   // version | stream key
	minRawLen  = headerLen + 1 + 1 + macLen                   // two one-byte varints
	maxRawLen  = headerLen + 2*binary.MaxVarintLen64 + macLen // 49
	maxInput   = 128                                          // Parse rejects longer input before decoding
	domainText = "mcprelay-event-id-v1"
	// domainV2 prefixes the stream PRF's input; blockKeyText is what the
	// AES key is derived from. Neither is a prefix of the other or of
	// domainText's inputs.
	domainV2     = "mcprelay-event-id-v2"
	blockKeyText = "mcprelay-event-id-aes-key-v2"
)

// domainTag separates event-ID MACs from any other use of the relay secret;
// domainTagV2 the stream PRF's inputs.
var (
	domainTag   = []byte(domainText)
	domainTagV2 = []byte(domainV2)
)

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
//
// An ID's MAC (version 2) is AES-128, under a key derived from the secret,
// of one block: the stream's PRF (the first 8 bytes of HMAC-SHA256 of the
// stream key and generation) and the sequence number. The PRF is computed
// once per stream ([Codec.Stream]): each event's ID then costs one AES
// block, not an HMAC. A change to any of stream, generation or sequence
// changes the block, and the MAC of a block not seen is unpredictable
// without the key. Version 1 IDs (HMAC-SHA256 of the whole body) are still
// accepted.
type Codec struct {
	macs  sync.Pool    // of *macState, each keyed with the codec's secret
	block cipher.Block // AES-128 under blockKey
}

// macState is one pooled HMAC with scratch space, so that neither the payload
// nor the sum has to escape to the heap through the hash.Hash interface.
type macState struct {
	h   hash.Hash
	raw [maxRawLen]byte
	sum [sha256.Size]byte
	blk aesScratch
}

// aesScratch is where blockMAC works, kept with its owner so that nothing
// escapes to the heap through cipher.Block.
type aesScratch struct{ in, out [aes.BlockSize]byte }

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
	kh := hmac.New(sha256.New, key)
	kh.Write([]byte(blockKeyText))
	block, err := aes.NewCipher(kh.Sum(nil)[:16])
	if err != nil {
		return nil, err
	}
	c.block = block
	return c, nil
}

// StreamIDs mints the IDs of one stream generation's events; see
// [Codec.Stream]. The zero value is not usable. Not safe for concurrent
// use; copies are independent.
type StreamIDs struct {
	c    *Codec
	key  StreamKey
	gen  uint64
	prf  [8]byte
	head [headerLen + binary.MaxVarintLen64]byte // version | stream key | uvarint generation
	n    int                                     // length of head
	blk  aesScratch
	raw  [maxRawLen]byte
}

// Stream returns the minter of the IDs of stream key's events at
// generation gen: the stream's part of the MAC is computed here, once.
func (c *Codec) Stream(key StreamKey, gen uint64) StreamIDs {
	s := StreamIDs{c: c, key: key, gen: gen}
	s.n = putHead(s.head[:], key, gen)
	s.prf = c.streamPRF(key, gen)
	return s
}

// putHead writes version | stream key | uvarint gen into raw and returns
// its length.
func putHead(raw []byte, key StreamKey, gen uint64) int {
	raw[0] = version
	copy(raw[1:headerLen], key[:])
	return headerLen + binary.PutUvarint(raw[headerLen:], gen)
}

// appendID completes the ID whose head is raw[:n] with seq and its MAC
// (prf being the stream's), and appends it to dst.
func (c *Codec) appendID(dst, raw []byte, n int, b *aesScratch, prf [8]byte, seq uint64) []byte {
	n += binary.PutUvarint(raw[n:], seq)
	n += copy(raw[n:], c.blockMAC(b, prf, seq))
	return b64.AppendEncode(dst, raw[:n])
}

// Is reports whether s mints the IDs of key at gen.
func (s *StreamIDs) Is(key StreamKey, gen uint64) bool {
	return s.c != nil && s.key == key && s.gen == gen
}

// AppendID appends the ID of the event seq of s's stream to dst. It does
// not allocate when dst has room for the ID.
func (s *StreamIDs) AppendID(dst []byte, seq uint64) []byte {
	n := copy(s.raw[:], s.head[:s.n])
	return s.c.appendID(dst, s.raw[:], n, &s.blk, s.prf, seq)
}

// streamPRF is the first 8 bytes of HMAC-SHA256(domainV2 | key | uvarint
// gen).
func (c *Codec) streamPRF(key StreamKey, gen uint64) [8]byte {
	m := c.macs.Get().(*macState)
	n := copy(m.raw[:], key[:])
	n += binary.PutUvarint(m.raw[n:], gen)
	m.h.Reset()
	m.h.Write(domainTagV2)
	m.h.Write(m.raw[:n])
	sum := m.h.Sum(m.sum[:0])
	var prf [8]byte
	copy(prf[:], sum)
	c.macs.Put(m)
	return prf
}

// blockMAC is the MAC of version 2: AES(prf | big-endian seq), truncated.
func (c *Codec) blockMAC(b *aesScratch, prf [8]byte, seq uint64) []byte {
	copy(b.in[:8], prf[:])
	binary.BigEndian.PutUint64(b.in[8:], seq)
	c.block.Encrypt(b.out[:], b.in[:])
	return b.out[:macLen]
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
	prf := c.streamPRF(cur.Stream, cur.Generation)
	m := c.macs.Get().(*macState)
	n := putHead(m.raw[:], cur.Stream, cur.Generation)
	dst = c.appendID(dst, m.raw[:], n, &m.blk, prf, cur.Seq)
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
	var ok bool
	if raw[0] == version1 {
		m := c.macs.Get().(*macState)
		copy(m.raw[:], raw[:bodyLen])
		ok = hmac.Equal(m.mac(bodyLen), raw[bodyLen:n])
		c.macs.Put(m)
	} else {
		prf := c.streamPRF(cur.Stream, cur.Generation)
		m := c.macs.Get().(*macState)
		ok = hmac.Equal(c.blockMAC(&m.blk, prf, cur.Seq), raw[bodyLen:n])
		c.macs.Put(m)
	}
	if !ok {
		return Cursor{}, ErrForged
	}
	return cur, nil
}

// decodeBody parses raw (body and MAC) and returns the cursor and the length
// of the body, which is where the MAC starts.
func decodeBody(raw []byte) (Cursor, int, error) {
	if len(raw) < minRawLen || len(raw) > maxRawLen {
		return Cursor{}, 0, fmt.Errorf("%w: %d decoded bytes", ErrMalformed, len(raw))
	}
	if raw[0] != version && raw[0] != version1 {
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
