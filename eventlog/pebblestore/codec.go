package pebblestore

import (
	"encoding/binary"
	"encoding/json"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
)

// Key layout. One byte names the kind of record; every integer in a key is
// big-endian so that byte order is numeric order. Sessions and streams get
// a number at creation so that the keys below have a fixed width, one
// session's records are contiguous (DeleteSession is a few range deletions)
// and one stream's events are contiguous (Read is one SeekGE). A stream's
// immutable identity (its key and request ID, which the client chooses and
// may be large) is written once, apart from the counters every append
// rewrites.
const (
	kindMeta    = 'm' // "m" "version" → uvarint(formatVersion)
	kindSession = 'S' // "S" session ID → sessNum(8) | session fields
	kindEvent   = 'e' // "e" sessNum(8) streamNum(8) seq(8) → uvarint(len(type)) | type | data
	kindIdent   = 'i' // "i" sessNum(8) streamNum(8) → stream identity (see appendIdent), written once
	kindOrder   = 'o' // "o" sessNum(8) ord(8) → streamNum(8) | uvarint(n): a run of n events in append order
	kindStream  = 's' // "s" sessNum(8) streamNum(8) → stream counters (see appendStream)
)

// formatVersion is stored under the meta key. Open upgrades version 1
// (identity inside the stream record) and refuses any other.
const formatVersion = 2

var keyVersion = []byte{kindMeta, 'v', 'e', 'r', 's', 'i', 'o', 'n'}

// keyRun records how the last process used the store: runClean after a
// Close, else the sync policy it ran with (runAlways or runRelaxed). It is
// written with an fsync at Open and at Close.
var keyRun = []byte{kindMeta, 'r', 'u', 'n'}

// Values of keyRun.
const (
	runClean   byte = 0
	runAlways  byte = 1
	runRelaxed byte = 2
)

// Key lengths.
const (
	pairKeyLen  = 1 + 16
	eventKeyLen = 1 + 24
)

func sessionKey(dst []byte, id string) []byte {
	return append(append(dst, kindSession), id...)
}

// pairKey returns kind | a(8) | b(8), appended to dst.
func pairKey(dst []byte, kind byte, a, b uint64) []byte {
	dst = append(dst, kind)
	dst = binary.BigEndian.AppendUint64(dst, a)
	return binary.BigEndian.AppendUint64(dst, b)
}

// prefixKey returns kind | a(8), appended to dst: the start of session a's
// records of that kind. prefixKey(kind, a+1) is their end.
func prefixKey(dst []byte, kind byte, a uint64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, kind), a)
}

// eventKey returns the key of one event, appended to dst.
func eventKey(dst []byte, sess, stream, seq uint64) []byte {
	dst = pairKey(dst, kindEvent, sess, stream)
	return binary.BigEndian.AppendUint64(dst, seq)
}

func putEventKey(dst []byte, sess, stream, seq uint64) {
	dst[0] = kindEvent
	binary.BigEndian.PutUint64(dst[1:], sess)
	binary.BigEndian.PutUint64(dst[9:], stream)
	binary.BigEndian.PutUint64(dst[17:], seq)
}

func beUint64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

// eventValueLen is the length of an event's stored value.
func eventValueLen(e *eventlog.Event) int {
	return uvarintLen(uint64(len(e.Type))) + len(e.Type) + len(e.Data)
}

// putEventValue writes the stored value of e to dst, which has eventValueLen(e) bytes.
func putEventValue(dst []byte, e *eventlog.Event) {
	n := binary.PutUvarint(dst, uint64(len(e.Type)))
	n += copy(dst[n:], e.Type)
	copy(dst[n:], e.Data)
}

func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// eventDataLen returns len(Data) of a stored event value.
func eventDataLen(v []byte) int64 {
	n, w := binary.Uvarint(v)
	if w <= 0 || uint64(len(v)-w) < n {
		return 0
	}
	return int64(len(v) - w - int(n))
}

// decodeEvent decodes a stored event value. Data aliases v.
func decodeEvent(seq uint64, v []byte) (eventlog.Event, error) {
	n, w := binary.Uvarint(v)
	if w <= 0 || uint64(len(v)-w) < n {
		return eventlog.Event{}, ErrCorrupt
	}
	return eventlog.Event{Seq: seq, Type: internType(v[w : w+int(n)]), Data: v[w+int(n):]}, nil
}

