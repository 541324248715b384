package resume

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef") // 32 bytes

func newTestCodec(t testing.TB, secret []byte) *Codec {
	t.Helper()
	c, err := NewCodec(secret)
	if err != nil {
		t.Fatalf("NewCodec: %v", err)
	}
	return c
}

// sign returns the ID for an arbitrary body (everything before the MAC),
// MACed with c's secret: it lets tests reach the structural checks behind a
// valid MAC.
func sign(c *Codec, body []byte) string {
	m := c.macs.Get().(*macState)
	defer c.macs.Put(m)
	n := copy(m.raw[:], body)
	if n != len(body) {
		panic("sign: body too long")
	}
	return base64.RawURLEncoding.EncodeToString(append(append([]byte(nil), body...), m.mac(n)...))
}

// testCursors returns edge-value cursors followed by n random ones.
func testCursors(n int) []Cursor {
	r := rand.New(rand.NewPCG(1, 2))
	curs := []Cursor{
		{},
		{Generation: 1, Seq: 0},
		{Generation: 1, Seq: 1},
		{Generation: 127, Seq: 128},
		{Generation: math.MaxUint64, Seq: math.MaxUint64},
		{Stream: StreamKey{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, Generation: 1 << 63, Seq: 1<<63 - 1},
	}
	for range n {
		var c Cursor
		for i := range c.Stream {
			c.Stream[i] = byte(r.Uint32())
		}
		// Spread over all varint lengths, not just the 10-byte ones.
		c.Generation = r.Uint64() >> r.UintN(64)
		c.Seq = r.Uint64() >> r.UintN(64)
		curs = append(curs, c)
	}
	return curs
}

func isVisibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func TestNewCodec(t *testing.T) {
	tests := []struct {
		name    string
		secret  []byte
		wantErr error
	}{
		{name: "nil", secret: nil, wantErr: ErrWeakSecret},
		{name: "31 bytes", secret: make([]byte, 31), wantErr: ErrWeakSecret},
		{name: "32 bytes", secret: make([]byte, 32)},
		{name: "64 bytes", secret: bytes.Repeat([]byte{7}, 64)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewCodec(tt.secret)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("NewCodec error = %v, want %v", err, tt.wantErr)
			}
			if (c == nil) == (tt.wantErr == nil) {
				t.Fatalf("NewCodec codec = %v with error %v", c, err)
			}
		})
	}
}

func TestCodecCopiesSecret(t *testing.T) {
	secret := bytes.Clone(testSecret)
	c := newTestCodec(t, secret)
	cur := Cursor{Generation: 1, Seq: 3}
	id := c.ID(cur)
	secret[0] ^= 1
	if got, err := c.Parse(id); err != nil || got != cur {
		t.Fatalf("after mutating the caller's secret: Parse = %v, %v; want %v, nil", got, err, cur)
	}
}

func TestRoundTrip(t *testing.T) {
	c := newTestCodec(t, testSecret)
	for _, cur := range testCursors(2000) {
		id := c.ID(cur)
		if !isVisibleASCII(id) {
			t.Fatalf("ID(%+v) = %q: not visible ASCII", cur, id)
		}
		if len(id) > 66 {
			t.Fatalf("ID(%+v) has %d bytes, want ≤ 66", cur, len(id))
		}
		got, err := c.Parse(id)
		if err != nil {
			t.Fatalf("Parse(ID(%+v)) error: %v", cur, err)
		}
		if got != cur {
			t.Fatalf("Parse(ID(%+v)) = %+v", cur, got)
		}
		prefix := []byte("id: ")
		if app := c.AppendID(prefix, cur); string(app) != "id: "+id {
			t.Fatalf("AppendID(%q, %+v) = %q, want %q", prefix, cur, app, "id: "+id)
		}
	}
}

func TestIDsAreDistinct(t *testing.T) {
	c := newTestCodec(t, testSecret)
	seen := map[string]Cursor{}
	key := NewStreamKey()
	for gen := uint64(1); gen <= 3; gen++ {
		for seq := uint64(0); seq < 300; seq++ {
			cur := Cursor{Stream: key, Generation: gen, Seq: seq}
			id := c.ID(cur)
			if prev, dup := seen[id]; dup {
				t.Fatalf("ID %q minted for both %+v and %+v", id, prev, cur)
			}
			seen[id] = cur
		}
	}
}

