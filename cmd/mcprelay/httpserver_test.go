package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// startServer serves h through newServer on a loopback port.
func startServer(t *testing.T, h http.Handler, bodyTimeout time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(h, bodyTimeout)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// echoThenStream reads the whole body like the relay does, then streams
// SSE for streamFor, failing the stream if the request context ends early.
func echoThenStream(streamFor time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: got %d bytes\n\n", len(body))
		http.NewResponseController(w).Flush()
		select {
		case <-time.After(streamFor):
			fmt.Fprint(w, "data: end\n\n")
		case <-r.Context().Done():
			fmt.Fprint(w, "data: cancelled\n\n")
		}
	})
}

// TestSlowBodyIsCutOff: a client that sends its body at one byte per
// 100ms must not hold the connection past the body timeout.
func TestSlowBodyIsCutOff(t *testing.T) {
	const timeout = 300 * time.Millisecond
	addr := startServer(t, echoThenStream(0), timeout)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n", addr)
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := c.Write([]byte("x")); err != nil {
				return
			}
		}
	}()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	elapsed := time.Since(start)
	if err != nil {
		// The server may also just close the connection.
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("a 10 bytes/s body still held the connection after %v (body timeout %v)", elapsed, timeout)
		}
		t.Logf("connection closed after %v: %v", elapsed, err)
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("slow body answered %s, want 400", resp.Status)
	}
	if elapsed > timeout+2*time.Second {
		t.Errorf("slow body answered after %v, want about %v", elapsed, timeout)
	}
}

// TestBodyDeadlineDoesNotCutStreams: once the body is read, the deadline
// is gone; a response streaming well past it is neither cut nor cancelled.
func TestBodyDeadlineDoesNotCutStreams(t *testing.T) {
	const timeout = 200 * time.Millisecond
	addr := startServer(t, echoThenStream(4*timeout), timeout)
	resp, err := http.Post("http://"+addr+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if want := "data: got 17 bytes\n\ndata: end\n\n"; string(b) != want {
		t.Errorf("stream = %q, want %q", b, want)
	}
	// A GET (no body) streams without any deadline either.
	resp, err = http.Get("http://" + addr + "/mcp")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "data: got 0 bytes\n\ndata: end\n\n"; string(b) != want {
		t.Errorf("GET stream = %q, want %q", b, want)
	}
}

func TestServerTimeouts(t *testing.T) {
	srv := newServer(http.NotFoundHandler(), bodyTimeout)
	if srv.ReadTimeout != 0 || srv.WriteTimeout != 0 {
		t.Errorf("ReadTimeout %v, WriteTimeout %v: either would cut SSE streams", srv.ReadTimeout, srv.WriteTimeout)
	}
	if srv.ReadHeaderTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Errorf("ReadHeaderTimeout %v, IdleTimeout %v: want both set", srv.ReadHeaderTimeout, srv.IdleTimeout)
	}
}
