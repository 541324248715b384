package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The supergateway target: supergateway (npm, pinned in node/package-lock.json)
// in stateful Streamable HTTP mode in front of the same stdio child as
// relay-stdio (this binary with -serve stdio-child), one child per session.
const (
	supergatewayScript = "node/node_modules/supergateway/dist/index.js"
	bindLocalhost      = "peers/node/bind-localhost.cjs"
)

// startSupergateway runs node with supergateway on a free loopback port;
// dir is the bench module's directory.
func startSupergateway(exe, dir string, verbose bool) (*server, error) {
	dir, err := filepath.Abs(dir) // node reads a bare --require path as a package name
	if err != nil {
		return nil, err
	}
	script := filepath.Join(dir, supergatewayScript)
	if _, err := os.Stat(script); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("supergateway is not installed at %s: run npm ci in %s (scripts/test does)", script, filepath.Join(dir, "node"))
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("supergateway needs Node.js: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logLevel := "none"
	if verbose {
		logLevel = "info"
	}
	cmd := exec.Command(node, "--require", filepath.Join(dir, bindLocalhost), script,
		"--stdio", shellQuote(exe)+" -serve "+stdioChild,
		"--outputTransport", "streamableHttp", "--stateful",
		"--port", strconv.Itoa(port), "--logLevel", logLevel)
	if verbose {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return &server{cmd: cmd, url: "http://" + addr, exited: exited}, nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("supergateway exited before listening (%v); -v shows its output", cmd.ProcessState)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return nil, errors.New("supergateway did not listen within 30 s")
		}
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// shellQuote quotes s for sh (supergateway runs --stdio through a shell).
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
