package crashtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/pebblestore"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/mcprelay/mcprelay/resume"
	"github.com/mcprelay/mcprelay/sse"
)

// relayBin is the mcprelay binary built once by TestMain ("" under -short).
var relayBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "crashtest-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashtest:", err)
		os.Exit(1)
	}
	relayBin = filepath.Join(dir, "mcprelay")
	// The binary is built without -race: the relay under test runs at full
	// speed; the race detector watches this test's own clients.
	build := exec.Command("go", "build", "-o", relayBin, "github.com/mcprelay/mcprelay/cmd/mcprelay")
	build.Env = os.Environ() // GOTOOLCHAIN inherited
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "crashtest: building mcprelay: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// needBinary skips the test under -short.
func needBinary(t *testing.T) {
	t.Helper()
	if testing.Short() || relayBin == "" {
		t.Skip("crash tests run real processes; skipped under -short")
	}
}

// relayProc is `mcprelay serve` on the disk store as a real process, killed
// and restarted on the same port and data directory. start and kill are
// called by the test goroutine only; epoch and waitEpoch by any goroutine.
type relayProc struct {
	t       *testing.T
	name    string
	addr    string
	dataDir string
	logDir  string
	args    []string // serve's arguments besides --addr

	cmd    *exec.Cmd
	exited chan struct{}
	starts int

	mu      sync.Mutex
	epoch   int           // number of successful starts
	changed chan struct{} // closed and replaced when epoch grows
}

// newRelay starts the relay on a free loopback port with a fresh data dir
// and --sync always.
func newRelay(t *testing.T) *relayProc {
	t.Helper()
	return newRelaySync(t, "always")
}

// newRelaySync is newRelay with the given --sync policy and more flags.
func newRelaySync(t *testing.T, sync string, flags ...string) *relayProc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	tmp := t.TempDir()
	p := &relayProc{t: t, name: "relay", addr: addr, dataDir: filepath.Join(tmp, "data"), logDir: tmp, changed: make(chan struct{})}
	p.args = append([]string{"--data-dir", p.dataDir, "--sync", sync, "--log-level", "warn"}, flags...)
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			p.dumpLogs()
		}
	})
	p.start()
	return p
}

func (p *relayProc) url() string { return "http://" + p.addr + "/mcp" }

// start runs a new relay process and waits until it accepts connections.
func (p *relayProc) start() {
	p.t.Helper()
	p.starts++
	logf, err := os.Create(filepath.Join(p.logDir, fmt.Sprintf("%s-%02d.log", p.name, p.starts)))
	if err != nil {
		p.t.Fatal(err)
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(relayBin, append([]string{"serve", "--addr", p.addr}, p.args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("starting mcprelay: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited

	// The relay listens only after it opened the store; poll the port (an
	// external process: there is nothing to synchronise on but the socket).
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			p.dumpLogs()
			p.t.Fatalf("mcprelay (start %d) exited before listening: %v", p.starts, cmd.ProcessState)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("mcprelay (start %d) not listening on %s after 15s: %v", p.starts, p.addr, err)
		}
	}
	p.mu.Lock()
	p.epoch++
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// kill sends SIGKILL to the running process, if any, and waits for it.
func (p *relayProc) kill() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}

// current returns the number of starts so far.
func (p *relayProc) current() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.epoch
}

// waitEpoch waits until the relay was started after epoch e (a request made
// during e failed because that process died).
func (p *relayProc) waitEpoch(ctx context.Context, e int) error {
	for {
		p.mu.Lock()
		cur, ch := p.epoch, p.changed
		p.mu.Unlock()
		if cur > e {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// codec reads the relay secret the process persisted and returns the event
// ID codec it mints with.
func (p *relayProc) codec() *resume.Codec {
	p.t.Helper()
	secret, err := os.ReadFile(filepath.Join(p.dataDir, "secret"))
	if err != nil {
		p.t.Fatal(err)
	}
	c, err := resume.NewCodec(secret)
	if err != nil {
		p.t.Fatal(err)
	}
	return c
}

// openStore opens the event log on disk; the relay must be dead.
func (p *relayProc) openStore() *pebblestore.Store {
	p.t.Helper()
	if p.cmd != nil {
		p.t.Fatal("openStore while the relay runs")
	}
	st, err := pebblestore.Open(filepath.Join(p.dataDir, "events"), pebblestore.Options{})
	if err != nil {
		p.t.Fatalf("opening the relay's event log: %v", err)
	}
	p.t.Cleanup(func() { st.Close() })
	return st
}

func (p *relayProc) dumpLogs() {
	files, _ := filepath.Glob(filepath.Join(p.logDir, p.name+"-*.log"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if len(b) > 4000 {
			b = append([]byte("…"), b[len(b)-4000:]...)
		}
		if len(b) > 0 {
			p.t.Logf("%s:\n%s", filepath.Base(f), b)
		}
	}
}

// readLog returns every event the log holds for stream key.
func readLog(ctx context.Context, st eventlog.Store, key string) (eventlog.Stream, []eventlog.Event, error) {
	return st.Read(ctx, key, 0, math.MaxInt32, nil)
}

// Raw HTTP, to observe exactly what the relay sends.

const protocolVersion = "2025-11-25" // streams start with a priming event: a cursor from the first byte

// httpClient opens a new connection per request: after a kill -9 a pooled
// connection is dead, and a POST on it would fail without having been sent.
var httpClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// do sends one request; hdr values that are "" are left out.
func do(ctx context.Context, url, method string, hdr map[string]string, body string) (*http.Response, error) {
	req, err := mcptest.NewRequest(ctx, method, url, hdr, body)
	if err != nil {
		return nil, err
	}
	return httpClient.Do(req)
}

// initialize opens a session and returns its ID.
func initialize(ctx context.Context, url string) (string, error) {
	return initializeWith(ctx, url, "{}")
}

func sessionHeaders(sid, lastEventID string) map[string]string {
	return map[string]string{"Mcp-Session-Id": sid, "Mcp-Protocol-Version": protocolVersion, "Last-Event-ID": lastEventID}
}

// callBody is a tools/call of the example server's stream_progress.
func callBody(id, token string, count, intervalMS int) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%q,"method":"tools/call","params":{"name":"stream_progress","arguments":{"count":%d,"interval_ms":%d},"_meta":{"progressToken":%q}}}`,
		id, count, intervalMS, token)
}

// errCut means the connection broke (the relay died): resume.
var errCut = errors.New("crashtest: stream cut")

// scan reads resp's SSE events into fn until the stream ends (nil), is cut
// (errCut) or fn returns false (nil).
func scan(resp *http.Response, fn func(sse.Event) bool) error {
	sc := sse.NewScanner(resp.Body)
	for {
		ev, err := sc.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %v", errCut, err)
		}
		if !fn(ev) {
			return nil
		}
	}
}

// logText returns everything the process's starts logged.
func (p *relayProc) logText() string {
	files, _ := filepath.Glob(filepath.Join(p.logDir, p.name+"-*.log"))
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		b.Write(data)
	}
	return b.String()
}