// internType returns the event types the relay writes without allocating.
func internType(b []byte) string {
	switch string(b) {
	case "":
		return ""
	case "reset":
		return "reset"
	case "message":
		return "message"
	}
	return string(b)
}

// appendBytes appends a length-prefixed byte string. With nilable, nil and
// empty are told apart (0 means nil, n+1 means n bytes).
func appendBytes(dst, b []byte, nilable bool) []byte {
	n := uint64(len(b))
	if nilable {
		if b == nil {
			return binary.AppendUvarint(dst, 0)
		}
		n++
	}
	dst = binary.AppendUvarint(dst, n)
	return append(dst, b...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// decoder reads what the append functions wrote. The first failure sticks;
// byte strings are copied out, so results outlive the value they came from.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() { d.err, d.b = ErrCorrupt, nil }

func (d *decoder) uint64() uint64 {
	if len(d.b) < 8 {
		d.fail()
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

// raw returns the next n bytes without copying.
func (d *decoder) raw(n uint64) []byte {
	if uint64(len(d.b)) < n {
		d.fail()
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.raw(d.uvarint())) }

func (d *decoder) bytes(nilable bool) []byte {
	n := d.uvarint()
	if nilable {
		if n == 0 || d.err != nil {
			return nil
		}
		n--
	}
	return append([]byte{}, d.raw(n)...)
}

// encodeSession returns sessNum(8) | fields of s. The session ID is in the key.
func encodeSession(num uint64, s *eventlog.Session) []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 128+len(s.InitializeParams)), num)
	b = appendString(b, s.Principal)
	b = appendString(b, s.ProtocolVersion)
	b = appendBytes(b, s.InitializeParams, true)
	b = binary.AppendUvarint(b, s.Incarnation)
	b = appendString(b, s.Upstream)
	if s.Replay == nil {
		b = binary.AppendUvarint(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(s.Replay))+1)
		for _, r := range s.Replay {
			b = appendBytes(b, r, true)
		}
	}
	created, err := s.Created.MarshalBinary()
	if err != nil { // a zone offset with seconds: keep the instant
		created, _ = s.Created.UTC().MarshalBinary()
	}
	b = appendBytes(b, created, false)
	if s.LastUsed.IsZero() && !s.Listening {
		return b // records written before LastUsed existed end here too
	}
	used, err := s.LastUsed.MarshalBinary()
	if err != nil {
		used, _ = s.LastUsed.UTC().MarshalBinary()
	}
	b = appendBytes(b, used, false)
	if !s.Listening {
		return b // records written before flags existed end here too
	}
	return binary.AppendUvarint(b, flagListening)
}

// flagListening is bit 0 of a session record's flags (after LastUsed).
const flagListening = 1

// decodeSession decodes a value written by encodeSession.
func decodeSession(id string, v []byte) (num uint64, s *eventlog.Session, err error) {
	d := decoder{b: v}
	num = d.uint64()
	s = &eventlog.Session{ID: id}
	s.Principal = d.string()
	s.ProtocolVersion = d.string()
	s.InitializeParams = d.bytes(true)
	s.Incarnation = d.uvarint()
	s.Upstream = d.string()
	if n := d.uvarint(); n > 0 && d.err == nil {
		if n-1 > uint64(len(d.b)) {
			return 0, nil, ErrCorrupt
		}
		s.Replay = make([]json.RawMessage, n-1)
		for i := range s.Replay {
			s.Replay[i] = d.bytes(true)
		}
	}
	created := d.raw(d.uvarint())
	if d.err == nil {
		if err := s.Created.UnmarshalBinary(created); err != nil {
			return 0, nil, ErrCorrupt
		}
	}
	if d.err == nil && len(d.b) > 0 {
		if err := s.LastUsed.UnmarshalBinary(d.raw(d.uvarint())); err != nil || d.err != nil {
			return 0, nil, ErrCorrupt
		}
	}
	if d.err == nil && len(d.b) > 0 {
		s.Listening = d.uvarint()&flagListening != 0
	}
	if d.err != nil {
		return 0, nil, d.err
	}
	return num, s, nil
}

