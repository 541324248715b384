// Command mcprelay is a resumable MCP Streamable HTTP front end.
//
//	mcprelay serve                                  # relay in front of the built-in example server
//	mcprelay serve --upstream http://host:3001/mcp  # relay in front of any Streamable HTTP server
//
// Run "mcprelay serve -h" for the flags.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
)

const usage = `usage: mcprelay <command> [flags]

commands:
  serve            run the relay (default: in front of the built-in example server on 127.0.0.1:8080/mcp)
  probe            audit any MCP server URL for unsafe resumption (exit 1 if unsafe)
  sessions         list the sessions of a relay's disk store (read-only)
  example-server   run the built-in example server alone (to put behind "serve --upstream")
  version          print the version, VCS revision and Go version (also --version)

Run "mcprelay <command> -h" for a command's flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "probe":
		err = probeCmd(os.Args[2:])
	case "sessions":
		err = sessionsCmd(os.Args[2:])
	case "example-server":
		err = exampleServer(os.Args[2:])
	case "version", "-version", "--version":
		fmt.Println(version())
		return
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "mcprelay: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "mcprelay:", err)
		os.Exit(1)
	}
}
