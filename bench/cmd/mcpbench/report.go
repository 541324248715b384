package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mcprelay/mcprelay/bench/load"
)

type failure struct {
	Target   string `json:"target"`
	Workload string `json:"workload"`
	Run      int    `json:"run"`
	Error    string `json:"error"`
}

type targetInfo struct {
	Name        string `json:"name"`
	Description string `json:"description"`
}

// results holds every run's numbers and their summary.
type results struct {
	Command  string            `json:"command"`
	Date     string            `json:"date"`
	Duration string            `json:"duration"`
	Machine  map[string]string `json:"machine"`
	Config   runConfig         `json:"config"`
	Baseline string            `json:"baseline"`
	Targets  []targetInfo      `json:"targets"`
	// Runs holds every run's value: target → metric → values.
	Runs map[string]map[string][]float64 `json:"runs"`
	// Summary is the median over runs, or the sum for counts (lost,
	// resets, errors, failed).
	Summary  map[string]map[string]float64 `json:"summary"`
	Failures []failure                     `json:"failures"`
}

func newResults() *results {
	return &results{
		Date:     time.Now().UTC().Format(time.DateOnly),
		Baseline: baseline,
		Runs:     map[string]map[string][]float64{},
		Summary:  map[string]map[string]float64{},
		Failures: []failure{},
	}
}

func (r *results) add(target, _ string, m map[string]float64) {
	if r.Runs[target] == nil {
		r.Runs[target] = map[string][]float64{}
	}
	for k, v := range m {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			r.Runs[target][k] = append(r.Runs[target][k], v)
		}
	}
}

func (r *results) fail(target, workload string, run int, err error) {
	r.Failures = append(r.Failures, failure{target, workload, run + 1, err.Error()})
}

// isCount reports whether a metric is summed over runs instead of taking
// the median.
func isCount(metric string) bool {
	for _, s := range []string{"_lost", "_resets", "_errors", "_failed"} {
		if strings.HasSuffix(metric, s) {
			return true
		}
	}
	return false
}

func (r *results) summarize(cfg config) {
	r.Targets = nil
	for _, name := range cfg.targets {
		t, _ := findTarget(name)
		r.Targets = append(r.Targets, targetInfo{t.name, t.desc})
	}
	for t, ms := range r.Runs {
		r.Summary[t] = map[string]float64{}
		for k, vs := range ms {
			if isCount(k) {
				sum := 0.0
				for _, v := range vs {
					sum += v
				}
				r.Summary[t][k] = sum
			} else {
				r.Summary[t][k] = load.Median(vs)
			}
		}
	}
}

func (r *results) get(target, metric string) (float64, bool) {
	v, ok := r.Summary[target][metric]
	return v, ok
}

// column is one column of a table.
type column struct {
	metric string
	head   string
	format func(float64) string
	ratio  bool // add "× raw" after it
	above  bool // add "above raw" after it
}

type table struct {
	workload string
	title    func(config) string
	cols     []column
}

