package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/backend/stdio"
)

const stdioChildEnv = "MCPRELAY_CMD_TEST_EXAMPLE_STDIO"

// TestExampleServerStdioChild is not a test: re-executed by
// TestExampleServerStdio, it is "mcprelay example-server --stdio".
func TestExampleServerStdioChild(t *testing.T) {
	if os.Getenv(stdioChildEnv) == "" {
		t.Skip("run by TestExampleServerStdio")
	}
	if err := exampleServer([]string{"--stdio", "--log-level", "debug"}); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

// TestExampleServerStdio runs "example-server --stdio" behind the stdio
// connector: initialize and a tool call answer, and the child exits when
// the session is closed.
func TestExampleServerStdio(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts, err := stdioOptions([]string{exe, "-test.run=^TestExampleServerStdioChild$"}, 0, []string{stdioChildEnv + "=1"}, "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := stdio.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s, resp, err := c.Open(ctx, backend.Init{Request: []byte(`{"jsonrpc":"2.0","id":"i","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if !strings.Contains(string(resp), `"id":"i"`) || !strings.Contains(string(resp), `"mcprelay-exampleserver"`) {
		t.Fatalf("initialize response %s", resp)
	}
	s.Notify(t.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	r, err := s.Call(context.Background(), []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_simple_text"}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Next()
	if err != nil || !strings.Contains(string(m), "This is a simple text response for testing.") {
		t.Fatalf("tool call: %s, %v", m, err)
	}
	s.Close()
	if n := c.Children(); n != 0 {
		t.Fatalf("%d children after Close", n)
	}
}

func TestStdioOptions(t *testing.T) {
	f := filepath.Join(t.TempDir(), "env")
	os.WriteFile(f, []byte("# secrets\nTOKEN=file\nA=1\n"), 0o600)
	o, err := stdioOptions([]string{"npx", "server"}, 8, []string{"TOKEN=flag"}, f, "/srv", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Command, []string{"npx", "server"}) || o.MaxChildren != 8 || o.Dir != "/srv" ||
		!slices.Equal(o.Env, []string{"TOKEN=file", "A=1", "TOKEN=flag"}) {
		t.Fatalf("options %+v", o)
	}
	for _, bad := range []func() error{
		func() error { _, err := stdioOptions(nil, 0, nil, "", "", nil); return err },
		func() error { _, err := stdioOptions([]string{"x"}, -1, nil, "", "", nil); return err },
		func() error { _, err := stdioOptions([]string{"x"}, 0, []string{"NOVALUE"}, "", "", nil); return err },
		func() error { _, err := stdioOptions([]string{"x"}, 0, nil, f+".missing", "", nil); return err },
	} {
		if bad() == nil {
			t.Error("bad options accepted")
		}
	}
	var e envList
	if e.Set("K=V") != nil || e.Set("bad") == nil || e.String() != "K=V" {
		t.Errorf("envList: %q", e)
	}
}
