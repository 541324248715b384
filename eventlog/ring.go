package eventlog

// ring is a FIFO deque over a power-of-two circular buffer. The zero value is
// empty and holds no memory; the buffer grows by doubling and shrinks when a
// quarter full, and is released entirely when it empties.
type ring[T any] struct {
	buf  []T
	head int
	n    int
}

const ringMinCap = 4

func (r *ring[T]) len() int { return r.n }

// at returns a pointer to the i-th element from the front; 0 <= i < r.len().
func (r *ring[T]) at(i int) *T { return &r.buf[(r.head+i)&(len(r.buf)-1)] }

// back returns a pointer to the last element; r must not be empty.
func (r *ring[T]) back() *T { return r.at(r.n - 1) }

func (r *ring[T]) push(v T) {
	if r.n == len(r.buf) {
		r.resize(max(ringMinCap, 2*len(r.buf)))
	}
	*r.at(r.n) = v
	r.n++
}

// popFront removes and returns the first element; r must not be empty.
func (r *ring[T]) popFront() T {
	var zero T
	p := r.at(0)
	v := *p
	*p = zero // drop references for the GC
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	switch {
	case r.n == 0:
		*r = ring[T]{}
	case len(r.buf) > ringMinCap && r.n <= len(r.buf)/4:
		r.resize(len(r.buf) / 2)
	}
	return v
}

// appendTo appends the k elements starting at index i to dst; the caller
// guarantees 0 <= i and i+k <= r.len().
func (r *ring[T]) appendTo(dst []T, i, k int) []T {
	if k <= 0 {
		return dst
	}
	start := (r.head + i) & (len(r.buf) - 1)
	end := start + k
	if end <= len(r.buf) {
		return append(dst, r.buf[start:end]...)
	}
	dst = append(dst, r.buf[start:]...)
	return append(dst, r.buf[:end-len(r.buf)]...)
}

func (r *ring[T]) resize(c int) {
	nb := make([]T, c)
	if r.n > 0 {
		r.appendTo(nb[:0], 0, r.n)
	}
	r.buf, r.head = nb, 0
}
