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
		var m message
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, false, errNotJSONRPC
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
		var s string
		if json.Unmarshal(id, &s) != nil || !utf8.Valid(id) {
			return errIDUTF8
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
