package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/mcprelay/mcprelay/internal/wire"
	"github.com/mcprelay/mcprelay/resume"
)

// message is what the relay needs to know of one JSON-RPC message. The
// relay never rewrites messages; it only reads these fields to route them.
type message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

func (m *message) isRequest() bool { return m.Method != "" && len(m.ID) > 0 }

var errNotJSONRPC = errors.New("relay: body is not a JSON-RPC message or batch")

// parseMessages decodes a POST body or an upstream event: one message, or
// a batch (a JSON array, 2025-03-26 only).
func parseMessages(data []byte) (msgs []message, batch bool, err error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, false, errNotJSONRPC
	}
	if data[0] == '[' {
		if err := json.Unmarshal(data, &msgs); err != nil {
			return nil, true, errNotJSONRPC
		}
		if len(msgs) == 0 {
			return nil, true, errNotJSONRPC
		}
		batch = true
	} else {
		m, ok := readMessage(data)
		if !ok {
			if err := json.Unmarshal(data, &m); err != nil {
				return nil, false, errNotJSONRPC
			}
		}
		msgs = []message{m}
	}
	for i := range msgs {
		msgs[i].ID = wire.IDKey(msgs[i].ID)
		if msgs[i].Method == "" && len(msgs[i].ID) == 0 {
			return nil, batch, errNotJSONRPC
		}
		if err := checkID(msgs[i].ID); err != nil {
			return nil, batch, err
		}
	}
	return msgs, batch, nil
}

// readMessage reads one message as json.Unmarshal would, without decoding
// it: the fields are the raw bytes of data. ok is false when it cannot tell
// what json.Unmarshal would make of data (not valid JSON; a key that
// differs from a field's name only by case, which encoding/json matches; a
// method that is not a plain string): the caller decodes it then.
func readMessage(data []byte) (m message, ok bool) {
	if !json.Valid(data) {
		return message{}, false
	}
	plain := true
	ok = wire.Members(data, func(key []byte, start, end int) {
		v := data[start:end]
		switch string(key) {
		case "id":
			m.ID = v
		case "method":
			switch {
			case string(v) == "null":
				// json.Unmarshal leaves the string as it was (an earlier
				// "method" member's value)
			case v[0] == '"' && bytes.IndexByte(v, '\\') < 0 && utf8.Valid(v):
				m.Method = string(v[1 : len(v)-1])
			default:
				plain = false
			}
		case "params":
			m.Params = v
		default:
			if bytes.EqualFold(key, []byte("id")) || bytes.EqualFold(key, []byte("method")) || bytes.EqualFold(key, []byte("params")) {
				plain = false
			}
		}
	})
	if !ok || !plain {
		return message{}, false
	}
	return m, true
}

// maxIDBytes bounds a JSON-RPC id: the relay keeps ids with every stream
// and writes them into its errors.
const maxIDBytes = 400

var (
	errIDTooLong = fmt.Errorf("relay: JSON-RPC id longer than %d bytes", maxIDBytes)
	errIDType    = errors.New("relay: JSON-RPC id must be a string or a number")
	errIDUTF8    = errors.New("relay: JSON-RPC id is not valid UTF-8")
)

// checkID validates a request's id (nil: none).
func checkID(id json.RawMessage) error {
	switch {
	case len(id) == 0:
		return nil
	case len(id) > maxIDBytes:
		return errIDTooLong
	case id[0] == '"':
		if !utf8.Valid(id) {
			return errIDUTF8
		}
		var s string
		if bytes.IndexByte(id, '\\') >= 0 && json.Unmarshal(id, &s) != nil {
			return errIDUTF8 // an escape that is not valid UTF-8 (a lone surrogate)
		}
	case id[0] == '-' || id[0] >= '0' && id[0] <= '9':
	default:
		return errIDType
	}
	return nil
}

// errorResponse returns a JSON-RPC error response for id. reason, if set,
// goes in error.data.reason. The text is encoded as JSON (a backend's error
// text may hold control characters or invalid UTF-8).
func errorResponse(id json.RawMessage, code int, msg string, reason resume.Reason) []byte {
	type errData struct {
		Reason resume.Reason `json:"reason"`
	}
	type rpcError struct {
		Code    int      `json:"code"`
		Message string   `json:"message"`
		Data    *errData `json:"data,omitempty"`
	}
	type response struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	r := response{JSONRPC: "2.0", ID: id, Error: rpcError{Code: code, Message: msg}}
	if reason != "" {
		r.Error.Data = &errData{Reason: reason}
	}
	b, err := json.Marshal(r)
	if err != nil {
		// Only an id that is not JSON can fail; ids reach here parsed.
		r.ID = json.RawMessage("null")
		b, _ = json.Marshal(r)
	}
	return b
}
