package resume

import "encoding/json"

// Reason says why a stream was reset. It is the "reason" of the reset
// event the relay sends (see [Reset]) and the "data.reason" of the
// JSON-RPC error that ends a request the relay had to give up on. Client and
// relay both use these constants, so they cannot drift apart.
type Reason string

// Reset reasons (docs/design.md, "The resume contract").
const (
	// ReasonUnknownStream: the cursor names a stream this session's log no
	// longer holds (expired after its grace period, or never held here).
	// Nothing can be replayed; the stream ends.
	ReasonUnknownStream Reason = "unknown_stream"
	// ReasonGenerationChanged: the stream belongs to an older incarnation
	// of the session's backend (restart, failover, re-creation). What the
	// log held of it was replayed; nothing more will come on it.
	ReasonGenerationChanged Reason = "generation_changed"
	// ReasonGap: events after the cursor were evicted (or lost in a crash
	// after delivery); what follows is complete from the reset on.
	ReasonGap Reason = "gap"
	// ReasonBackendLost: the backend session that was answering the
	// stream's requests is gone; each of them gets an error response with
	// [CodeRequestLost] under its own id, listed in Reset.Lost.
	ReasonBackendLost Reason = "backend_lost"
	// ReasonCancelled is not sent as a reset: it is the data.reason of the
	// [CodeRequestCancelled] error that ends a request the client cancelled
	// and the server then left unanswered.
	ReasonCancelled Reason = "cancelled"
)

// EventReset is the SSE event type of the relay's reset signal. A backend
// cannot forge one: the relay writes every event type itself.
const EventReset = "reset"

// Reset is the JSON payload of an SSE "reset" event. After a reset, what
// follows on the connection is complete from the reset on: a client drops
// the partial state it built from the stream before it.
type Reset struct {
	Reason     Reason            `json:"reason"`
	Stream     string            `json:"stream"`         // the stream's key (StreamKey.String)
	Generation uint64            `json:"generation"`     // the stream's generation
	Lost       []json.RawMessage `json:"lost,omitempty"` // ids of the requests that will get a CodeRequestLost error
}

// Marshal returns the event's data.
func (r Reset) Marshal() []byte {
	b, err := json.Marshal(r)
	if err != nil {
		// Reset holds only strings, numbers and already-valid JSON ids.
		panic("resume: marshalling a reset: " + err.Error())
	}
	return b
}

// JSON-RPC error codes of the responses the relay writes under a client's
// request id.
const (
	// CodeRequestLost: the request's response can no longer come (its
	// backend session was lost). Standard clients fail the call instead of
	// waiting forever; data.reason is a [Reason].
	CodeRequestLost = -32001
	// CodeRequestCancelled: the client cancelled the request and the server
	// left it unanswered; written so that a resume of its stream ends.
	CodeRequestCancelled = -32800
)
