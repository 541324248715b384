package main

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcprelay/mcprelay/bench/load"
)

// TestTargets serves every target in process and streams through it.
func TestTargets(t *testing.T) {
	cfg := serverConfig{relayRetainEvents: 1000, relayRetainBytes: 1 << 20}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			if tg.external {
				if _, _, err := handlerFor(tg.name, cfg); err == nil {
					t.Fatal("handlerFor served an external target in process")
				}
				externalTarget(t, tg.name)
				return
			}
			h, stop, err := handlerFor(tg.name, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			srv := httptest.NewServer(h)
			defer srv.Close()
			c := load.NewClient(srv.URL)
			defer c.CloseIdle()
			res, err := load.Streams(t.Context(), c, 2, 40)
			if err != nil {
				t.Fatal(err)
			}
			// mcp-go drops notifications now and then, even this few.
			lossy := strings.HasPrefix(tg.name, "mcpgo")
			if lossy && res.Received > 0 && res.Received+res.Lost == 80 {
				return
			}
			if res.Received != 80 || res.Lost != 0 || res.Errors != 0 {
				t.Errorf("got %+v, want 80 received, none lost", res)
			}
		})
	}
	if _, _, err := handlerFor("nope", cfg); err == nil {
		t.Error("handlerFor accepted an unknown target")
	}
}

// externalTarget runs a target served by another program (supergateway:
// node, from bench/node as scripts/test installs it) with this test binary
// as its stdio child: a stream, first calls, and the memory of the whole
// process tree.
func externalTarget(t *testing.T, name string) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := startServer(exe, config{benchDir: "../.."}, name, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	c := load.NewClient(srv.url + "/mcp")
	defer c.CloseIdle()
	res, err := load.Streams(t.Context(), c, 2, 40)
	if err != nil {
		t.Fatal(err)
	}
	if res.Received != 80 || res.Lost != 0 || res.Errors != 0 {
		t.Errorf("got %+v, want 80 received, none lost", res)
	}
	if _, err := load.First(t.Context(), c, 2); err != nil {
		t.Error(err)
	}
	m, err := load.SessionMem(t.Context(), c, 2, srv.treeMem)
	if err != nil {
		t.Fatal(err)
	}
	// The server and a child per open session, at least.
	if m.Open.Procs < 3 || m.Added <= 0 {
		t.Errorf("memory with 2 sessions open: %+v", m)
	}
}

func TestPick(t *testing.T) {
	all := []string{"a", "b", "c"}
	tests := []struct {
		name    string
		list    string
		want    string
		wantErr bool
	}{
		{"all", "all", "a,b,c", false},
		{"empty means all", "", "a,b,c", false},
		{"subset keeps order given", "c, a", "c,a", false},
		{"unknown", "a,x", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := pick(tt.list, all, "target")
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v", err)
			}
			if strings.Join(got, ",") != tt.want {
				t.Errorf("got %v, want %s", got, tt.want)
			}
		})
	}
}

func TestNum(t *testing.T) {
	tests := []struct {
		name string
		v    float64
		want string
	}{
		{"small", 12, "12"},
		{"thousands", 1234567, "1,234,567"},
		{"rounds", 999.6, "1,000"},
		{"negative", -12345, "-12,345"},
		{"zero", 0, "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := num(tt.v); got != tt.want {
				t.Errorf("num(%v) = %q, want %q", tt.v, got, tt.want)
			}
		})
	}
}

func TestSummaryAndRatios(t *testing.T) {
	cfg := config{targets: []string{"raw", "relay-minimal", "gosdk"}, workloads: []string{"stream"}, runs: 3, streamEvents: 10}
	r := newResults()
	for _, v := range []float64{100, 300, 200} {
		r.add("raw", "stream", map[string]float64{"stream_events_per_s": v, "stream_lost": 0, "stream_cpu_ns": 10 * v})
	}
	for _, v := range []float64{50, 60, 70} {
		r.add("relay-minimal", "stream", map[string]float64{"stream_events_per_s": v, "stream_lost": 1})
	}
	r.summarize(cfg)
	if got := r.Summary["raw"]["stream_events_per_s"]; got != 200 {
		t.Errorf("median = %v, want 200", got)
	}
	if got := r.Summary["relay-minimal"]["stream_lost"]; got != 3 {
		t.Errorf("lost = %v, want 3 (summed over runs)", got)
	}
	rows := r.rows(cfg, tables[1])
	want := [][]string{
		{"target", "events/s", "× raw", "server CPU ns/event", "client CPU ns/event", "lost", "resets", "errors"},
		{"raw", "200", "1.00×", "2,000", "—", "0", "—", "—"},
		{"relay-minimal", "60", "0.30×", "—", "—", "3", "—", "—"},
		{"gosdk", "—", "—", "—", "—", "—", "—", "—"},
	}
	for i := range want {
		if strings.Join(rows[i], "|") != strings.Join(want[i], "|") {
			t.Errorf("row %d = %v, want %v", i, rows[i], want[i])
		}
	}
	goals := r.goalRows()
	var met string
	for _, g := range goals {
		if strings.Contains(g[0], "50% of raw") {
			met = g[1] + " " + g[2]
		}
	}
	if met != "0.30× **no**" {
		t.Errorf("goal row = %q, want 0.30× **no**", met)
	}
}

func TestRender(t *testing.T) {
	dir := t.TempDir()
	cfg := config{targets: []string{"raw", "gosdk"}, workloads: []string{"rt"}, runs: 1, rtSessions: 32}
	r := newResults()
	r.Command = "mcpbench -workloads rt"
	r.Machine = map[string]string{"cpu": "Test CPU", "nproc": "2", "go": "go1.27.3"}
	r.Config = cfg.describe()
	r.add("raw", "rt", map[string]float64{"rt_per_s": 1000})
	r.add("gosdk", "rt", map[string]float64{"rt_per_s": 250})
	r.summarize(cfg)
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(dir, "r.json")
	os.WriteFile(in, b, 0o644)
	md := filepath.Join(dir, "perf.md")
	if err := run([]string{"-render", in, "-md", md}); err != nil {
		t.Fatal(err)
	}
	out, _ := os.ReadFile(md)
	for _, want := range []string{"Test CPU", "`nproc` 2", "mcpbench -workloads rt", "| gosdk | 250 | 0.25× |"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// TestMain lets the relay-stdio target re-execute this test binary as its
// stdio child, as it does the mcpbench binary.
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == "-serve" && os.Args[2] == stdioChild {
		if err := serveStdioChild(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
