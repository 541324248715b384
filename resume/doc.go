// Package resume provides mcprelay's resume contract as code: the cursor
// codec that mints and verifies event IDs; Decide, the pure resume decision
// (the table in docs/design.md) that answers a GET carrying Last-Event-ID
// with a Plan; the mid-stream rules whoever executes a plan applies; and the
// vocabulary client and relay share (Reason, Reset, EventReset,
// CodeRequestLost).
//
// Both halves are pure: no I/O, no clocks, no logging. The relay looks up the
// session and the stream record, parses the cursor, and hands the facts to
// Decide; the answer says what to send and in which order.
//
//	codec, err := resume.NewCodec(secret) // secret shared by all replicas, ≥ 32 bytes
//	if err != nil {
//		return err
//	}
//	id := codec.ID(resume.Cursor{Stream: key, Generation: 1, Seq: 7}) // SSE "id:" field
//
//	// Later, on a GET with Last-Event-ID:
//	cur, cerr := codec.Parse(r.Header.Get("Last-Event-ID"))
//	d := resume.Decide(resume.Input{
//		HasSessionHeader: r.Header.Get("Mcp-Session-Id") != "",
//		Session:          sess,   // nil: unknown, expired, deleted or another principal's
//		Cursor:           cur,
//		CursorErr:        cerr,
//		Stream:           stream, // nil: the log does not know the cursor's stream
//	})
//	// d.Status; with 200, d.Plan: reset ResetBefore, replay after From
//
// (up to UpTo unless Then is Live), reset ResetAfterDue, then Then.
//
// # Event ID format
//
// An event ID is the unpadded base64url encoding of
//
//	version (1 byte, = 2) | stream key (16 bytes) | uvarint generation | uvarint seq | MAC (12 bytes)
//
// where MAC is the first 12 bytes of AES-128(K, PRF || seq as 8 big-endian bytes), K the first
// 16 bytes of HMAC-SHA256(secret, "mcprelay-event-id-aes-key-v2") and PRF the first 8 bytes of
// HMAC-SHA256(secret, "mcprelay-event-id-v2" || stream key || uvarint generation). PRF is
// computed once per stream ([Codec.Stream]), so an event's ID costs one AES block. Version 1
// IDs, whose MAC is the first 12 bytes of HMAC-SHA256(secret, "mcprelay-event-id-v1" ||
// everything before the MAC), are still accepted. The ID carries no session ID: IDs end up in logs and proxies, and the
// stream key is enough to find the owning session in the log. The MAC lets the relay tell a
// forged cursor (400) from a genuine cursor of another session (409) without trusting the
// client. Parse accepts exactly the strings the codec mints: strict base64url without
// padding or line breaks, minimal varints, no trailing bytes, so every accepted ID
// re-encodes to itself.
//
// # Design notes
//
//   - Generation and sequence are varints so that typical IDs stay short (42 characters
//     for small numbers, at most 66).
//   - The MAC is truncated to 96 bits: forging needs about 2^96 online guesses, each of
//     which the relay counts and answers with 400.
//   - Hashes are pooled per codec, so AppendID does not allocate when dst has room; the
//     relay calls it once per event.
//   - Decide guards Seq+1 against overflow: a hole is Seq < FirstSeq-1 with FirstSeq > 0.
//   - A genuine cursor past what the log holds (a sequence the stream has not
//     reached in its own generation) can only be one this relay delivered and then
//     lost in a crash: it gets a gap reset first and then what the log holds (row 7,
//     "ahead_of_log"), never a silent skip and never a 400 that would strand the
//     client without its lost-request errors. A generation newer than the stream's
//     cannot be minted by any relay and is a 400 "future_cursor" (row 3).
package resume
