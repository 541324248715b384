// Command mcpbench measures mcprelay against its peers and against the
// machine's limit, in one run: each workload against each target on
// loopback, every target in a server process of its own, medians of several
// runs, ratios to the raw net/http baseline measured in the same run.
//
//	go run ./cmd/mcpbench -md ../docs/performance.md -json results.json
//	go run ./cmd/mcpbench -quick                # CI smoke, under a minute
//	go run ./cmd/mcpbench -targets relay-minimal -workloads stream -runs 1 -cpuprofile /tmp/prof
//	go run ./cmd/mcpbench -targets relay-stdio,supergateway -workloads rt,first,mem -runs 3
//
// Targets: raw, raw-batched, relay-example, relay-minimal, relay-disk,
// relay-stdio, relay-redis, relay-redis3, gosdk, gosdk-store, mcpgo,
// mcpgo-store, supergateway (Node; npm ci in node/ first). Workloads: rt
// (tools/call round trips on concurrent sessions), stream (one call
// streaming many notifications), streams (many such calls at once), resume
// (a cursor far back), idle (idle sessions, then one idle GET stream each;
// resume runs with them open; Go servers only), first (initialize to the
// first tool result of a new session), mem (resident memory of the server
// process and all its children with idle sessions open).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/mcprelay/mcprelay/bench/load"
)

var workloads = []string{"rt", "stream", "streams", "resume", "idle", "first", "mem"}

