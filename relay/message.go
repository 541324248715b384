package relay

import (
	"bytes"
	"encoding/json"
	"errors"

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
		msgs[i].ID = idKey(msgs[i].ID)
		if msgs[i].Method == "" && len(msgs[i].ID) == 0 {
			return nil, batch, errNotJSONRPC
		}
	}
	return msgs, batch, nil
}

// route is the part of an upstream message the relay routes by. Decoding
// only these fields keeps params from being copied on the per-event path.
type route struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
}

// responseIDs returns the ids of the responses in an upstream payload (a
// message or a batch), appended to buf[:0]. It returns nil for anything
// else, including malformed payloads, which are relayed as they are.
//
// It runs once per relayed event, so a single message is read by
// scanRoute, which stops at the "method" key of a request or notification
// (nearly every event) without decoding the rest; only a response, once
// per request, is validated in full.
func responseIDs(data []byte, buf []json.RawMessage) []json.RawMessage {
	buf = buf[:0]
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '[' {
		var rs []route
		if json.Unmarshal(data, &rs) != nil {
			return nil
		}
		for _, r := range rs {
			if id := idKey(r.ID); r.Method == "" && len(id) > 0 {
				buf = append(buf, id)
			}
		}
		return buf
	}
	id, hasMethod, ok := scanRoute(data)
	if ok && hasMethod {
		return nil
	}
	if !ok {
		var r route
		if json.Unmarshal(data, &r) != nil || r.Method != "" {
			return nil
		}
		id = r.ID
	} else if !json.Valid(data) {
		return nil
	}
	if id := idKey(id); len(id) > 0 {
		buf = append(buf, id)
	}
	return buf
}

// scanRoute reads the top level of one JSON object for the raw "id" value
// and whether a non-empty "method" is present, stopping at that method.
// ok is false when the text is not an object it can read this way (then
// the caller decodes it properly).
func scanRoute(data []byte) (id []byte, hasMethod, ok bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil, false, false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return nil, false, true
	}
	for i < len(data) {
		if data[i] != '"' {
			return nil, false, false
		}
		end := skipString(data, i)
		if end < 0 {
			return nil, false, false
		}
		key := data[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return nil, false, false // an escaped key: leave it to encoding/json
		}
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return nil, false, false
		}
		i = skipSpace(data, i+1)
		start := i
		i = skipValue(data, i)
		if i < 0 {
			return nil, false, false
		}
		switch string(key) {
		case "id":
			id = data[start:i]
		case "method":
			if v := string(data[start:i]); v != `""` && v != "null" {
				return id, true, true
			}
		}
		i = skipSpace(data, i)
		if i >= len(data) {
			return nil, false, false
		}
		switch data[i] {
		case ',':
			i = skipSpace(data, i+1)
		case '}':
			return id, false, true
		default:
			return nil, false, false
		}
	}
	return nil, false, false
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at data[i] ('"'),
// or -1.
func skipString(data []byte, i int) int {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// skipValue returns the index after the JSON value starting at data[i], or
// -1. It checks only the structure it needs to find the end.
func skipValue(data []byte, i int) int {
	if i >= len(data) {
		return -1
	}
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				if j = skipString(data, j); j < 0 {
					return -1
				}
				j--
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(data) && !bytes.ContainsRune([]byte(",}] \t\r\n"), rune(data[j])) {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// idKey canonicalizes a JSON-RPC id so that ids can be compared as bytes.
// A JSON null id is treated as absent.
func idKey(id json.RawMessage) json.RawMessage {
	id = bytes.TrimSpace(id)
	if string(id) == "null" {
		return nil
	}
	return id
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
