package load_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/bench/load"
	"github.com/mcprelay/mcprelay/bench/peers"
)

func newServer(t *testing.T, h http.Handler) *load.Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := load.NewClient(srv.URL)
	t.Cleanup(c.CloseIdle)
	return c
}

// sseServer answers initialize with a session and every tools/call with
// body as an SSE stream.
func sseServer(body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(b), `"initialize"`):
			w.Header().Set("Mcp-Session-Id", "s1")
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25"}}`)
		case strings.Contains(string(b), `"tools/call"`):
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, body)
		default:
			w.WriteHeader(http.StatusAccepted)
		}
	})
}

const (
	progress = `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1}}`
	response = `{"jsonrpc":"2.0","id":1,"result":{}}`
)

func TestStreamCounting(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		keep     int
		want     load.StreamStats
		wantErr  bool
		wantKept string
	}{
		{
			name: "progress then response",
			body: "id: a\ndata: " + progress + "\n\nid: b\ndata: " + progress + "\n\nid: c\ndata: " + response + "\n\n",
			keep: 2, want: load.StreamStats{Progress: 2, Response: true}, wantKept: "b",
		},
		{
			name: "priming event with empty data is not an event",
			body: "id: p\ndata:\n\ndata: " + progress + "\n\ndata: " + response + "\n\n",
			want: load.StreamStats{Progress: 1, Response: true},
		},
		{
			name: "reset is counted, not taken for data",
			body: "event: reset\ndata: {\"reason\":\"gap\"}\n\ndata: " + progress + "\n\ndata: " + response + "\n\n",
			want: load.StreamStats{Progress: 1, Resets: 1, Response: true},
		},
		{
			name: "CRLF line endings",
			body: "id: 1\r\ndata: " + progress + "\r\n\r\ndata: " + response + "\r\n\r\n",
			keep: 1, want: load.StreamStats{Progress: 1, Response: true}, wantKept: "1",
		},
		{
			name: "a data line longer than the read buffer",
			body: "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"x\":\"" + strings.Repeat("x", 100<<10) + "\"}}\n\ndata: " + response + "\n\n",
			want: load.StreamStats{Progress: 1, Response: true},
		},
		{
			name: "stream ends without the response",
			body: "data: " + progress + "\n\n",
			want: load.StreamStats{Progress: 1}, wantErr: true,
		},
		{
			name: "error response",
			body: "data: " + progress + "\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-1,\"message\":\"queue full\"}}\n\n",
			want: load.StreamStats{Progress: 1, Response: true}, wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newServer(t, sseServer(tt.body))
			s, err := c.Initialize(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Stream(t.Context(), 5, tt.keep)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if got.Progress != tt.want.Progress || got.Resets != tt.want.Resets || got.Response != tt.want.Response {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			if got.KeptID != tt.wantKept {
				t.Errorf("KeptID = %q, want %q", got.KeptID, tt.wantKept)
			}
		})
	}
}

func TestStreamsCountsLostEvents(t *testing.T) {
	// The server sends 3 of the 5 notifications asked for.
	body := strings.Repeat("data: "+progress+"\n\n", 3) + "data: " + response + "\n\n"
	c := newServer(t, sseServer(body))
	res, err := load.Streams(t.Context(), c, 4, 5)
	if err != nil {
		t.Fatal(err)
	}
	if res.Received != 12 || res.Lost != 8 || res.Errors != 0 {
		t.Errorf("got %+v, want 12 received, 8 lost, 0 errors", res)
	}
}

