package main

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/mcprelay/mcprelay/backend/stdio"
)

// envList is a repeatable K=V flag (serve --env).
type envList []string

func (e *envList) String() string { return strings.Join(*e, ",") }

func (e *envList) Set(kv string) error {
	if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
		return fmt.Errorf("want K=V, got %q", kv)
	}
	*e = append(*e, kv)
	return nil
}

// stdioOptions returns the stdio connector's options for
// "mcprelay serve [flags] -- COMMAND ARGS...": command is what follows
// "--", maxChildren is --max-children (0: the connector's default),
// env the --env values, envFile --env-file ("" for none), cwd --cwd.
// Entries of --env come after the file's, so they win.
func stdioOptions(command []string, maxChildren int, env []string, envFile, cwd string, log *slog.Logger) (stdio.Options, error) {
	if len(command) == 0 {
		return stdio.Options{}, fmt.Errorf("serve: no command after --")
	}
	if maxChildren < 0 {
		return stdio.Options{}, fmt.Errorf("serve: --max-children must not be negative, got %d", maxChildren)
	}
	var all []string
	if envFile != "" {
		fromFile, err := stdio.ReadEnvFile(envFile)
		if err != nil {
			return stdio.Options{}, fmt.Errorf("serve: --env-file: %w", err)
		}
		all = append(all, fromFile...)
	}
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return stdio.Options{}, fmt.Errorf("serve: --env wants K=V, got %q", kv)
		}
		all = append(all, kv)
	}
	return stdio.Options{
		Command:     command,
		Env:         all,
		Dir:         cwd,
		MaxChildren: maxChildren,
		Logger:      log,
	}, nil
}
