package relay

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/mcprelay/mcprelay/resume"
)

// FuzzErrorResponse checks that every error body the relay writes is valid
// JSON whatever the message text (a backend's error text is arbitrary
// bytes: control characters, invalid UTF-8) and keeps the id and code.
func FuzzErrorResponse(f *testing.F) {
	for _, s := range []string{"plain", "esc \x1b[31m red", "bell \a", "bad utf-8 \xff\xfe", `quote " and \ backslash`, "line\nbreak", "\u2028", "<html>&"} {
		f.Add(s, `"id-1"`, -32001)
	}
	f.Add("x", `7`, -32800)
	f.Fuzz(func(t *testing.T, msg, id string, code int) {
		if !json.Valid([]byte(id)) {
			return // ids reach errorResponse only after parsing
		}
		b := errorResponse(json.RawMessage(id), code, msg, resume.ReasonBackendLost)
		if !json.Valid(b) {
			t.Fatalf("invalid JSON for message %q: %s", msg, b)
		}
		var got struct {
			ID    json.RawMessage `json:"id"`
			Error struct {
				Code int `json:"code"`
				Data struct {
					Reason string `json:"reason"`
				} `json:"data"`
			} `json:"error"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.Error.Code != code || got.Error.Data.Reason != "backend_lost" {
			t.Fatalf("code %d reason %q, want %d backend_lost: %s", got.Error.Code, got.Error.Data.Reason, code, b)
		}
		var a, w any
		json.Unmarshal(got.ID, &a)
		json.Unmarshal([]byte(id), &w)
		if fmt.Sprint(a) != fmt.Sprint(w) {
			t.Fatalf("id %s, want %s", got.ID, id)
		}
	})
}

// FuzzReadMessage: when readMessage reads a message itself, it reads what
// json.Unmarshal reads.
func FuzzReadMessage(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":"a\"b","result":{}}`,
		`{"id":null,"method":null,"params":null}`,
		`{"ID":1,"Method":"m"}`,
		`{"method":"m\u0041","id":[1]}`,
		`{"id":1,"id":2,"method":"a","method":"b"}`,
		`{"id":1,"method":"a","method":null}`,
		`{"method":"é","params":[1,2]}`,
		`[{"id":1}]`, `"x"`, `{}`, `{"a":1} x`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		got, ok := readMessage([]byte(data))
		if !ok {
			return
		}
		var want message
		if err := json.Unmarshal([]byte(data), &want); err != nil {
			t.Fatalf("readMessage(%q) read %+v; json.Unmarshal: %v", data, got, err)
		}
		if string(got.ID) != string(want.ID) || got.Method != want.Method || string(got.Params) != string(want.Params) {
			t.Fatalf("readMessage(%q) = %q %q %q; json.Unmarshal %q %q %q", data, got.ID, got.Method, got.Params, want.ID, want.Method, want.Params)
		}
	})
}
