package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
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

// CodeRequestLost is the JSON-RPC error code of the response the relay
// writes, under the original request id, for a request whose response can
// no longer come (its backend session was lost). Standard clients then fail
// the call instead of waiting forever.
const CodeRequestLost = -32001

// CodeRequestCancelled is the code of the response the relay writes for a
// request the client cancelled and the server then left unanswered, so that
// a resume of its stream ends instead of hanging.
const CodeRequestCancelled = -32800

// errorResponse returns a JSON-RPC error response for id.
func errorResponse(id json.RawMessage, code int, msg, reason string) []byte {
	b := make([]byte, 0, 160)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, id...)
	b = append(b, `,"error":{"code":`...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, `,"message":`...)
	b = strconv.AppendQuote(b, msg)
	if reason != "" {
		b = append(b, `,"data":{"reason":`...)
		b = strconv.AppendQuote(b, reason)
		b = append(b, '}')
	}
	return append(b, "}}"...)
}

// resetData is the payload of the relay's "reset" SSE event (DESIGN.md §3).
type resetData struct {
	Reason     string            `json:"reason"`
	Stream     string            `json:"stream"`
	Generation uint64            `json:"generation"`
	Lost       []json.RawMessage `json:"lost,omitempty"`
}

// Reset reasons.
const (
	ReasonUnknownStream     = "unknown_stream"
	ReasonGenerationChanged = "generation_changed"
	ReasonGap               = "gap"
	ReasonBackendLost       = "backend_lost"
)

func (d resetData) marshal() []byte {
	b, _ := json.Marshal(d)
	return b
}
