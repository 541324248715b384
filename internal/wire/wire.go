// Package wire reads what the relay and its connectors need of JSON-RPC
// messages on the per-event path, without decoding them whole: the ids of
// the responses a message holds, ids compared by their JSON value, and an
// id replaced in place.
package wire

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
)

// MatchKey is the key under which a JSON-RPC id is matched: two ids match
// when their JSON values are equal (1, 1.0 and 1e0 are one number; "a" and
// "\u0061" one string), as peers that decode and re-encode ids see them.
// The relay still writes ids back byte for byte as the client sent them.
func MatchKey(id json.RawMessage) string {
	if len(id) == 0 {
		return ""
	}
	if id[0] == '"' {
		if bytes.IndexByte(id, '\\') < 0 {
			return string(id)
		}
		var s string
		if json.Unmarshal(id, &s) != nil {
			return string(id)
		}
		return `"` + s + `"`
	}
	if bytes.IndexAny(id, ".eE") < 0 {
		// An integer literal: JSON allows no leading zeros, so it is
		// canonical already but for minus zero.
		if string(id) == "-0" {
			return "0"
		}
		return string(id)
	}
	f, err := strconv.ParseFloat(string(id), 64)
	switch {
	case err != nil:
		return string(id)
	case f == 0:
		return "0"
	case f == math.Trunc(f) && math.Abs(f) < 1<<53:
		return strconv.FormatInt(int64(f), 10)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// route is the part of an upstream message the relay routes by. Decoding
// only these fields keeps params from being copied on the per-event path.
type route struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
}

// ResponseIDs returns the ids of the responses in an upstream payload (a
// message or a batch), appended to buf[:0]. It returns nil for anything
// else, including malformed payloads, which are relayed as they are.
//
// It runs once per relayed event, so a single message is read by
// scanRoute, which stops at the "method" key of a request or notification
// (nearly every event) without decoding the rest; only a response, once
// per request, is validated in full.
func ResponseIDs(data []byte, buf []json.RawMessage) []json.RawMessage {
	buf = buf[:0]
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '[' {
		var rs []route
		if json.Unmarshal(data, &rs) != nil {
			return nil
		}
		for _, r := range rs {
			if id := IDKey(r.ID); r.Method == "" && len(id) > 0 {
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
	if id := IDKey(id); len(id) > 0 {
		buf = append(buf, id)
	}
	return buf
}

// Route reads the top level of one JSON object, without validating it, for
// its raw "id" and whether it has a method, stopping at the method (nearly
// every message a stream carries is a notification, read no further). ok
// is false when it cannot read data that way (a batch, an escaped key).
func Route(data []byte) (id []byte, hasMethod, ok bool) { return scanRoute(data) }

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
		if string(key) == "method" && i+1 < len(data) && data[i] == '"' && data[i+1] != '"' {
			// A non-empty string: a request or a notification, all the
			// caller asks. Not reading the method name to its end is what
			// makes a notification cheap (nearly every event).
			return id, true, true
		}
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

// IDKey canonicalizes a JSON-RPC id so that ids can be compared as bytes.
// A JSON null id is treated as absent.
func IDKey(id json.RawMessage) json.RawMessage {
	id = bytes.TrimSpace(id)
	if string(id) == "null" {
		return nil
	}
	return id
}

// ReplaceID returns msg, one JSON-RPC message (an object), with its
// top-level "id" value replaced by id, every other byte kept; ok is false
// if msg has no id it can find that way.
func ReplaceID(msg []byte, id []byte) (out []byte, ok bool) {
	h, ok := ReadHead(msg)
	if !ok || !h.HasID() {
		return msg, false
	}
	return h.ReplaceID(msg, id), true
}

// Head is where a JSON-RPC message's top-level id lies, and whether it has
// a method: what a connector needs to give a request an id of its own.
type Head struct {
	idStart, idEnd int
	// Method: a "method" member other than "" or null (a request or a
	// notification, not a response).
	Method bool
}

// HasID reports whether the message has an "id" member.
func (h Head) HasID() bool { return h.idEnd > 0 }

// ID returns the id's raw value (nil if none) in msg, the message h was
// read from.
func (h Head) ID(msg []byte) json.RawMessage {
	if !h.HasID() {
		return nil
	}
	return msg[h.idStart:h.idEnd]
}

// ReplaceID returns a copy of msg, the message h was read from, with its
// id value replaced by id.
func (h Head) ReplaceID(msg, id []byte) []byte {
	out := make([]byte, 0, len(msg)-(h.idEnd-h.idStart)+len(id))
	out = append(out, msg[:h.idStart]...)
	out = append(out, id...)
	return append(out, msg[h.idEnd:]...)
}

// ReadHead reads the top level of one JSON object, in one pass, for where
// its "id" value lies (the last one, as encoding/json reads a key given
// twice) and whether it has a method. ok is false if msg is not an object
// it can read that way (an escaped key, a batch). It checks only the
// structure it needs: msg is expected to be valid JSON.
func ReadHead(data []byte) (h Head, ok bool) {
	ok = Members(data, func(key []byte, start, end int) {
		switch string(key) {
		case "id":
			h.idStart, h.idEnd = start, end
		case "method":
			v := string(data[start:end])
			h.Method = v != `""` && v != "null"
		}
	})
	if !ok {
		return Head{}, false
	}
	return h, true
}

// Members calls fn, in order, with the key of each top-level member of one
// JSON object and where its raw value lies in data. It reports false,
// having perhaps called fn for some members, if data is not an object it
// can read that way: a key with an escape (the caller decodes such a
// message properly), or broken structure. It checks only the structure it
// needs: data is expected to be valid JSON.
func Members(data []byte, fn func(key []byte, start, end int)) bool {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return skipSpace(data, i+1) == len(data)
	}
	for i < len(data) && data[i] == '"' {
		kend := skipString(data, i)
		if kend < 0 {
			return false
		}
		key := data[i+1 : kend-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return false // an escaped key: not read this way
		}
		i = skipSpace(data, kend)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		i = skipSpace(data, i+1)
		vstart := i
		i = skipValue(data, i)
		if i < 0 {
			return false
		}
		fn(key, vstart, i)
		i = skipSpace(data, i)
		if i < len(data) && data[i] == ',' {
			i = skipSpace(data, i+1)
			continue
		}
		if i < len(data) && data[i] == '}' {
			return skipSpace(data, i+1) == len(data)
		}
		break
	}
	return false
}