type config struct {
	targets, workloads []string
	runs               int
	rtSessions         int
	rtDuration         time.Duration
	streamEvents       int
	streams            int
	streamsEvents      int
	resumeBack         int
	resumeSamples      int
	idleSessions       int
	idleStreams        bool
	firstSamples       int
	memSessions        int
	benchDir           string
	timeout            time.Duration
	cpuprofile         string
	blockprofile       string
	memprofile         string
	jsonOut, mdOut     string
	mdAppend           string
	verbose            bool
	server             serverConfig
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mcpbench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mcpbench", flag.ContinueOnError)
	var (
		cfg        config
		targetList = fs.String("targets", "all", "comma-separated targets, or all")
		workList   = fs.String("workloads", "all", "comma-separated workloads (rt, stream, streams, resume, idle, first, mem), or all")
		quick      = fs.Bool("quick", false, "small counts for a smoke run under a minute (overrides the count flags)")
		serve      = fs.String("serve", "", "internal: serve this target (a server process)")
		renderJSON = fs.String("render", "", "do not run: rebuild the table and -md report from this -json file")
		addr       = fs.String("addr", "127.0.0.1:0", "internal: listen address of -serve")
	)
	fs.IntVar(&cfg.runs, "runs", 3, "runs of every workload against every target; medians are reported")
	fs.IntVar(&cfg.rtSessions, "rt-sessions", 32, "rt: concurrent sessions")
	fs.DurationVar(&cfg.rtDuration, "rt-duration", 3*time.Second, "rt: how long each run calls")
	fs.IntVar(&cfg.streamEvents, "stream-events", 100_000, "stream: notifications streamed by the one call")
	fs.IntVar(&cfg.streams, "streams", 64, "streams: concurrent calls, one session each")
	fs.IntVar(&cfg.streamsEvents, "streams-events", 5_000, "streams: notifications per call")
	fs.IntVar(&cfg.resumeBack, "resume-back", 10_000, "resume: how many events back the cursor is")
	fs.IntVar(&cfg.resumeSamples, "resume-samples", 50, "resume: resumes per run")
	fs.IntVar(&cfg.idleSessions, "idle-sessions", 10_000, "idle: initialized sessions (and GET streams)")
	fs.BoolVar(&cfg.idleStreams, "idle-streams", true, "idle: also open one idle GET stream per session")
	fs.IntVar(&cfg.firstSamples, "first-samples", 20, "first: new sessions per run, one after another")
	fs.IntVar(&cfg.memSessions, "mem-sessions", 50, "mem: idle sessions open (each after one call) when the memory is read")
	fs.StringVar(&cfg.benchDir, "bench-dir", ".", "the bench module's directory (supergateway: node/ and peers/node/)")
	fs.DurationVar(&cfg.timeout, "timeout", 2*time.Minute, "bound on each workload run")
	fs.StringVar(&cfg.cpuprofile, "cpuprofile", "", "write each server process's CPU profile to PREFIX.TARGET.PHASE.pprof (last run wins)")
	fs.StringVar(&cfg.blockprofile, "blockprofile", "", "write each server process's block and mutex profiles to PREFIX.TARGET.PHASE.{block,mutex}.pprof (last run wins; sampling slows the server)")
	fs.StringVar(&cfg.memprofile, "memprofile", "", "write each server process's heap profile with the idle sessions and streams open to PREFIX.TARGET.idle.heap.pprof")
	clientProfile := fs.String("client-cpuprofile", "", "write the load client's own CPU profile (this process, all targets and runs) to this file")
	fs.StringVar(&cfg.jsonOut, "json", "", "write results as JSON to this file (- for stdout)")
	fs.StringVar(&cfg.mdOut, "md", "", "write the Markdown report (docs/performance.md) to this file")
	fs.StringVar(&cfg.mdAppend, "md-append", "", "append this Markdown file to the report (hand-written notes)")
	fs.BoolVar(&cfg.verbose, "v", false, "show progress and the server processes' stderr")
	fs.IntVar(&cfg.server.relayRetainEvents, "relay-retain-events", 20_000, "mcprelay targets: events kept per session (mcprelay serve: 10000)")
	fs.Int64Var(&cfg.server.relayRetainBytes, "relay-retain-bytes", 64<<20, "mcprelay targets: bytes kept per session (mcprelay serve: 8 MiB)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *serve == stdioChild {
		return serveStdioChild()
	}
	if *serve != "" {
		return serveTarget(*serve, *addr, profiles{cpu: cfg.cpuprofile, block: cfg.blockprofile}, cfg.server)
	}
	if *renderJSON != "" {
		return render(*renderJSON, cfg)
	}
	if *quick {
		cfg.runs = 1
		cfg.rtSessions, cfg.rtDuration = 8, 300*time.Millisecond
		cfg.streamEvents = 5_000
		cfg.streams, cfg.streamsEvents = 8, 500
		cfg.resumeBack, cfg.resumeSamples = 1_000, 5
		cfg.idleSessions = 200
		cfg.firstSamples, cfg.memSessions = 3, 5
		cfg.timeout = 20 * time.Second
	}
	if *clientProfile != "" {
		stop, err := startCPUProfile(*clientProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	var err error
	if cfg.targets, err = pick(*targetList, names(), "target"); err != nil {
		return err
	}
	if cfg.workloads, err = pick(*workList, workloads, "workload"); err != nil {
		return err
	}
	if cfg.runs < 1 {
		return errors.New("-runs must be at least 1")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	res := newResults()
	res.Command = "mcpbench " + strings.Join(args, " ")
	res.Machine = machine()
	res.Config = cfg.describe()
	start := time.Now()
	for r := range cfg.runs {
		for _, t := range cfg.targets {
			runTarget(exe, cfg, r, t, res)
		}
	}
	res.Duration = time.Since(start).Round(time.Second).String()
	res.summarize(cfg)
	fmt.Print(res.text(cfg))
	if cfg.jsonOut != "" {
		if err := res.writeJSON(cfg.jsonOut); err != nil {
			return err
		}
	}
	if cfg.mdOut != "" {
		if err := res.writeMarkdown(cfg); err != nil {
			return err
		}
	}
	return nil
}

func names() []string {
	var ns []string
	for _, t := range targets {
		ns = append(ns, t.name)
	}
	return ns
}

func pick(list string, all []string, what string) ([]string, error) {
	if list == "all" || list == "" {
		return all, nil
	}
	var out []string
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(all, s) {
			return nil, fmt.Errorf("unknown %s %q (have %s)", what, s, strings.Join(all, ", "))
		}
		out = append(out, s)
	}
	return out, nil
}

func (c config) has(w string) bool { return slices.Contains(c.workloads, w) }

// runConfig is the part of the configuration a report needs, kept in the
// JSON so that -render can rebuild the report from it.
type runConfig struct {
	Runs              int      `json:"runs"`
	Targets           []string `json:"targets"`
	Workloads         []string `json:"workloads"`
	RTSessions        int      `json:"rt_sessions"`
	RTDuration        string   `json:"rt_duration"`
	StreamEvents      int      `json:"stream_events"`
	Streams           int      `json:"streams"`
	StreamsEvents     int      `json:"streams_events"`
	ResumeBack        int      `json:"resume_back"`
	ResumeSamples     int      `json:"resume_samples"`
	IdleSessions      int      `json:"idle_sessions"`
	IdleStreams       bool     `json:"idle_streams"`
	FirstSamples      int      `json:"first_samples,omitempty"`
	MemSessions       int      `json:"mem_sessions,omitempty"`
	RelayRetainEvents int      `json:"relay_retain_events"`
	RelayRetainBytes  int64    `json:"relay_retain_bytes"`
}

func (c config) describe() runConfig {
	return runConfig{
		Runs: c.runs, Targets: c.targets, Workloads: c.workloads,
		RTSessions: c.rtSessions, RTDuration: c.rtDuration.String(),
		StreamEvents: c.streamEvents, Streams: c.streams, StreamsEvents: c.streamsEvents,
		ResumeBack: c.resumeBack, ResumeSamples: c.resumeSamples,
		IdleSessions: c.idleSessions, IdleStreams: c.idleStreams,
		FirstSamples: c.firstSamples, MemSessions: c.memSessions,
		RelayRetainEvents: c.server.relayRetainEvents, RelayRetainBytes: c.server.relayRetainBytes,
	}
}

// apply sets the report-relevant fields of c from rc.
func (rc runConfig) apply(c *config) {
	c.runs, c.targets, c.workloads = rc.Runs, rc.Targets, rc.Workloads
	c.rtSessions = rc.RTSessions
	c.rtDuration, _ = time.ParseDuration(rc.RTDuration)
	c.streamEvents, c.streams, c.streamsEvents = rc.StreamEvents, rc.Streams, rc.StreamsEvents
	c.resumeBack, c.resumeSamples = rc.ResumeBack, rc.ResumeSamples
	c.idleSessions, c.idleStreams = rc.IdleSessions, rc.IdleStreams
	c.firstSamples, c.memSessions = rc.FirstSamples, rc.MemSessions
	c.server.relayRetainEvents, c.server.relayRetainBytes = rc.RelayRetainEvents, rc.RelayRetainBytes
}

// render rebuilds the reports from a -json file of an earlier run.
func render(path string, cfg config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	res := newResults()
	if err := json.Unmarshal(b, res); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	res.Config.apply(&cfg)
	fmt.Print(res.text(cfg))
	if cfg.mdOut != "" {
		return res.writeMarkdown(cfg)
	}
	return nil
}

func (c config) logf(format string, args ...any) {
	if c.verbose {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}

// server is a running server process.
type server struct {
	cmd    *exec.Cmd
	url    string        // http://ADDR
	exited chan struct{} // closed once cmd.Wait returned
}

func startServer(exe string, cfg config, name, phase string) (*server, error) {
	if name == "supergateway" {
		return startSupergateway(exe, cfg.benchDir, cfg.verbose)
	}
	args := []string{"-serve", name, "-addr", "127.0.0.1:0",
		"-relay-retain-events", fmt.Sprint(cfg.server.relayRetainEvents),
		"-relay-retain-bytes", fmt.Sprint(cfg.server.relayRetainBytes)}
	if cfg.cpuprofile != "" {
		args = append(args, "-cpuprofile", cfg.cpuprofile+"."+name+"."+phase+".pprof")
	}
	if cfg.blockprofile != "" {
		args = append(args, "-blockprofile", cfg.blockprofile+"."+name+"."+phase)
	}
	cmd := exec.Command(exe, args...)
	if cfg.verbose {
		cmd.Stderr = os.Stderr
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), listenLine); ok {
				lines <- u
				break
			}
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case u := <-lines:
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		return &server{cmd: cmd, url: u, exited: exited}, nil
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("server process for %s did not start", name)
	}
}

func (s *server) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
}

