package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/mcprelay/mcprelay/probe"
)

// errUnsafe makes main exit with status 1 after the report was written.
var errUnsafe = errors.New("probe: the server is UNSAFE (see the report)")

// headerFlags collects repeated --header K:V flags.
type headerFlags http.Header

func (h headerFlags) String() string { return "" }

func (h headerFlags) Set(v string) error {
	k, val, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(k) == "" {
		return fmt.Errorf("want K:V, got %q", v)
	}
	http.Header(h).Add(strings.TrimSpace(k), strings.TrimSpace(val))
	return nil
}

func probeCmd(args []string) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: mcprelay probe URL [flags]\n\nAudits the MCP Streamable HTTP server at URL for unsafe resumption.\nExit status 1 when any case is UNSAFE.\n\n")
		fs.PrintDefaults()
	}
	var (
		toolName  = fs.String("tool", "", "tool to call for events (default: discover one via tools/list)")
		toolArgs  = fs.String("args", "", "the tool's arguments, a JSON object (default: chosen from its input schema)")
		maxEvents = fs.Int("max-events", probe.DefaultMaxEvents, "most events requested to outrun the server's retention (evicted-cursor case)")
		timeout   = fs.Duration("timeout", probe.DefaultTimeout, "timeout of every request; a resume still open after it is a hang")
		asJSON    = fs.Bool("json", false, "write the report as JSON")
		version   = fs.String("protocol-version", probe.DefaultProtocolVersion, "protocol version offered in initialize")
		header    = headerFlags{}
	)
	fs.Var(header, "header", "header `K:V` sent with every request (repeatable), e.g. Authorization:Bearer ...")
	// Accept flags after the URL as well as before it.
	var url string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		url, args = args[0], args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if url == "" && fs.NArg() > 0 {
		url = fs.Arg(0)
		if err := parseFlags(fs, fs.Args()[1:]); err != nil {
			return err
		}
	}
	if url == "" || fs.NArg() > 0 {
		fs.Usage()
		return errors.New("probe: want exactly one URL")
	}
	opts := probe.Options{
		Tool: *toolName, MaxEvents: *maxEvents, Timeout: *timeout,
		ProtocolVersion: *version, Header: http.Header(header),
	}
	if *toolArgs != "" {
		if !json.Valid([]byte(*toolArgs)) {
			return fmt.Errorf("probe: --args is not valid JSON: %s", *toolArgs)
		}
		opts.Args = json.RawMessage(*toolArgs)
	}
	rep, err := probe.Run(context.Background(), url, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := rep.WriteText(os.Stdout); err != nil {
		return err
	}
	if rep.Unsafe() {
		return errUnsafe
	}
	return nil
}