var tables = []table{
	{"rt", func(c config) string {
		return fmt.Sprintf("tools/call round trips: %d concurrent sessions, %s per run", c.rtSessions, c.rtDuration)
	}, []column{
		{metric: "rt_per_s", head: "rt/s", format: num, ratio: true},
		{metric: "rt_p50_ms", head: "p50 ms", format: msf},
		{metric: "rt_p99_ms", head: "p99 ms", format: msf},
		{metric: "rt_cpu_us", head: "server CPU µs/call", format: dec1},
		{metric: "rt_client_cpu_us", head: "client CPU µs/call", format: dec1},
		{metric: "rt_errors", head: "errors", format: num},
	}},
	{"stream", func(c config) string {
		return fmt.Sprintf("one tools/call streaming %s progress notifications", num(float64(c.streamEvents)))
	}, []column{
		{metric: "stream_events_per_s", head: "events/s", format: num, ratio: true},
		{metric: "stream_cpu_ns", head: "server CPU ns/event", format: num},
		{metric: "stream_client_cpu_ns", head: "client CPU ns/event", format: num},
		{metric: "stream_lost", head: "lost", format: num},
		{metric: "stream_resets", head: "resets", format: num},
		{metric: "stream_errors", head: "errors", format: num},
	}},
	{"streams", func(c config) string {
		return fmt.Sprintf("%d tools/call streams at once, %s notifications each", c.streams, num(float64(c.streamsEvents)))
	}, []column{
		{metric: "streams_events_per_s", head: "events/s (all)", format: num, ratio: true},
		{metric: "streams_cpu_ns", head: "server CPU ns/event", format: num},
		{metric: "streams_client_cpu_ns", head: "client CPU ns/event", format: num},
		{metric: "streams_lost", head: "lost", format: num},
		{metric: "streams_resets", head: "resets", format: num},
		{metric: "streams_errors", head: "errors", format: num},
	}},
	{"resume", func(c config) string {
		s := fmt.Sprintf("resume (GET with Last-Event-ID) of a cursor %s events back, %d resumes per run (n/a: no event store)", num(float64(c.resumeBack)), c.resumeSamples)
		if c.has("idle") {
			s += fmt.Sprintf(", with the %s idle sessions open", num(float64(c.idleSessions)))
		}
		return s
	}, []column{
		{metric: "resume_first_p50_ms", head: "first event p50 ms", format: msf},
		{metric: "resume_first_p99_ms", head: "first event p99 ms", format: msf},
		{metric: "resume_per_s", head: "replay events/s", format: num, ratio: true},
		{metric: "resume_lost", head: "lost", format: num},
		{metric: "resume_resets", head: "resets", format: num},
		{metric: "resume_errors", head: "errors", format: num},
	}},
	{"idle", func(c config) string {
		s := fmt.Sprintf("%s idle initialized sessions", num(float64(c.idleSessions)))
		if c.idleStreams {
			s += ", then one open idle GET stream each (per stream: above the session's own cost)"
		}
		return s + "; server process, heap from runtime.MemStats after GC, RSS from /proc/self/status"
	}, []column{
		{metric: "session_heap_B", head: "heap B/session", format: num},
		{metric: "session_stack_B", head: "stack B/session", format: num},
		{metric: "session_rss_B", head: "RSS B/session", format: num},
		{metric: "session_goroutines", head: "goroutines/session", format: dec},
		{metric: "stream_heap_B", head: "heap B/stream", format: num, above: true},
		{metric: "stream_stack_B", head: "stack B/stream", format: num},
		{metric: "stream_rss_B", head: "RSS B/stream", format: num},
		{metric: "stream_goroutines", head: "goroutines/stream", format: dec},
		{metric: "stream_failed", head: "streams not opened", format: num},
	}},
	{"first", func(c config) string {
		return fmt.Sprintf("a new session: initialize to the result of its first tools/call, %d sessions one after another per run", c.firstSamples)
	}, []column{
		{metric: "first_p50_ms", head: "p50 ms", format: msf},
		{metric: "first_p99_ms", head: "p99 ms", format: msf},
	}},
	{"mem", func(c config) string {
		return fmt.Sprintf("%d idle sessions (one call each); RSS (VmRSS) of the server process and all its children (stdio servers), from /proc", c.memSessions)
	}, []column{
		{metric: "mem_rss_per_session_B", head: "RSS B/session (all ÷ sessions)", format: num},
		{metric: "mem_added_per_session_B", head: "added B/session", format: num},
		{metric: "mem_server_added_per_session_B", head: "of which the server process", format: num},
		{metric: "mem_rss_before_B", head: "RSS B before", format: num},
		{metric: "mem_procs", head: "processes", format: num},
	}},
}