// treeMem reads the resident memory of the server process and its
// children (stdio servers), for the mem workload.
func (s *server) treeMem() (load.TreeMem, error) { return load.ReadTreeMem(s.cmd.Process.Pid) }

// minCPU is the least CPU time a run must use for its CPU per event to
// be reported: the kernel counts a process's CPU in 10 ms ticks.
const minCPU = 100 * time.Millisecond

// treeCPU reads the CPU time the server process and its children used.
func (s *server) treeCPU() (time.Duration, error) { return load.ReadTreeCPU(s.cmd.Process.Pid) }

// failer records a workload's failure in res (and logs it with -v).
func failer(res *results, cfg config, run int, name string) func(workload string, err error) {
	return func(w string, err error) {
		res.fail(name, w, run, err)
		cfg.logf("  %s %s: %v", name, w, err)
	}
}

// startWarm starts a fresh server process for a phase and warms it up (a
// session and a call; a failed warm-up is recorded, the workloads still
// run). It returns nil when the server did not start (recorded too).
func startWarm(exe string, cfg config, name, phase string, fail func(string, error)) (*server, *load.Client) {
	srv, err := startServer(exe, cfg, name, phase)
	if err != nil {
		fail("start", err)
		return nil, nil
	}
	c := load.NewClient(srv.url + "/mcp")
	if err := warmUp(c, cfg.timeout); err != nil {
		fail("warm-up", err)
	}
	return srv, c
}

