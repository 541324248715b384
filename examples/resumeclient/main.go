// Command resumeclient is a small MCP client built on the resuming
// transport of package client. It connects to the server URL given as its
// last argument, lists the tools, and calls the ones it knows
// (add_numbers, test_reconnection), which is what the official conformance
// suite's client scenarios initialize, tools_call and sse-retry expect:
//
//	npx -y -p node@22 -p @modelcontextprotocol/conformance@0.1.16 -- \
//		conformance client --command "/path/to/resumeclient" --scenario sse-retry
//
// The suite passes the URL as the last argument and the scenario name in
// MCP_CONFORMANCE_SCENARIO. Logs go to stderr (-v for debug).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/mcprelay/mcprelay/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	verbose := flag.Bool("v", false, "debug logging")
	flag.Parse()
	if flag.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: resumeclient [-v] URL")
		os.Exit(2)
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := run(flag.Arg(flag.NArg()-1), log); err != nil {
		log.Error("failed", "err", err)
		os.Exit(1)
	}
}

func run(url string, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	t := client.New(client.Options{Endpoint: url, Logger: log})
	c := mcp.NewClient(&mcp.Implementation{Name: "mcprelay-resumeclient", Version: "0.1.0"}, nil)
	cs, err := c.Connect(ctx, t, nil)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer cs.Close()
	log.Info("connected", "session", cs.ID(), "scenario", os.Getenv("MCP_CONFORMANCE_SCENARIO"))

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		return fmt.Errorf("tools/list: %w", err)
	}
	for _, tool := range tools.Tools {
		var args map[string]any
		switch tool.Name {
		case "add_numbers":
			args = map[string]any{"a": 5, "b": 3}
		case "test_reconnection":
			args = map[string]any{}
		default:
			continue
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool.Name, Arguments: args})
		if client.IsLost(err) {
			return fmt.Errorf("tools/call %s: lost: %w", tool.Name, err)
		}
		if err != nil {
			return fmt.Errorf("tools/call %s: %w", tool.Name, err)
		}
		for _, ct := range res.Content {
			if tc, ok := ct.(*mcp.TextContent); ok {
				fmt.Printf("%s: %s\n", tool.Name, tc.Text)
			}
		}
		if res.IsError {
			return errors.New("tools/call " + tool.Name + ": tool reported an error")
		}
	}
	return nil
}