func TestParseRejectsBitFlips(t *testing.T) {
	c := newTestCodec(t, testSecret)
	for _, cur := range testCursors(50) {
		raw, err := base64.RawURLEncoding.DecodeString(c.ID(cur))
		if err != nil {
			t.Fatal(err)
		}
		for bit := range len(raw) * 8 {
			flipped := bytes.Clone(raw)
			flipped[bit/8] ^= 1 << (bit % 8)
			id := base64.RawURLEncoding.EncodeToString(flipped)
			got, err := c.Parse(id)
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrForged) {
				t.Fatalf("%+v with bit %d flipped: Parse = %+v, %v; want ErrMalformed or ErrForged", cur, bit, got, err)
			}
		}
	}
}

func TestParseRejectsCharChanges(t *testing.T) {
	c := newTestCodec(t, testSecret)
	for _, cur := range testCursors(10) {
		id := c.ID(cur)
		for i := range len(id) {
			for ch := range 256 {
				if byte(ch) == id[i] {
					continue
				}
				changed := id[:i] + string([]byte{byte(ch)}) + id[i+1:]
				got, err := c.Parse(changed)
				if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrForged) {
					t.Fatalf("%q with offset %d changed to %#x: Parse = %+v, %v; want ErrMalformed or ErrForged", id, i, ch, got, err)
				}
			}
		}
	}
}

func TestParseErrors(t *testing.T) {
	c := newTestCodec(t, testSecret)
	valid := c.ID(Cursor{Stream: StreamKey{1, 2, 3}, Generation: 2, Seq: 9})
	key := make([]byte, keyLen)
	body := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	v := func(x uint64) []byte { return binary.AppendUvarint(nil, x) }

	tests := []struct {
		name string
		id   string
		want error
	}{
		{name: "empty", id: "", want: ErrMalformed},
		{name: "over 128 bytes", id: strings.Repeat("A", 129), want: ErrMalformed},
		{name: "128 bytes of base64", id: strings.Repeat("A", 128), want: ErrMalformed},
		{name: "too short", id: valid[:len(valid)-4], want: ErrMalformed},
		{name: "impossible length", id: valid[:len(valid)-1], want: ErrMalformed},
		{name: "padding", id: valid + "==", want: ErrMalformed},
		{name: "newline inside", id: valid[:10] + "\n" + valid[10:], want: ErrMalformed},
		{name: "carriage return at end", id: valid + "\r", want: ErrMalformed},
		{name: "space", id: " " + valid, want: ErrMalformed},
		{name: "standard alphabet", id: strings.Repeat("+/", 21), want: ErrMalformed},
		{name: "non-ASCII", id: "é" + valid[2:], want: ErrMalformed},
		{name: "wrong version, valid MAC", id: sign(c, body([]byte{3}, key, v(1), v(1))), want: ErrMalformed},
		{name: "version 2 with a version 1 MAC", id: sign(c, body([]byte{2}, key, v(1), v(1))), want: ErrForged},
		{name: "version 1 with a version 2 MAC", id: func() string {
			b, _ := base64.RawURLEncoding.DecodeString(c.ID(Cursor{Generation: 1, Seq: 1}))
			b[0] = 1
			return base64.RawURLEncoding.EncodeToString(b)
		}(), want: ErrForged},
		{name: "version 1 (before version 2), valid MAC", id: sign(c, body([]byte{1}, key, v(1), v(1))), want: nil},
		{name: "version 0, valid MAC", id: sign(c, body([]byte{0}, key, v(1), v(1))), want: ErrMalformed},
		{name: "non-minimal generation, valid MAC", id: sign(c, body([]byte{1}, key, []byte{0x81, 0x00}, v(1))), want: ErrMalformed},
		{name: "non-minimal seq, valid MAC", id: sign(c, body([]byte{1}, key, v(1), []byte{0x80, 0x80, 0x00})), want: ErrMalformed},
		{name: "varint overflow, valid MAC", id: sign(c, body([]byte{1}, key, bytes.Repeat([]byte{0xff}, 9), []byte{0x02}, v(1))), want: ErrMalformed},
		{name: "trailing byte, valid MAC", id: sign(c, body([]byte{1}, key, v(1), v(1), []byte{0})), want: ErrMalformed},
		{name: "missing seq, valid MAC", id: sign(c, body([]byte{1}, key, v(300))), want: ErrMalformed},
		{name: "unterminated seq, valid MAC", id: sign(c, body([]byte{1}, key, v(1), []byte{0x80})), want: ErrMalformed},
		{name: "MAC of another secret", id: newTestCodec(t, bytes.Repeat([]byte{9}, 32)).ID(Cursor{Generation: 1, Seq: 1}), want: ErrForged},
		{name: "zeroed MAC", id: base64.RawURLEncoding.EncodeToString(body([]byte{1}, key, v(1), v(1), make([]byte, macLen))), want: ErrForged},
		{name: "valid", id: valid, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.Parse(tt.id)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Parse(%q) error: %v", tt.id, err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Parse(%q) = %+v, %v; want %v", tt.id, got, err, tt.want)
			}
			if got != (Cursor{}) {
				t.Fatalf("Parse(%q) returned cursor %+v with error", tt.id, got)
			}
		})
	}
}

