package mcptest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Message is the part of a JSON-RPC message that tests read off the wire:
// a request or notification (Method, Params), or a response (ID with
// Result or Error).
type Message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		ProgressToken any     `json:"progressToken"`
		Progress      float64 `json:"progress"`
		Total         float64 `json:"total"`
		Data          any     `json:"data"` // of a log message
	} `json:"params"`
	Result *struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		IsError bool `json:"isError"`
	} `json:"result"`
	Error *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// DecodeMessage decodes one JSON-RPC message.
func DecodeMessage(data []byte) (Message, error) {
	var m Message
	err := json.Unmarshal(data, &m)
	return m, err
}

// HasID reports whether m carries id (a string or a number), compared as
// JSON values.
func (m Message) HasID(id any) bool {
	want, err := json.Marshal(id)
	if err != nil || len(m.ID) == 0 {
		return false
	}
	var a, b any
	return json.Unmarshal(m.ID, &a) == nil && json.Unmarshal(want, &b) == nil && a == b
}

// Text returns the first text of a result ("" if none).
func (m Message) Text() string {
	if m.Result == nil || len(m.Result.Content) == 0 {
		return ""
	}
	return m.Result.Content[0].Text
}

// NewRequest builds a request to an MCP endpoint as a client sends it by
// hand: Accept for JSON and SSE, Content-Type for a body, and the headers
// in hdr whose value is not "" (Mcp-Session-Id, Last-Event-ID, ...).
func NewRequest(ctx context.Context, method, url string, hdr map[string]string, body string) (*http.Request, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range hdr {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	return req, nil
}

// Decode decodes one JSON-RPC message, failing the test if it is not one.
func Decode(t testing.TB, data []byte) Message {
	t.Helper()
	m, err := DecodeMessage(data)
	if err != nil {
		t.Fatalf("not a JSON-RPC message: %q: %v", data, err)
	}
	return m
}
