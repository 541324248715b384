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