func TestCodecsSharingSecret(t *testing.T) {
	a := newTestCodec(t, testSecret)
	b := newTestCodec(t, bytes.Clone(testSecret))
	other := newTestCodec(t, bytes.Repeat([]byte{0xa5}, 48))
	for _, cur := range testCursors(100) {
		id := a.ID(cur)
		if got := b.ID(cur); got != id {
			t.Fatalf("replicas mint different IDs for %+v: %q and %q", cur, id, got)
		}
		if got, err := b.Parse(id); err != nil || got != cur {
			t.Fatalf("replica Parse(%q) = %+v, %v; want %+v", id, got, err, cur)
		}
		if got, err := other.Parse(id); !errors.Is(err, ErrForged) {
			t.Fatalf("Parse under a different secret = %+v, %v; want ErrForged", got, err)
		}
	}
}

func TestStreamKey(t *testing.T) {
	seen := map[StreamKey]bool{}
	for range 1000 {
		k := NewStreamKey()
		if seen[k] {
			t.Fatalf("NewStreamKey repeated %v", k)
		}
		seen[k] = true
		s := k.String()
		if len(s) != 22 || !isVisibleASCII(s) {
			t.Fatalf("String() = %q: want 22 visible ASCII characters", s)
		}
		raw, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil || !bytes.Equal(raw, k[:]) {
			t.Fatalf("String() = %q does not decode back to %x (%v)", s, k[:], err)
		}
	}
	if (StreamKey{}).String() != "AAAAAAAAAAAAAAAAAAAAAA" {
		t.Fatalf("zero key String() = %q", StreamKey{}.String())
	}
}

func TestAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	c := newTestCodec(t, testSecret)
	cur := Cursor{Stream: NewStreamKey(), Generation: 3, Seq: 1 << 40}
	dst := make([]byte, 0, 128)
	if n := testing.AllocsPerRun(100, func() { dst = c.AppendID(dst[:0], cur) }); n != 0 {
		t.Errorf("AppendID: %v allocs/op, want 0", n)
	}
	id := c.ID(cur)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := c.Parse(id); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Parse of a valid ID: %v allocs/op, want 0", n)
	}
}

func TestConcurrentUse(t *testing.T) {
	c := newTestCodec(t, testSecret)
	curs := testCursors(200)
	done := make(chan error)
	for w := range 8 {
		go func() {
			var buf []byte
			for i := range curs {
				cur := curs[(i+w*25)%len(curs)]
				buf = c.AppendID(buf[:0], cur)
				if got, err := c.Parse(string(buf)); err != nil || got != cur {
					done <- errors.New("concurrent round trip failed")
					return
				}
			}
			done <- nil
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func FuzzParse(f *testing.F) {
	c := newTestCodec(f, testSecret)
	for _, cur := range testCursors(5) {
		f.Add(c.ID(cur))
	}
	f.Add("")
	f.Add(strings.Repeat("A", 66))
	f.Add(strings.Repeat("_", 129))
	f.Add("AQ==")
	f.Fuzz(func(t *testing.T, id string) {
		cur, err := c.Parse(id)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrForged) {
				t.Fatalf("Parse(%q) error %v is neither ErrMalformed nor ErrForged", id, err)
			}
			return
		}
		if again := c.ID(cur); again != id {
			t.Fatalf("Parse(%q) accepted %+v, which encodes as %q", id, cur, again)
		}
	})
}

func BenchmarkAppendID(b *testing.B) {
	c := newTestCodec(b, testSecret)
	cur := Cursor{Stream: NewStreamKey(), Generation: 3, Seq: 1 << 20}
	dst := make([]byte, 0, 128)
	b.ReportAllocs()
	for b.Loop() {
		dst = c.AppendID(dst[:0], cur)
	}
}

func BenchmarkParse(b *testing.B) {
	c := newTestCodec(b, testSecret)
	id := c.ID(Cursor{Stream: NewStreamKey(), Generation: 3, Seq: 1 << 20})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Parse(id); err != nil {
			b.Fatal(err)
		}
	}
}

