package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freeAddr returns a loopback address nothing listens on (now).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeOpsEndpoints: serve with --metrics-addr answers /metrics there
// (not on --addr), /healthz and /readyz on both; an upstream that cannot
// be reached makes /readyz 503.
func TestServeOpsEndpoints(t *testing.T) {
	addr, metricsAddr, upstream := freeAddr(t), freeAddr(t), freeAddr(t)
	done := make(chan error, 1)
	go func() {
		done <- serve([]string{"--addr", addr, "--metrics-addr", metricsAddr, "--store", "memory",
			"--upstream", "http://" + upstream + "/mcp", "--log-level", "error", "--access-log", "off"})
	}()
	// serve listens once it is set up: poll its port (nothing else to
	// synchronise on), giving up after a minute.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("serve returned: %v", err)
		default:
		}
		if c, err := net.Dial("tcp", metricsAddr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("serve did not listen within a minute")
		}
	}
	for _, base := range []string{"http://" + addr, "http://" + metricsAddr} {
		if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
			t.Errorf("%s/healthz: %d %q", base, code, body)
		}
		if code, body := get(t, base+"/readyz"); code != 503 || body != "not ready: upstream unreachable\n" {
			t.Errorf("%s/readyz with no upstream: %d %q", base, code, body)
		}
	}
	if code, body := get(t, "http://"+metricsAddr+"/metrics"); code != 200 || !strings.Contains(body, "mcprelay_sessions 0") {
		t.Errorf("/metrics on --metrics-addr: %d %q", code, body)
	}
	if code, _ := get(t, "http://"+addr+"/metrics"); code != 404 {
		t.Errorf("/metrics on --addr with --metrics-addr set: %d, want 404", code)
	}
	// serve stops on SIGTERM (it has registered for it: it is serving).
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("serve did not stop on SIGTERM")
	}
}

func TestParseAccessLog(t *testing.T) {
	for _, v := range []string{"off", "debug", "info"} {
		if _, err := parseAccessLog(v); err != nil {
			t.Errorf("--access-log %s: %v", v, err)
		}
	}
	if _, err := parseAccessLog("loud"); err == nil || !strings.Contains(err.Error(), "off, debug or info") {
		t.Errorf("--access-log loud: %v, want a clear error", err)
	}
}
