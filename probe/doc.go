// Package probe provides an audit of MCP Streamable HTTP servers for unsafe
// resumption: it acts as a careful legacy-era client against one URL and
// reports, case by case, whether the server leaks one session's events to
// another, skips events without a reset, or hangs on a resume (see
// the decision table and never-events of docs/design.md), plus the transport checks around them
// (session header, Origin, protocol version, priming).
//
//	rep, err := probe.Run(ctx, "http://127.0.0.1:8080/mcp", probe.Options{Timeout: 5 * time.Second})
//	if err != nil {
//		return err // bad URL or no initialize: nothing was tested
//	}
//	rep.WriteText(os.Stdout)
//	if rep.Unsafe() {
//		os.Exit(1)
//	}
//
// The probe needs a tool that produces a few events. It discovers one with
// tools/list (a name suggesting progress or streaming, preferably with a
// count-like argument) or takes [Options.Tool] and [Options.Args], and it
// sends every call a progressToken unique to its session, which is how it
// recognises another session's events.
//
// Verdicts: [Unsafe] is a leak, a silent gap or a hang, and is the only one
// that fails a run; [Warn] departs from the specification or mcprelay's contract (docs/design.md)
// without losing or leaking anything; [Info] is worth knowing; [NotTested]
// says why a case could not be exercised; [Safe] is what a careful server does.
//
// Every request is bounded by [Options.Timeout], redirects are never
// followed, and the only events the probe asks for beyond a handful are the
// [Options.MaxEvents] of the evicted-cursor case.
package probe
