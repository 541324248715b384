package stdio_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/backend/connectortest"
	"github.com/mcprelay/mcprelay/backend/stdio"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// childEnv selects what the re-executed test binary does instead of
// running the tests.
const childEnv = "MCPRELAY_STDIO_TEST_CHILD"

func TestMain(m *testing.M) {
	switch mode := os.Getenv(childEnv); mode {
	case "":
		os.Exit(m.Run())
	case "serve":
		serve()
	case "ignore-term": // stops for SIGKILL only
		signal.Ignore(syscall.SIGTERM)
		linger()
	case "noisy":
		fmt.Fprintln(os.Stderr, strings.Repeat("x", 10000))
		for i := range 500 {
			fmt.Fprintf(os.Stderr, "noise %d\n", i)
		}
		fmt.Fprintln(os.Stderr, "last noise")
		serve()
	default:
		if f := childModes[mode]; f != nil {
			f()
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", childEnv, mode)
		os.Exit(2)
	}
}

// childModes holds the modes defined next to the tests that use them.
var childModes = map[string]func(){}

// linger serves until stdin ends, then goes on running.
func linger() {
	connectortest.Server(nil).Run(context.Background(), &mcp.StdioTransport{})
	for {
		time.Sleep(time.Hour) // not select{}: the runtime would end a process with nothing left to run
	}
}

func serve() {
	if err := connectortest.Server(nil).Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// self is a command that re-executes this test binary in mode.
func self(t testing.TB, mode string) ([]string, []string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe}, []string{childEnv + "=" + mode}
}

func newConnector(t testing.TB, mode string, opts stdio.Options) *stdio.Connector {
	t.Helper()
	opts.Command, opts.Env = self(t, mode)
	c, err := stdio.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		if n := c.Children(); n != 0 {
			t.Errorf("after Close, %d children", n)
		}
	})
	return c
}

func kill(t *testing.T, s backend.Session) {
	t.Helper()
	if err := syscall.Kill(s.(*stdio.Session).PID(), syscall.SIGKILL); err != nil {
		t.Fatalf("kill: %v", err)
	}
}

func TestConnector(t *testing.T) {
	connectortest.Run(t, func(t *testing.T) connectortest.Harness {
		return connectortest.Harness{Connector: newConnector(t, "serve", stdio.Options{}), Lose: kill}
	})
}
