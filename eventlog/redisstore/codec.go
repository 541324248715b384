package redisstore

import (
	"encoding/binary"
	"encoding/json"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
)

// recordVersion is the first byte of an encoded session record.
const recordVersion = 1

// encodeSession encodes every field of s but ID (which names the key) and
// Listening (kept beside the record: see listeningArg).
func encodeSession(s *eventlog.Session) []byte {
	b := make([]byte, 0, 64+len(s.Principal)+len(s.ProtocolVersion)+len(s.InitializeParams)+len(s.Upstream))
	b = append(b, recordVersion)
	b = appendBytes(b, []byte(s.Principal), false)
	b = appendBytes(b, []byte(s.ProtocolVersion), false)
	b = appendBytes(b, s.InitializeParams, true)
	b = binary.AppendUvarint(b, s.Incarnation)
	b = appendBytes(b, []byte(s.Upstream), false)
	if s.Replay == nil {
		b = binary.AppendUvarint(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(s.Replay))+1)
		for _, r := range s.Replay {
			b = appendBytes(b, r, true)
		}
	}
	t, _ := s.Created.MarshalBinary() // fails only for offsets that are not whole minutes
	b = appendBytes(b, t, false)
	if s.LastUsed.IsZero() {
		return b // records written before LastUsed existed end here too
	}
	u, _ := s.LastUsed.MarshalBinary()
	return appendBytes(b, u, false)
}

// decodeSession decodes a record made by encodeSession. The result shares no
// memory with b.
func decodeSession(id string, b []byte) (*eventlog.Session, error) {
	d := decoder{b: b}
	if d.byte() != recordVersion {
		return nil, ErrCorrupt
	}
	s := &eventlog.Session{ID: id}
	s.Principal = string(d.bytes(false))
	s.ProtocolVersion = string(d.bytes(false))
	s.InitializeParams = d.raw()
	s.Incarnation = d.uvarint()
	s.Upstream = string(d.bytes(false))
	if n := d.uvarint(); n > 0 && !d.bad {
		if n-1 > uint64(len(d.b)) {
			return nil, ErrCorrupt
		}
		s.Replay = make([]json.RawMessage, n-1)
		for i := range s.Replay {
			s.Replay[i] = d.raw()
		}
	}
	if t := d.bytes(false); !d.bad {
		if err := s.Created.UnmarshalBinary(t); err != nil {
			return nil, ErrCorrupt
		}
	}
	if !d.bad && len(d.b) > 0 {
		if u := d.bytes(false); !d.bad {
			if err := s.LastUsed.UnmarshalBinary(u); err != nil {
				return nil, ErrCorrupt
			}
		}
	}
	if d.bad || len(d.b) != 0 {
		return nil, ErrCorrupt
	}
	return s, nil
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
	return append(binary.AppendUvarint(dst, n), b...)
}

type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.bad = true
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

// bytes returns the next length-prefixed string, aliasing d.b; nil if
// nilable and encoded as nil.
func (d *decoder) bytes(nilable bool) []byte {
	n := d.uvarint()
	if d.bad {
		return nil
	}
	if nilable {
		if n == 0 {
			return nil
		}
		n--
	}
	if n > uint64(len(d.b)) {
		d.bad = true
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// raw returns a copy of the next nilable string as a RawMessage.
func (d *decoder) raw() json.RawMessage {
	v := d.bytes(true)
	if v == nil {
		return nil
	}
	return append(json.RawMessage{}, v...)
}

// timeMs converts a duration to whole milliseconds, at least 1.
func timeMs(d time.Duration) int64 { return max(d.Milliseconds(), 1) }