func num(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func msf(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

func dec1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
func dec(v float64) string  { return strconv.FormatFloat(v, 'f', 2, 64) }

// rows renders a table: a header row and one row per target.
func (r *results) rows(cfg config, t table) [][]string {
	head := []string{"target"}
	for _, c := range t.cols {
		head = append(head, c.head)
		if c.ratio {
			head = append(head, "× "+baseline)
		}
		if c.above {
			head = append(head, "above "+baseline)
		}
	}
	out := [][]string{head}
	for _, name := range cfg.targets {
		tg, _ := findTarget(name)
		if t.workload == "resume" && !tg.resumable {
			out = append(out, append([]string{name}, strings.Split(strings.Repeat("n/a,", len(head)-1), ",")[:len(head)-1]...))
			continue
		}
		row := []string{name}
		for _, c := range t.cols {
			v, ok := r.get(name, c.metric)
			cell := "—"
			if ok {
				cell = c.format(v)
			}
			row = append(row, cell)
			if c.ratio || c.above {
				b, bok := r.get(baseline, c.metric)
				cell := "—"
				switch {
				case ok && bok && c.ratio && b > 0:
					cell = strconv.FormatFloat(v/b, 'f', 2, 64) + "×"
				case ok && bok && c.above:
					cell = c.format(v - b)
				}
				row = append(row, cell)
			}
		}
		out = append(out, row)
	}
	return out
}

func (r *results) text(cfg config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n%s; %s; %d runs, medians (counts summed); took %s\n", r.Command, r.Machine["cpu"], r.Machine["go"], cfg.runs, r.Duration)
	for _, t := range tables {
		if !cfg.has(t.workload) {
			continue
		}
		fmt.Fprintf(&b, "\n== %s\n", t.title(cfg))
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, row := range r.rows(cfg, t) {
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		tw.Flush()
	}
	fmt.Fprintf(&b, "\n== goals\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, row := range r.goalRows() {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()
	if len(r.Failures) > 0 {
		fmt.Fprintf(&b, "\nfailures:\n")
		for _, f := range r.Failures {
			fmt.Fprintf(&b, "  run %d %s %s: %s\n", f.Run, f.Target, f.Workload, f.Error)
		}
	}
	return b.String()
}

func (r *results) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if path == "-" {
		_, err = os.Stdout.Write(b)
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func (r *results) writeMarkdown(cfg config) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Performance: mcprelay against its peers and the machine's limit\n\n")
	fmt.Fprintf(&b, "Generated by `mcpbench` (bench/cmd/mcpbench, run by `scripts/bench`) on %s in %s; do not edit by hand, rerun it.\n\n", r.Date, r.Duration)
	fmt.Fprintf(&b, "Command (in `bench/`): `%s`\n\n", r.Command)
	fmt.Fprintf(&b, "Machine: %s, `nproc` %s, %s, %s, GOMAXPROCS %s.\n\n", r.Machine["cpu"], r.Machine["nproc"], r.Machine["go"], r.Machine["os"], r.Machine["gomaxprocs"])
	if c := r.Machine["commit"]; c != "" {
		fmt.Fprintf(&b, "mcprelay at commit %s.\n\n", c)
	}
	fmt.Fprintf(&b, "Every target runs in a server process of its own on 127.0.0.1 (one process for rt/stream/streams, a fresh one for idle and resume); "+
		"the load comes from the mcpbench process, which shares the same cores. Each figure is the median of %d runs, targets interleaved within a run; "+
		"counts (lost, resets, errors) are summed over the runs. \"× %s\" is the ratio to the %s target in the same run; \"lost\" counts notifications "+
		"asked for and never received (a \"reset\" is mcprelay's explicit signal of a loss, never silent). Memory is read in the server process "+
		"(runtime.MemStats after two GCs; RSS is VmRSS) before and after opening the sessions, then after opening the streams.\n\n", cfg.runs, baseline, baseline)
	fmt.Fprintf(&b, "| target | what it is |\n|---|---|\n")
	for _, t := range r.Targets {
		fmt.Fprintf(&b, "| %s | %s |\n", t.Name, t.Description)
	}
	for _, t := range tables {
		if !cfg.has(t.workload) {
			continue
		}
		fmt.Fprintf(&b, "\n## %s\n\n", t.title(cfg))
		for i, row := range r.rows(cfg, t) {
			fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
			if i == 0 {
				fmt.Fprintf(&b, "|%s\n", strings.Repeat("---|", len(row)))
			}
		}
	}
	fmt.Fprintf(&b, "\n## Goals\n\nThe performance goals (issues 6 and 14), judged from the medians above (goals, not tests: nothing fails CI for being slow).\n\n")
	for i, row := range r.goalRows() {
		fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
		if i == 0 {
			fmt.Fprintf(&b, "|---|---|---|\n")
		}
	}
	if len(r.Failures) > 0 {
		fmt.Fprintf(&b, "\n## Failures in this run\n\n")
		for _, f := range r.Failures {
			fmt.Fprintf(&b, "- run %d, %s, %s: `%s`\n", f.Run, f.Target, f.Workload, f.Error)
		}
	}
	if cfg.mdAppend != "" {
		notes, err := os.ReadFile(cfg.mdAppend)
		if err != nil {
			return err
		}
		b.WriteString("\n")
		b.Write(notes)
	}
	return os.WriteFile(cfg.mdOut, []byte(b.String()), 0o644)
}

// machine describes where the run happened.
func machine() map[string]string {
	m := map[string]string{
		"nproc":      strconv.Itoa(runtime.NumCPU()),
		"gomaxprocs": strconv.Itoa(runtime.GOMAXPROCS(0)),
		"go":         runtime.Version(),
		"os":         runtime.GOOS + "/" + runtime.GOARCH,
		"cpu":        "unknown CPU",
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m["cpu"] = strings.TrimSpace(v)
				break
			}
		}
	}
	if out, err := exec.Command("git", "log", "-1", "--format=%h %s").Output(); err == nil {
		m["commit"] = strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "status", "--porcelain", "--", "..").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
			m["commit"] += " (with uncommitted changes)"
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["os"] += ", Linux " + strings.TrimSpace(string(b))
	}
	return m
}

// goal is one of the performance targets (issues 6 and 14), checked against a run's medians.
type goal struct {
	what      string
	metric    string
	target    string  // the target measured
	against   string  // "" for an absolute bound
	atLeast   float64 // the ratio (or, with against "", the value) must be at least this
	atMost    float64 // or at most this (when nonzero)
	aboveBase bool    // compare target minus baseline with atMost
}

var goals = []goal{
	{what: "stream: relay-minimal ≥ 3× the Go SDK with its event store", metric: "stream_events_per_s", target: "relay-minimal", against: "gosdk-store", atLeast: 3},
	{what: "stream: relay-minimal ≥ 3× the Go SDK without a store", metric: "stream_events_per_s", target: "relay-minimal", against: "gosdk", atLeast: 3},
	{what: "stream: relay-minimal ≥ 50% of raw net/http flushing after every event", metric: "stream_events_per_s", target: "relay-minimal", against: "raw", atLeast: 0.5},
	{what: "stream: relay-minimal ≥ 1,000,000 events/s on one stream", metric: "stream_events_per_s", target: "relay-minimal", atLeast: 1e6},
	{what: "rt: relay-minimal ≥ 2× mcp-go", metric: "rt_per_s", target: "relay-minimal", against: "mcpgo", atLeast: 2},
	{what: "rt: relay-example within 15% of the Go SDK reached directly", metric: "rt_per_s", target: "relay-example", against: "gosdk", atLeast: 0.85},
	{what: "rt: relay-minimal ≥ mcp-go (issue 14)", metric: "rt_per_s", target: "relay-minimal", against: "mcpgo", atLeast: 1},
	{what: "rt: relay-example within 10% of the Go SDK reached directly (issue 14)", metric: "rt_per_s", target: "relay-example", against: "gosdk", atLeast: 0.9},
	{what: "rt: relay-disk (serve's durable default) ≥ 70% of relay-example (memory store) (issue 14)", metric: "rt_per_s", target: "relay-disk", against: "relay-example", atLeast: 0.7},
	{what: "resume: relay-minimal first replayed event p99 ≤ 1 ms", metric: "resume_first_p99_ms", target: "relay-minimal", atMost: 1},
	{what: "resume: relay-minimal replay ≥ 1,000,000 events/s", metric: "resume_per_s", target: "relay-minimal", atLeast: 1e6},
	{what: "idle: relay-minimal heap per idle session ≤ 2 KiB", metric: "session_heap_B", target: "relay-minimal", atMost: 2048},
	{what: "idle: relay-minimal heap per idle GET stream ≤ 2 KiB above raw", metric: "stream_heap_B", target: "relay-minimal", atMost: 2048, aboveBase: true},
	{what: "idle: relay-example (the Go SDK behind it) heap per idle session ≤ 6 KiB (issue 14)", metric: "session_heap_B", target: "relay-example", atMost: 6144},
	{what: "idle: relay-disk (serve's default, the Go SDK behind it) heap per idle session ≤ 6 KiB (issue 14)", metric: "session_heap_B", target: "relay-disk", atMost: 6144},
	{what: "idle: relay-redis (a replica, the Go SDK behind it) heap per idle session ≤ 6 KiB (issue 14)", metric: "session_heap_B", target: "relay-redis", atMost: 6144},
}

// goalRows renders the goals a run can judge.
func (r *results) goalRows() [][]string {
	out := [][]string{{"goal", "measured", "met"}}
	for _, g := range goals {
		v, ok := r.get(g.target, g.metric)
		if !ok {
			continue
		}
		var got float64
		var shown string
		switch {
		case g.aboveBase:
			b, ok := r.get(baseline, g.metric)
			if !ok {
				continue
			}
			got = v - b
			shown = num(got) + " B"
		case g.against != "":
			b, ok := r.get(g.against, g.metric)
			if !ok || b == 0 {
				continue
			}
			got = v / b
			shown = strconv.FormatFloat(got, 'f', 2, 64) + "×"
		default:
			got = v
			shown = num(v)
			if strings.HasSuffix(g.metric, "_ms") {
				shown = msf(v) + " ms"
			}
		}
		met := (g.atLeast == 0 || got >= g.atLeast) && (g.atMost == 0 || got <= g.atMost)
		out = append(out, []string{g.what, shown, map[bool]string{true: "yes", false: "**no**"}[met]})
	}
	lost := 0.0
	for _, ms := range r.Summary {
		for k, v := range ms {
			if strings.HasSuffix(k, "_lost") {
				lost += v
			}
		}
	}
	// Every mcprelay target counts: relay-redis lost events for two
	// sessions of bench runs while only relay-minimal and relay-example
	// were summed here.
	zero := 0.0
	for name, ms := range r.Summary {
		if !strings.HasPrefix(name, "relay-") {
			continue
		}
		for k, v := range ms {
			if strings.HasSuffix(k, "_lost") {
				zero += v
			}
		}
	}
	out = append(out, []string{"zero lost events through mcprelay (every relay-* target, all workloads, all runs)", num(zero), map[bool]string{true: "yes", false: "**no**"}[zero == 0]})
	out = append(out, []string{"zero lost events everywhere (all targets)", num(lost), map[bool]string{true: "yes", false: "**no** (see the tables)"}[lost == 0]})
	return out
}