// runTarget runs the selected workloads against one target: the throughput
// workloads in one server process, first and mem in another, idle and
// resume in a third.
func runTarget(exe string, cfg config, run int, name string, res *results) {
	t, _ := findTarget(name)
	fail := failer(res, cfg, run, name)
	if cfg.has("rt") || cfg.has("stream") || cfg.has("streams") {
		srv, c := startWarm(exe, cfg, name, "throughput", fail)
		if srv == nil {
			return
		}
		if cfg.has("rt") {
			cfg.logf("run %d %s rt", run+1, name)
			ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
			cpu0, cerr := srv.treeCPU()
			self0, serr := load.SelfCPU()
			r, err := load.RoundTrips(ctx, c, cfg.rtSessions, cfg.rtDuration)
			cpu1, cerr1 := srv.treeCPU()
			self1, serr1 := load.SelfCPU()
			cancel()
			if err != nil {
				fail("rt", err)
			} else {
				m := map[string]float64{
					"rt_per_s": r.PerSec, "rt_p50_ms": ms(r.P50), "rt_p99_ms": ms(r.P99), "rt_errors": float64(r.Errors)}
				if cerr == nil && cerr1 == nil && r.Calls > 0 {
					// The server's CPU per call (its sessions' setup
					// included): steadier than rt/s on a shared machine.
					m["rt_cpu_us"] = float64((cpu1-cpu0)/time.Microsecond) / float64(r.Calls)
				}
				if serr == nil && serr1 == nil && r.Calls > 0 {
					// The load client's, on the same cores: what a
					// server's answer costs its client to read.
					m["rt_client_cpu_us"] = float64((self1-self0)/time.Microsecond) / float64(r.Calls)
				}
				res.add(name, "rt", m)
			}
		}
		streams := func(w string, k, n int) {
			cfg.logf("run %d %s %s (%d×%d)", run+1, name, w, k, n)
			ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
			cpu0, cerr := srv.treeCPU()
			self0, serr := load.SelfCPU()
			r, err := load.Streams(ctx, c, k, n)
			cpu1, cerr1 := srv.treeCPU()
			self1, serr1 := load.SelfCPU()
			cancel()
			if err != nil {
				fail(w, err)
				return
			}
			m := map[string]float64{
				w + "_events_per_s": r.PerSec, w + "_lost": float64(r.Lost), w + "_resets": float64(r.Resets), w + "_errors": float64(r.Errors)}
			// CPU per event received, when the run used enough to
			// measure: /proc counts in 10 ms ticks, so 100 ms is ±10%.
			if cerr == nil && cerr1 == nil && r.Received > 0 && cpu1-cpu0 >= minCPU {
				m[w+"_cpu_ns"] = float64((cpu1-cpu0)/time.Nanosecond) / float64(r.Received)
			}
			if serr == nil && serr1 == nil && r.Received > 0 && self1-self0 >= minCPU {
				m[w+"_client_cpu_ns"] = float64((self1-self0)/time.Nanosecond) / float64(r.Received)
			}
			res.add(name, w, m)
		}
		if cfg.has("stream") {
			streams("stream", 1, cfg.streamEvents)
		}
		if cfg.has("streams") {
			streams("streams", cfg.streams, cfg.streamsEvents)
		}
		c.CloseIdle()
		srv.stop()
	}
	if cfg.has("first") || cfg.has("mem") {
		sessionWorkloads(exe, cfg, run, name, res)
	}
	idle := cfg.has("idle") && !t.external && !t.childPerSession
	switch {
	case t.external && cfg.has("idle"):
		fail("idle", errors.New("no in-process memory figures from a server that is not Go: see the mem workload"))
	case t.childPerSession && cfg.has("idle"):
		fail("idle", fmt.Errorf("not run: a process per session, and %d processes do not fit this machine (a run was killed for memory with 3,600 open): see the mem workload", cfg.idleSessions))
	}
	if !idle && !(cfg.has("resume") && t.resumable) {
		return
	}
	srv, c := startWarm(exe, cfg, name, "idle", fail)
	if srv == nil {
		return
	}
	defer srv.stop()
	defer c.CloseIdle()
	if idle {
		cfg.logf("run %d %s idle (%d sessions)", run+1, name, cfg.idleSessions)
		ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
		r, closeAll, err := load.Idle(ctx, c, cfg.idleSessions, cfg.idleStreams, load.FetchMem(srv.url+"/debug/mem"))
		cancel()
		defer closeAll()
		if err != nil {
			fail("idle", err)
		} else {
			m := map[string]float64{
				"session_heap_B": r.Session.Heap, "session_stack_B": r.Session.Stack,
				"session_rss_B": r.Session.RSS, "session_goroutines": r.Session.Goroutines,
			}
			if r.Streams > 0 {
				m["stream_heap_B"], m["stream_stack_B"] = r.Stream.Heap, r.Stream.Stack
				m["stream_rss_B"], m["stream_goroutines"] = r.Stream.RSS, r.Stream.Goroutines
				m["stream_failed"] = float64(r.Failed)
			}
			res.add(name, "idle", m)
			if cfg.memprofile != "" {
				if err := saveHeapProfile(srv.url+"/debug/heap", cfg.memprofile+"."+name+".idle.heap.pprof"); err != nil {
					fail("memprofile", err)
				}
			}
		}
	}
	if cfg.has("resume") && t.resumable {
		cfg.logf("run %d %s resume", run+1, name)
		ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
		r, err := load.Resume(ctx, c, cfg.resumeBack, max(cfg.resumeBack/10, 100), cfg.resumeSamples, 10*time.Second)
		cancel()
		if err != nil {
			fail("resume", err)
		}
		if r.Samples > 0 && err == nil {
			res.add(name, "resume", map[string]float64{
				"resume_first_p50_ms": ms(r.FirstP50), "resume_first_p99_ms": ms(r.FirstP99),
				"resume_per_s": r.PerSec, "resume_lost": float64(r.Lost), "resume_resets": float64(r.Resets),
				"resume_errors": float64(r.Errors)})
		}
	}
}

