package relay

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/mcprelay/mcprelay/resume"
)

// responseIDsReference is responseIDs written with encoding/json alone:
// the meaning the fast path must keep.
func responseIDsReference(data []byte) []json.RawMessage {
	var out []json.RawMessage
	var rs []route
	if json.Unmarshal(data, &rs) == nil {
		for _, r := range rs {
			if id := idKey(r.ID); r.Method == "" && len(id) > 0 {
				out = append(out, id)
			}
		}
		return out
	}
	var r route
	if json.Unmarshal(data, &r) != nil {
		return nil
	}
	if id := idKey(r.ID); r.Method == "" && len(id) > 0 {
		out = append(out, id)
	}
	return out
}

var routeSeeds = []string{
	`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"x","progress":1}}`,
	`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"} \" ]"}]}}`,
	`{"jsonrpc":"2.0","id":"a\"b","error":{"code":-32001,"message":"lost"}}`,
	`{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{}}`,
	`{"id":null,"result":{}}`,
	`{"id":1,"method":""}`,
	`{"id":1,"method":null}`,
	`{"method":"x","id":1}`,
	`{"i\u0064":1,"result":1}`,
	`{"id":1,"id":2,"result":1}`,
	`[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","method":"n"}]`,
	` { "id" : 12 , "result" : [ 1 , { } ] } `,
	`{"id":1,"result":tru}`,
	`{"id":1,"result":`,
	`{}`, `[]`, `"x"`, `12`, ``,
}

func TestResponseIDsMatchesEncodingJSON(t *testing.T) {
	for _, s := range routeSeeds {
		got, want := fmt.Sprintf("%s", responseIDs([]byte(s), nil)), fmt.Sprintf("%s", responseIDsReference([]byte(s)))
		if got != want {
			t.Errorf("responseIDs(%s) = %s, want %s", s, got, want)
		}
	}
}

func FuzzResponseIDs(f *testing.F) {
	for _, s := range routeSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, want := fmt.Sprintf("%s", responseIDs([]byte(s), nil)), fmt.Sprintf("%s", responseIDsReference([]byte(s)))
		if got != want {
			t.Fatalf("responseIDs(%q) = %s, want %s", s, got, want)
		}
	})
}

func BenchmarkResponseIDs(b *testing.B) {
	note := []byte(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"tok","message":"step 12 of 100","progress":12,"total":100}}`)
	resp := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"streamed 100 events"}]}}`)
	var buf [1]json.RawMessage
	b.Run("notification", func(b *testing.B) {
		for b.Loop() {
			responseIDs(note, buf[:0])
		}
	})
	b.Run("response", func(b *testing.B) {
		for b.Loop() {
			responseIDs(resp, buf[:0])
		}
	})
}

func BenchmarkResponseIDsReference(b *testing.B) {
	note := []byte(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"tok","message":"step 12 of 100","progress":12,"total":100}}`)
	for b.Loop() {
		responseIDsReference(note)
	}
}

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
