package backend

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mcprelay/mcprelay/internal/wire"
	"github.com/mcprelay/mcprelay/sse"
)

var errReplyClosed = errors.New("backend: reply closed")

// maxResumes bounds the attempts to resume a broken backend stream in a
// row; a server-initiated close (polling) does not count.
const maxResumes = 5

// httpReply reads one POST's answer: a JSON body, or an SSE stream that it
// resumes with GET and Last-Event-ID when it breaks before the caller has
// what it waits for.
type httpReply struct {
	ctx    context.Context
	cancel context.CancelFunc
	s      *httpSession
	orig   []idPair // the connector's ids and the client's, for requests not answered yet
	// Room for orig, ownIDs and keys of a call of one request: no
	// allocation of their own.
	oneOrig [1]idPair
	oneOwn  [1]string
	oneKey  [1]string
	keys    []string      // the client ids' match keys, in the session's map of calls in flight
	ownIDs  []string      // the connector's ids of the call's requests
	body    io.ReadCloser // nil between a broken stream and its resumption
	sc      *sse.Scanner  // nil for a JSON body
	jsonEnd bool          // the JSON body was read
	mem     bool          // body is an in-process handler's whole answer (TryNext reads it)
	ended   bool          // TryNext read the end of body; endErr is what read returned
	endErr  error
	cursor  string        // the backend's last event ID, kept across failed resumes
	retry   time.Duration // the backend's last retry field
	attempt int           // resumes tried in a row

	mu     sync.Mutex // guards current and closed: Close comes from another goroutine
	closed bool
	cur    io.Closer
}

func (r *httpReply) open(resp *http.Response) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		resp.Body.Close()
		r.body = http.NoBody
		r.sc, r.jsonEnd = nil, true
		return
	}
	r.cur = resp.Body
	r.mu.Unlock()
	r.body = resp.Body
	r.mem = inMemory(resp.Body)
	r.sc, r.jsonEnd = nil, false
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct == "text/event-stream" {
		r.sc = sse.NewScanner(resp.Body)
		r.sc.MaxEventBytes = MaxMessageBytes
		r.sc.SkipEventIDs = true // the cursor is read once the body ends (endBody)
	}
}

// read returns the next message of the current body; nil at its end.
func (r *httpReply) read() ([]byte, error) {
	if r.sc == nil {
		if r.jsonEnd {
			return nil, nil
		}
		r.jsonEnd = true
		data, err := readAll(r.body, MaxMessageBytes+1)
		switch {
		case err != nil:
			return nil, err
		case len(data) > MaxMessageBytes:
			return nil, ErrMessageTooLarge
		case len(bytes.TrimSpace(data)) == 0:
			return nil, nil
		}
		return data, nil
	}
	for {
		ev, err := r.sc.Next()
		if ev.Retry > 0 {
			r.retry = ev.Retry
		}
		if err != nil {
			switch {
			case errors.Is(err, io.EOF):
				return nil, nil
			case errors.Is(err, sse.ErrTooLarge):
				return nil, ErrMessageTooLarge
			}
			return nil, err
		}
		if len(ev.Data) == 0 || (ev.Type != "" && ev.Type != "message") {
			continue
		}
		return ev.Data, nil
	}
}

// Next returns the next message of the call. When the backend's stream
// ends or breaks while the caller still asks for more, it resumes the
// stream from the backend's last event ID; a stream without event IDs
// cannot be resumed and the call is lost.
func (r *httpReply) Next() ([]byte, error) {
	if err := r.ctx.Err(); err != nil {
		r.Close()
		return nil, err // abandoned: whatever the backend still sends is not for the caller
	}
	for {
		if r.body == nil {
			if err := r.resume(); err != nil {
				return nil, err
			}
			continue
		}
		if len(r.orig) == 0 {
			// Every request of the call is answered: the backend has
			// nothing more for it.
			r.Close()
			return nil, io.EOF
		}
		var data []byte
		var err error
		if r.ended {
			r.ended, err = false, r.endErr
		} else {
			data, err = r.read()
		}
		if data != nil {
			return r.restoreIDs(data), nil
		}
		r.endBody()
		r.mu.Lock()
		closed := r.closed
		r.mu.Unlock()
		switch {
		case closed:
			return nil, errReplyClosed
		case r.ctx.Err() != nil:
			return nil, r.ctx.Err()
		case errors.Is(err, ErrMessageTooLarge):
			return nil, err
		case r.cursor == "":
			// Nothing to resume from: the response can no longer come.
			// The session itself may be gone; a ping tells.
			go func() {
				if r.s.confirmLost(context.Background()) {
					r.s.sessionLost()
				}
			}()
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("backend: stream ended before the response: %w", err)
		case err == nil && r.retry > 0:
			// A server-initiated close (polling): the caller carries it
			// to its client; the next call resumes.
			return nil, &Poll{Retry: r.retry}
		}
	}
}