// sessionWorkloads runs mem, then first, in a fresh server process: the
// memory is read with nothing open but the warm-up's (deleted) session.
func sessionWorkloads(exe string, cfg config, run int, name string, res *results) {
	fail := failer(res, cfg, run, name)
	srv, c := startWarm(exe, cfg, name, "sessions", fail)
	if srv == nil {
		return
	}
	defer srv.stop()
	defer c.CloseIdle()
	if cfg.has("mem") {
		cfg.logf("run %d %s mem (%d sessions)", run+1, name, cfg.memSessions)
		ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
		r, err := load.SessionMem(ctx, c, cfg.memSessions, srv.treeMem)
		cancel()
		if err != nil {
			fail("mem", err)
		} else {
			res.add(name, "mem", map[string]float64{
				"mem_rss_per_session_B": r.PerSession, "mem_added_per_session_B": r.Added, "mem_server_added_per_session_B": r.RootAdded,
				"mem_rss_before_B": float64(r.Before.RSS), "mem_procs": float64(r.Open.Procs)})
		}
	}
	if cfg.has("first") {
		cfg.logf("run %d %s first (%d sessions)", run+1, name, cfg.firstSamples)
		ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
		r, err := load.First(ctx, c, cfg.firstSamples)
		cancel()
		if err != nil {
			fail("first", err)
		} else {
			res.add(name, "first", map[string]float64{"first_p50_ms": ms(r.P50), "first_p99_ms": ms(r.P99)})
		}
	}
}

func warmUp(c *load.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s, err := c.Initialize(ctx)
	if err != nil {
		return err
	}
	defer s.Delete(ctx)
	return s.Call(ctx, load.ToolSimple)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func saveHeapProfile(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