// streamRecord is a stream's stored state: the eventlog record plus what
// the store needs to rebuild its state at Open. Its identity (key,
// generation, request ID) is stored under "i" sessNum streamNum, once; its
// counters under "s" sessNum streamNum, rewritten by every write.
type streamRecord struct {
	num        uint64
	sessNum    uint64
	rec        eventlog.Stream
	terminalAt int64 // unix nanoseconds of the terminal append; 0 if not terminal
	bytes      int64 // sum of len(Data) of retained events
	holes      []hole
}

// hole is a range of seqs [from, to) that the stream skipped after a crash
// because they may have been handed out before it; no event has them.
// Holes are ascending, each lies within [FirstSeq, LastSeq] with retained
// events on both sides, and a slice of holes is never modified in place
// (readers hold published copies).
type hole struct{ from, to uint64 }

// holeLen is the number of seqs in holes.
func holeLen(holes []hole) uint64 {
	var n uint64
	for _, h := range holes {
		n += h.to - h.from
	}
	return n
}

// nextSeq returns the seq of the event after seq, skipping a hole.
func (r *streamRecord) nextSeq(seq uint64) uint64 {
	seq++
	for _, h := range r.holes {
		if seq == h.from {
			return h.to
		}
	}
	return seq
}

// appendIdent appends the stored identity of r.
func appendIdent(dst []byte, r *streamRecord) []byte {
	dst = binary.AppendUvarint(dst, r.rec.Generation)
	dst = appendString(dst, r.rec.Key)
	return appendBytes(dst, r.rec.RequestID, true)
}

// decodeIdent decodes a value written by appendIdent into r.
func decodeIdent(v []byte, r *streamRecord) error {
	d := decoder{b: v}
	r.rec.Generation = d.uvarint()
	r.rec.Key = d.string()
	r.rec.RequestID = d.bytes(true)
	return d.err
}

// appendStream appends the stored counters of r.
func appendStream(dst []byte, r *streamRecord) []byte {
	dst = binary.AppendUvarint(dst, r.rec.FirstSeq)
	dst = binary.AppendUvarint(dst, r.rec.LastSeq)
	var flags byte
	if r.rec.Terminal {
		flags |= 1
	}
	dst = append(dst, flags)
	dst = binary.AppendVarint(dst, r.terminalAt)
	dst = binary.AppendUvarint(dst, uint64(r.bytes))
	dst = binary.AppendUvarint(dst, uint64(len(r.holes)))
	for _, h := range r.holes {
		dst = binary.AppendUvarint(dst, h.from)
		dst = binary.AppendUvarint(dst, h.to-h.from)
	}
	return dst
}

// decodeStream decodes a value written by appendStream into r.
func decodeStream(v []byte, r *streamRecord) error {
	d := decoder{b: v}
	r.rec.FirstSeq = d.uvarint()
	r.rec.LastSeq = d.uvarint()
	r.rec.Terminal = d.byte()&1 != 0
	r.terminalAt = d.varint()
	r.bytes = int64(d.uvarint())
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		return ErrCorrupt
	}
	r.holes = nil
	for range n {
		from := d.uvarint()
		r.holes = append(r.holes, hole{from, from + d.uvarint()})
	}
	return d.err
}

// decodeStreamV1 decodes a format 1 stream record, which held the identity
// too: generation, FirstSeq, LastSeq, flags, terminal time, bytes, key,
// request ID.
func decodeStreamV1(v []byte) (streamRecord, error) {
	d := decoder{b: v}
	var r streamRecord
	r.rec.Generation = d.uvarint()
	r.rec.FirstSeq = d.uvarint()
	r.rec.LastSeq = d.uvarint()
	r.rec.Terminal = d.byte()&1 != 0
	r.terminalAt = d.varint()
	r.bytes = int64(d.uvarint())
	r.rec.Key = d.string()
	r.rec.RequestID = d.bytes(true)
	return r, d.err
}

// expired reports whether a terminal stream's grace has passed at now.
func expired(terminal bool, terminalAt int64, now time.Time, grace time.Duration) bool {
	return terminal && now.UnixNano()-terminalAt >= int64(grace)
}