func TestWorkloadsAgainstMinimal(t *testing.T) {
	c := newServer(t, peers.Minimal(peers.MinimalOptions{}))
	ctx := t.Context()
	t.Run("round trips", func(t *testing.T) {
		res, err := load.RoundTrips(ctx, c, 4, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if res.Calls == 0 || res.Errors != 0 || res.P50 <= 0 || res.P99 < res.P50 {
			t.Errorf("got %+v", res)
		}
	})
	t.Run("streams", func(t *testing.T) {
		res, err := load.Streams(ctx, c, 3, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if res.Received != 3000 || res.Lost != 0 || res.Errors != 0 || res.PerSec <= 0 {
			t.Errorf("got %+v", res)
		}
	})
	t.Run("resume", func(t *testing.T) {
		res, err := load.Resume(ctx, c, 500, 50, 3, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if res.Lost != 0 || res.Errors != 0 || res.FirstP99 <= 0 || res.PerSec <= 0 {
			t.Errorf("got %+v", res)
		}
	})
	t.Run("idle", func(t *testing.T) {
		mem := func(context.Context) (load.Mem, error) { return load.ReadMem(), nil }
		res, closeAll, err := load.Idle(ctx, c, 20, true, mem)
		defer closeAll()
		if err != nil {
			t.Fatal(err)
		}
		if res.Streams != 20 || res.Failed != 0 {
			t.Errorf("got %+v, want 20 streams open", res)
		}
		// Each open GET holds a server goroutine (and the client's).
		if res.Stream.Goroutines < 1 {
			t.Errorf("goroutines per stream = %v, want at least 1", res.Stream.Goroutines)
		}
	})
}

func TestSessionWorkloadsAgainstMinimal(t *testing.T) {
	c := newServer(t, peers.Minimal(peers.MinimalOptions{}))
	ctx := t.Context()
	t.Run("first", func(t *testing.T) {
		res, err := load.First(ctx, c, 5)
		if err != nil {
			t.Fatal(err)
		}
		if res.Samples != 5 || res.P50 <= 0 || res.P99 < res.P50 {
			t.Errorf("got %+v", res)
		}
	})
	t.Run("session memory", func(t *testing.T) {
		reads := 0
		mem := func() (load.TreeMem, error) {
			reads++
			return load.ReadTreeMem(os.Getpid())
		}
		res, err := load.SessionMem(ctx, c, 10, mem)
		if err != nil {
			t.Fatal(err)
		}
		if reads != 2 || res.Sessions != 10 || res.Open.RSS == 0 || res.PerSession != float64(res.Open.RSS)/10 {
			t.Errorf("got %+v after %d reads", res, reads)
		}
	})
}

// TestReadTreeMem: a child (in a process group of its own, as stdio
// servers are) counts with its parent.
func TestReadTreeMem(t *testing.T) {
	alone, err := load.ReadTreeMem(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	with, err := load.ReadTreeMem(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	child, err := load.ReadTreeMem(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if child.Procs != 1 || child.RSS == 0 || child.Root != child.RSS {
		t.Fatalf("the child alone: %+v", child)
	}
	if with.Procs != alone.Procs+1 {
		t.Errorf("processes: %d with the child, %d without", with.Procs, alone.Procs)
	}
	if _, err := load.ReadTreeMem(1 << 30); err == nil {
		t.Error("a process that does not exist has memory")
	}
}

// TestReadTreeCPU: a child that spins counts with its parent.
func TestReadTreeCPU(t *testing.T) {
	before, err := load.ReadTreeCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var child time.Duration
	for deadline := time.Now().Add(20 * time.Second); child < 50*time.Millisecond; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the spinning child used %v of CPU in 20 s", child)
		}
		if child, err = load.ReadTreeCPU(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	after, err := load.ReadTreeCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after-before < child {
		t.Errorf("the tree used %v more while its child alone used %v", after-before, child)
	}
	if _, err := load.ReadTreeCPU(1 << 30); err == nil {
		t.Error("a process that does not exist has a CPU time")
	}
	// SelfCPU counts this process alone: the child's spinning is not in
	// it, this process's own spinning is.
	self0, err := load.SelfCPU()
	if err != nil {
		t.Fatal(err)
	}
	if self0 >= after {
		t.Errorf("SelfCPU %v, the whole tree %v: the child counted", self0, after)
	}
	for x := 0; ; x++ {
		self, err := load.SelfCPU()
		if err != nil {
			t.Fatal(err)
		}
		if self-self0 >= 20*time.Millisecond {
			break
		}
		if x > 1e10 {
			t.Fatalf("SelfCPU did not grow while this process spun")
		}
	}
}

func TestResumeWithoutReplay(t *testing.T) {
	// NoGET: resumption is answered 405, so there is nothing to measure.
	c := newServer(t, peers.Minimal(peers.MinimalOptions{NoGET: true}))
	_, err := load.Resume(t.Context(), c, 10, 5, 2, time.Second)
	if err == nil {
		t.Fatal("Resume succeeded against a server without GET")
	}
}

func TestQuantile(t *testing.T) {
	ds := func(ns ...int) []time.Duration {
		var out []time.Duration
		for _, n := range ns {
			out = append(out, time.Duration(n))
		}
		return out
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i + 1)
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ds(7), 0.99, 7},
		{"median of odd", ds(1, 2, 3), 0.5, 2},
		{"nearest rank p99 of 100", hundred, 0.99, 99},
		{"p50 of 100", hundred, 0.5, 50},
		{"max", ds(1, 2, 3), 1, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := load.Quantile(tt.sorted, tt.q); got != tt.want {
				t.Errorf("Quantile = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMedian(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		want float64
	}{
		{"one", []float64{3}, 3},
		{"odd unsorted", []float64{9, 1, 5}, 5},
		{"even", []float64{4, 1, 3, 2}, 2.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := load.Median(tt.xs); got != tt.want {
				t.Errorf("Median(%v) = %v, want %v", tt.xs, got, tt.want)
			}
		})
	}
	if got := load.Median(nil); !math.IsNaN(got) {
		t.Errorf("Median(nil) = %v, want NaN", got)
	}
}

func ExampleStreams() {
	srv := httptest.NewServer(peers.Minimal(peers.MinimalOptions{}))
	defer srv.Close()
	c := load.NewClient(srv.URL)
	res, err := load.Streams(context.Background(), c, 2, 1000)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Received, "received,", res.Lost, "lost")
	// Output: 2000 received, 0 lost
}
