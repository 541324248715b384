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

func (m *message) isRequest() bool      { return m.Method != "" && len(m.ID) > 0 }
func (m *message) isNotification() bool { return m.Method != "" && len(m.ID) == 0 }
func (m *message) isResponse() bool     { return m.Method == "" && len(m.ID) > 0 }

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
	var r route
	if json.Unmarshal(data, &r) != nil {
		return nil
	}
	if id := idKey(r.ID); r.Method == "" && len(id) > 0 {
		buf = append(buf, id)
	}
	return buf
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
