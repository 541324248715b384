package wire

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// responseIDsReference is responseIDs written with encoding/json alone:
// the meaning the fast path must keep.
func responseIDsReference(data []byte) []json.RawMessage {
	var out []json.RawMessage
	var rs []route
	if json.Unmarshal(data, &rs) == nil {
		for _, r := range rs {
			if id := IDKey(r.ID); r.Method == "" && len(id) > 0 {
				out = append(out, id)
			}
		}
		return out
	}
	var r route
	if json.Unmarshal(data, &r) != nil {
		return nil
	}
	if id := IDKey(r.ID); r.Method == "" && len(id) > 0 {
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
		got, want := fmt.Sprintf("%s", ResponseIDs([]byte(s), nil)), fmt.Sprintf("%s", responseIDsReference([]byte(s)))
		if got != want {
			t.Errorf("ResponseIDs(%s) = %s, want %s", s, got, want)
		}
	}
}

func FuzzResponseIDs(f *testing.F) {
	for _, s := range routeSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, want := fmt.Sprintf("%s", ResponseIDs([]byte(s), nil)), fmt.Sprintf("%s", responseIDsReference([]byte(s)))
		if got != want {
			t.Fatalf("ResponseIDs(%q) = %s, want %s", s, got, want)
		}
	})
}

func BenchmarkResponseIDs(b *testing.B) {
	note := []byte(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"tok","message":"step 12 of 100","progress":12,"total":100}}`)
	resp := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"streamed 100 events"}]}}`)
	var buf [1]json.RawMessage
	b.Run("notification", func(b *testing.B) {
		for b.Loop() {
			ResponseIDs(note, buf[:0])
		}
	})
	b.Run("response", func(b *testing.B) {
		for b.Loop() {
			ResponseIDs(resp, buf[:0])
		}
	})
}

func BenchmarkResponseIDsReference(b *testing.B) {
	note := []byte(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"tok","message":"step 12 of 100","progress":12,"total":100}}`)
	for b.Loop() {
		responseIDsReference(note)
	}
}

func TestReplaceID(t *testing.T) {
	tests := []struct{ in, id, want string }{
		{`{"jsonrpc":"2.0","id":1,"result":{}}`, `"a"`, `{"jsonrpc":"2.0","id":"a","result":{}}`},
		{`{ "id" : "x\"y" , "method":"m"}`, `7`, `{ "id" : 7 , "method":"m"}`},
		{`{"result":{"id":5},"id":2}`, `3`, `{"result":{"id":5},"id":3}`},
		{`{"jsonrpc":"2.0","method":"n"}`, `1`, ``},
		{`[{"id":1}]`, `2`, ``},
	}
	for _, tt := range tests {
		got, ok := ReplaceID([]byte(tt.in), []byte(tt.id))
		if tt.want == "" {
			if ok {
				t.Errorf("ReplaceID(%s) = %s, want not found", tt.in, got)
			}
			continue
		}
		if !ok || string(got) != tt.want {
			t.Errorf("ReplaceID(%s, %s) = %s %v, want %s", tt.in, tt.id, got, ok, tt.want)
		}
	}
}

// FuzzReplaceID: whatever the message, a replaced id is the top-level id
// encoding/json reads back, and nothing else changes meaning.
func FuzzReplaceID(f *testing.F) {
	for _, s := range routeSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		out, ok := ReplaceID([]byte(data), []byte(`"new-id"`))
		if !ok {
			return
		}
		var before, after map[string]json.RawMessage
		if json.Unmarshal([]byte(data), &before) != nil {
			return // not an object encoding/json reads: nothing promised
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("ReplaceID(%q) = %q: not JSON any more: %v", data, out, err)
		}
		if string(after["id"]) != `"new-id"` {
			t.Fatalf("ReplaceID(%q) = %q: id %s", data, out, after["id"])
		}
		for k, v := range before {
			if k != "id" && string(after[k]) != string(v) {
				t.Fatalf("ReplaceID(%q) changed %q: %s -> %s", data, k, v, after[k])
			}
		}
	})
}

// FuzzReadHead: on any object encoding/json reads, ReadHead finds the id
// encoding/json finds and tells a method as it does.
func FuzzReadHead(f *testing.F) {
	for _, s := range routeSeeds {
		f.Add(s)
	}
	f.Add(`{"id":1,"method":"m","id":2}`)
	f.Add(`{"method":"m","method":""}`)
	f.Add(`{"method":null,"id":"x"}`)
	f.Fuzz(func(t *testing.T, data string) {
		h, ok := ReadHead([]byte(data))
		var ref struct {
			ID     json.RawMessage `json:"id"`
			Method *string         `json:"method"`
		}
		var obj map[string]json.RawMessage
		if !ok || json.Unmarshal([]byte(data), &obj) != nil || json.Unmarshal([]byte(data), &ref) != nil {
			return // not read, or not a message encoding/json reads: nothing promised
		}
		for k := range obj {
			if strings.EqualFold(k, "id") && k != "id" || strings.EqualFold(k, "method") && k != "method" {
				return // encoding/json matches keys without regard to case
			}
		}
		if got := h.ID([]byte(data)); string(got) != string(ref.ID) {
			t.Fatalf("ReadHead(%q): id %s, encoding/json %s", data, got, ref.ID)
		}
		if want := ref.Method != nil && *ref.Method != ""; h.Method != want {
			t.Fatalf("ReadHead(%q): method %v, encoding/json %v", data, h.Method, want)
		}
	})
}

func TestReadHead(t *testing.T) {
	tests := []struct {
		in     string
		id     string
		method bool
		ok     bool
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"id":9,"method":"x"}}`, `1`, true, true},
		{`{"method":"tools/call","params":{},"id":"a"}`, `"a"`, true, true},
		{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, ``, true, true},
		{`{"jsonrpc":"2.0","id":3,"result":{}}`, `3`, false, true},
		{`{"id":1,"method":""}`, `1`, false, true},
		{`{"id":1,"id":2,"method":"m"}`, `2`, true, true},
		{` { "id" : 4 , "method" : "m" } `, `4`, true, true},
		{`{}`, ``, false, true},
		{`[{"id":1,"method":"m"}]`, ``, false, false},
		{`{"id":1,"method":"m"`, ``, false, false},
		{`{"i\u0064":1,"method":"m"}`, ``, false, false},
	}
	for _, tt := range tests {
		h, ok := ReadHead([]byte(tt.in))
		if ok != tt.ok || ok && (string(h.ID([]byte(tt.in))) != tt.id || h.Method != tt.method) {
			t.Errorf("ReadHead(%s) = id %s method %v ok %v, want %s %v %v", tt.in, h.ID([]byte(tt.in)), h.Method, ok, tt.id, tt.method, tt.ok)
		}
	}
}