// endBody closes the current body, keeping the last event ID it carried
// (if any) as the cursor to resume from.
func (r *httpReply) endBody() {
	if r.sc != nil {
		if id := r.sc.LastEventID(); id != "" {
			r.cursor = id
		}
	}
	r.body.Close()
	r.body = nil
}

// TryNext returns the next message when the body is an in-process
// handler's whole answer ([Buffered]); at its end, Next says what the end
// means.
func (r *httpReply) TryNext() ([]byte, bool) {
	if !r.mem || r.body == nil || r.ended || len(r.orig) == 0 || r.ctx.Err() != nil {
		return nil, false
	}
	data, err := r.read()
	if data == nil {
		r.ended, r.endErr = true, err
		return nil, false
	}
	return r.restoreIDs(data), true
}

// resume waits, then opens the backend's stream again from r.cursor.
func (r *httpReply) resume() error {
	if r.attempt >= maxResumes {
		return fmt.Errorf("backend: stream broke; %d resumes failed", r.attempt)
	}
	r.attempt++
	wait := r.retry
	if wait <= 0 {
		wait = time.Duration(r.attempt) * 100 * time.Millisecond
	}
	t := time.NewTimer(min(wait, 10*time.Second))
	defer t.Stop()
	select {
	case <-r.ctx.Done():
		return r.ctx.Err()
	case <-t.C:
	}
	resp, err := r.s.do(r.ctx, http.MethodGet, nil, r.cursor)
	if err != nil {
		return nil // counted; tried again
	}
	r.s.log.Debug("resuming the backend's request stream", "cursor", r.cursor, "status", resp.StatusCode)
	switch resp.StatusCode {
	case http.StatusOK:
		r.open(resp)
		if r.retry > 0 {
			r.attempt = 0 // polling is not failure
		}
		return nil
	case http.StatusNotFound:
		resp.Body.Close()
		return ErrSessionLost
	}
	resp.Body.Close()
	return nil
}

// restoreIDs puts the client's ids back into the responses data holds,
// and notes which requests are answered.
func (r *httpReply) restoreIDs(data []byte) []byte {
	if id, hasMethod, ok := wire.Route(data); ok {
		// One message, read up to its method (the relay validates what
		// it logs): only a response's id is the connector's own.
		if hasMethod || len(id) == 0 {
			return data
		}
		own := string(wire.IDKey(id))
		if client, ok := r.answer(own); ok {
			if out, ok := wire.ReplaceID(data, client); ok {
				return out
			}
		}
		return data
	}
	ids := wire.ResponseIDs(data, nil)
	if len(ids) == 0 {
		return data
	}
	swap := func(m []byte) []byte {
		for _, id := range wire.ResponseIDs(m, nil) {
			if client, ok := r.answer(string(id)); ok {
				m, _ = wire.ReplaceID(m, client)
			}
		}
		return m
	}
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '[' {
		var batch []json.RawMessage
		if json.Unmarshal(t, &batch) != nil {
			return data
		}
		for i := range batch {
			batch[i] = swap(batch[i])
		}
		out, err := json.Marshal(batch)
		if err != nil {
			return data
		}
		return out
	}
	return swap(data)
}

// idPair is a request's id as the backend saw it (the connector's own) and
// as the client sent it.
type idPair struct {
	own    string
	client json.RawMessage
}

// answer returns the client's id of the request the connector's id own
// names, and forgets it: that request is answered.
func (r *httpReply) answer(own string) (json.RawMessage, bool) {
	for i, p := range r.orig {
		if p.own == own {
			r.orig = slices.Delete(r.orig, i, i+1)
			return p.client, true
		}
	}
	return nil, false
}

// Close abandons the reply; a Next blocked on the backend returns.
func (r *httpReply) Close() error {
	r.mu.Lock()
	r.closed = true
	var err error
	if r.cur != nil {
		err = r.cur.Close()
	}
	r.mu.Unlock()
	r.finish()
	return err
}

// finish forgets the reply in its session and releases its request.
func (r *httpReply) finish() {
	r.s.mu.Lock()
	delete(r.s.calls, r)
	for _, k := range r.keys {
		if own, ok := r.s.inflightIDs[k]; ok && r.owns(own) {
			delete(r.s.inflightIDs, k)
		}
	}
	for _, own := range r.ownIDs {
		delete(r.s.clientIDs, own)
	}
	r.s.mu.Unlock()
	if r.cancel != nil {
		r.cancel()
	}
}

// owns reports whether own is one of the ids this reply's requests went
// under.
func (r *httpReply) owns(own string) bool {
	return strings.HasPrefix(own, `"mcprelay-`) && slices.Contains(r.ownIDs, own)
}