func TestParseStreamKey(t *testing.T) {
	for range 100 {
		k := NewStreamKey()
		got, err := ParseStreamKey(k.String())
		if err != nil || got != k {
			t.Fatalf("round trip of %s: %v %v", k, got, err)
		}
	}
	for _, bad := range []string{"", "short", "AAAAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAA!", "AAAAAAAAAAAAAAAAAAAAAB"} {
		if _, err := ParseStreamKey(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseStreamKey(%q) = %v, want ErrMalformed", bad, err)
		}
	}
}

// TestStreamIDs: a stream's minter mints what Codec.AppendID mints, for
// every sequence number, and its IDs parse back; each ID's MAC depends on
// the stream, the generation and the sequence number.
func TestStreamIDs(t *testing.T) {
	c := newTestCodec(t, testSecret)
	for _, cur := range testCursors(50) {
		s := c.Stream(cur.Stream, cur.Generation)
		if !s.Is(cur.Stream, cur.Generation) || s.Is(cur.Stream, cur.Generation+1) {
			t.Fatalf("Is is wrong for %+v", cur)
		}
		for _, seq := range []uint64{0, 1, cur.Seq, math.MaxUint64} {
			got := string(s.AppendID(nil, seq))
			want := c.ID(Cursor{Stream: cur.Stream, Generation: cur.Generation, Seq: seq})
			if got != want {
				t.Fatalf("Stream(%v, %d).AppendID(%d) = %s, Codec.ID %s", cur.Stream, cur.Generation, seq, got, want)
			}
			back, err := c.Parse(got)
			if err != nil || back != (Cursor{Stream: cur.Stream, Generation: cur.Generation, Seq: seq}) {
				t.Fatalf("Parse(%s) = %+v, %v", got, back, err)
			}
		}
	}
	// Moving the MAC of one cursor onto another never verifies.
	a := c.Stream(StreamKey{1}, 1)
	macOf := func(id string) []byte {
		b, _ := base64.RawURLEncoding.DecodeString(id)
		return b[len(b)-macLen:]
	}
	for _, other := range []Cursor{{Stream: StreamKey{2}, Generation: 1, Seq: 5}, {Stream: StreamKey{1}, Generation: 2, Seq: 5}, {Stream: StreamKey{1}, Generation: 1, Seq: 6}} {
		b, _ := base64.RawURLEncoding.DecodeString(c.ID(other))
		copy(b[len(b)-macLen:], macOf(string(a.AppendID(nil, 5))))
		if _, err := c.Parse(base64.RawURLEncoding.EncodeToString(b)); !errors.Is(err, ErrForged) {
			t.Fatalf("the MAC of stream {1} gen 1 seq 5 on %+v: %v, want ErrForged", other, err)
		}
	}
	buf := make([]byte, 0, 128)
	if n := testing.AllocsPerRun(100, func() { buf = a.AppendID(buf[:0], 7) }); n != 0 {
		t.Fatalf("StreamIDs.AppendID: %v allocs/op, want 0", n)
	}
}

func BenchmarkStreamAppendID(b *testing.B) {
	c := newTestCodec(b, testSecret)
	s := c.Stream(StreamKey{1, 2, 3}, 1)
	buf := make([]byte, 0, 128)
	b.ReportAllocs()
	for i := range b.N {
		buf = s.AppendID(buf[:0], uint64(i))
	}
}
