package peers

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
)

// MinimalOptions configures [Minimal]. The zero value works.
type MinimalOptions struct {
	// FlushEvery flushes after every SSE event, as a server that cannot tell
	// whether more is pending must. False (the default) fills a 32 KiB
	// buffer and flushes it when full and at the end of the stream.
	FlushEvery bool

	// NoGET answers GET with 405 Method Not Allowed (no standalone stream,
	// no resumption), as the specification allows. False serves an idle
	// standalone stream, and a resumption (Last-Event-ID) of the session's
	// last stream_progress call by re-generating its events.
	NoGET bool
}

// Minimal returns a Streamable HTTP MCP handler that does almost no work:
// sessions are a map entry, answers are appended to a byte slice, and a
// stream_progress call writes its notifications straight from a loop. It
// answers initialize, notifications (202), tools/list, tools/call of the
// two tools, any other request with an empty result, GET, and DELETE.
// Event IDs are the decimal sequence numbers 1..count+1 of the call.
func Minimal(opts MinimalOptions) http.Handler { return &minimal{opts: opts} }

type minimal struct {
	opts     MinimalOptions
	sessions sync.Map // session id → *minSession
}

// minSession remembers the session's last stream_progress call, for
// resumption.
type minSession struct {
	mu    sync.Mutex
	id    []byte // JSON-RPC id of the call
	token []byte // its progressToken
	count int
}

type minRequest struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		ProtocolVersion string `json:"protocolVersion"`
		Name            string `json:"name"`
		Arguments       struct {
			Count int `json:"count"`
		} `json:"arguments"`
		Meta struct {
			ProgressToken json.RawMessage `json:"progressToken"`
		} `json:"_meta"`
	} `json:"params"`
}

const (
	minHeaderSession = "Mcp-Session-Id"
	minBufSize       = 32 << 10
)

var minVersions = []string{"2025-03-26", "2025-06-18", "2025-11-25"}

func (m *minimal) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
		m.post(w, r)
	case http.MethodGet:
		m.get(w, r)
	case http.MethodDelete:
		m.sessions.Delete(r.Header.Get(minHeaderSession))
		w.WriteHeader(http.StatusOK)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

func (m *minimal) session(w http.ResponseWriter, r *http.Request) *minSession {
	v, ok := m.sessions.Load(r.Header.Get(minHeaderSession))
	if !ok {
		http.Error(w, "unknown session", http.StatusNotFound)
		return nil
	}
	return v.(*minSession)
}

func (m *minimal) post(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req minRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, "not a JSON-RPC message", http.StatusBadRequest)
		return
	}
	if req.Method == "initialize" {
		v := req.Params.ProtocolVersion
		if !slices.Contains(minVersions, v) {
			v = minVersions[len(minVersions)-1]
		}
		var raw [16]byte
		rand.Read(raw[:])
		sid := hex.EncodeToString(raw[:])
		m.sessions.Store(sid, &minSession{})
		w.Header().Set(minHeaderSession, sid)
		writeResult(w, req.ID, `{"protocolVersion":"`+v+`","capabilities":{"tools":{}},"serverInfo":{"name":"minimal","version":"1"}}`)
		return
	}
	s := m.session(w, r)
	if s == nil {
		return
	}
	if req.Method == "" || len(req.ID) == 0 {
		w.WriteHeader(http.StatusAccepted) // a notification or a response
		return
	}
	switch {
	case req.Method == "tools/list":
		writeResult(w, req.ID, `{"tools":[{"name":"`+ToolStream+`","inputSchema":{"type":"object","properties":{"count":{"type":"integer"}}}},{"name":"`+ToolSimple+`","inputSchema":{"type":"object"}}]}`)
	case req.Method == "tools/call" && req.Params.Name == ToolSimple:
		writeResult(w, req.ID, `{"content":[{"type":"text","text":"`+SimpleText+`"}]}`)
	case req.Method == "tools/call" && req.Params.Name == ToolStream:
		n := clampCount(req.Params.Arguments.Count)
		tok := req.Params.Meta.ProgressToken
		if len(tok) == 0 {
			n = 0
		}
		s.mu.Lock()
		s.id, s.token, s.count = req.ID, tok, n
		s.mu.Unlock()
		m.stream(w, req.ID, tok, 0, n)
	case req.Method == "tools/call":
		b := append([]byte(`{"jsonrpc":"2.0","id":`), req.ID...)
		b = append(b, `,"error":{"code":-32602,"message":"unknown tool"}}`...)
		writeJSON(w, b)
	default:
		writeResult(w, req.ID, `{}`)
	}
}

func (m *minimal) get(w http.ResponseWriter, r *http.Request) {
	if m.opts.NoGET {
		w.Header().Set("Allow", "POST, DELETE")
		http.Error(w, "no standalone stream", http.StatusMethodNotAllowed)
		return
	}
	s := m.session(w, r)
	if s == nil {
		return
	}
	if lei := r.Header.Get("Last-Event-ID"); lei != "" {
		s.mu.Lock()
		id, tok, n := s.id, s.token, s.count
		s.mu.Unlock()
		from, err := strconv.Atoi(lei)
		if err != nil || from < 0 || from > n || id == nil {
			http.Error(w, "unknown Last-Event-ID", http.StatusBadRequest)
			return
		}
		m.stream(w, id, tok, from, n)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	http.NewResponseController(w).Flush()
	<-r.Context().Done()
}

// stream writes progress events from+1..n and then the response to id.
func (m *minimal) stream(w http.ResponseWriter, id, tok []byte, from, n int) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	buf := make([]byte, 0, minBufSize)
	send := func(flush bool) bool {
		if _, err := w.Write(buf); err != nil {
			return false
		}
		buf = buf[:0]
		return !flush || rc.Flush() == nil
	}
	for i := from + 1; i <= n; i++ {
		buf = append(buf, "id: "...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		buf = append(buf, "\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":"...)
		buf = append(buf, tok...)
		buf = append(buf, `,"progress":`...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		buf = append(buf, `,"total":`...)
		buf = strconv.AppendInt(buf, int64(n), 10)
		buf = append(buf, "}}\n\n"...)
		if m.opts.FlushEvery || len(buf) > minBufSize-512 {
			if !send(m.opts.FlushEvery) {
				return
			}
		}
	}
	buf = append(buf, "id: "...)
	buf = strconv.AppendInt(buf, int64(n+1), 10)
	buf = append(buf, "\ndata: {\"jsonrpc\":\"2.0\",\"id\":"...)
	buf = append(buf, id...)
	buf = append(buf, `,"result":{"content":[{"type":"text","text":"streamed `...)
	buf = strconv.AppendInt(buf, int64(n), 10)
	buf = append(buf, " events\"}]}}\n\n"...)
	send(true)
}

func writeResult(w http.ResponseWriter, id []byte, result string) {
	b := make([]byte, 0, 64+len(result))
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, id...)
	b = append(b, `,"result":`...)
	b = append(b, result...)
	writeJSON(w, append(b, '}'))
}

func writeJSON(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Write(b)
}
