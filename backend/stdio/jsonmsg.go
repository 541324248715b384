package stdio

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// message is what the connector reads of a JSON-RPC message to route it.
type message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

func (m *message) hasID() bool { return len(m.ID) > 0 && !bytes.Equal(m.ID, []byte("null")) }

// isResponse: a result or an error with an id (a response to a request).
func (m *message) isResponse() bool { return m.Method == "" && (m.Result != nil || m.Error != nil) }

// isRequest: a method with an id.
func (m *message) isRequest() bool { return m.Method != "" && m.hasID() }

// parse decodes the routing fields of one JSON-RPC message.
func parse(b []byte) (*message, error) {
	var m message
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if m.Method == "" && m.Result == nil && m.Error == nil {
		return nil, errors.New("neither a method nor a result nor an error")
	}
	return &m, nil
}

// progressToken returns params._meta.progressToken of a request (nil if it
// declares none) and params.progressToken of a progress notification.
func progressToken(params json.RawMessage, inMeta bool) json.RawMessage {
	if !bytes.Contains(params, []byte(`"progressToken"`)) { // cheap, and the common case
		return nil
	}
	var p struct {
		ProgressToken json.RawMessage `json:"progressToken"`
		Meta          struct {
			ProgressToken json.RawMessage `json:"progressToken"`
		} `json:"_meta"`
	}
	if len(params) == 0 || json.Unmarshal(params, &p) != nil {
		return nil
	}
	if inMeta {
		return nonNull(p.Meta.ProgressToken)
	}
	return nonNull(p.ProgressToken)
}

func nonNull(b json.RawMessage) json.RawMessage {
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return nil
	}
	return b
}

// idKey returns a comparison key for a JSON-RPC id or progress token, so
// that the same value spelled differently (1 and 1.0, "a" and "\u0061")
// compares equal: servers decode and re-encode what they echo.
func idKey(b json.RawMessage) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", false
	}
	switch v := v.(type) {
	case string:
		return "s" + v, true
	case json.Number:
		if f, err := strconv.ParseFloat(string(v), 64); err == nil {
			return "n" + strconv.FormatFloat(f, 'g', -1, 64), true
		}
		return "n" + string(v), true
	}
	return "", false
}

// setMember returns a copy of the JSON object obj with the value of its
// top-level member key replaced by val, every other byte unchanged, and the
// value it replaced. Nested objects are not searched.
func setMember(obj []byte, key string, val []byte) (out, old []byte, err error) {
	start, end, err := findMember(obj, key)
	if err != nil {
		return nil, nil, err
	}
	out = make([]byte, 0, len(obj)-(end-start)+len(val))
	out = append(out, obj[:start]...)
	out = append(out, val...)
	out = append(out, obj[end:]...)
	return out, obj[start:end], nil
}

// findMember returns the byte range of the value of top-level member key.
func findMember(obj []byte, key string) (start, end int, err error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	tok, err := dec.Token()
	if err != nil {
		return 0, 0, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return 0, 0, errors.New("not a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return 0, 0, err
		}
		k, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return 0, 0, err
		}
		if k == key {
			end := int(dec.InputOffset())
			return end - len(raw), end, nil
		}
	}
	return 0, 0, fmt.Errorf("no member %q", key)
}

// splitBatch returns the messages of msg: the elements of a batch, or msg.
func splitBatch(msg []byte) ([]json.RawMessage, error) {
	t := bytes.TrimLeft(msg, " \t\r\n")
	if len(t) > 0 && t[0] == '[' {
		var batch []json.RawMessage
		if err := json.Unmarshal(t, &batch); err != nil {
			return nil, err
		}
		if len(batch) == 0 {
			return nil, errors.New("empty batch")
		}
		return batch, nil
	}
	return []json.RawMessage{t}, nil // parse validates it
}

// compactLine appends msg without insignificant white space (so that it
// holds no newline) and a newline to dst.
func compactLine(dst *bytes.Buffer, msg []byte) error {
	if !bytes.ContainsAny(msg, "\r\n") { // a newline in JSON is white space, never inside a string
		dst.Write(msg)
		dst.WriteByte('\n')
		return nil
	}
	if err := json.Compact(dst, msg); err != nil {
		return err
	}
	dst.WriteByte('\n')
	return nil
}

var errLineTooLong = errors.New("line too long")

// lineReader reads newline-terminated lines of at most max bytes.
type lineReader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

// next returns the next line without its newline; errLineTooLong if it
// exceeds max bytes (the reader is then unusable), io.EOF at the end.
func (l *lineReader) next() ([]byte, error) {
	l.buf = l.buf[:0]
	for {
		frag, err := l.r.ReadSlice('\n')
		if len(l.buf)+len(frag) > l.max+1 {
			return nil, errLineTooLong
		}
		l.buf = append(l.buf, frag...)
		switch {
		case err == nil:
			return bytes.TrimRight(l.buf, "\r\n"), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(l.buf) > 0:
			return l.buf, nil
		default:
			return nil, err
		}
	}
}
