package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/peterbourgon/ff/v3"
)

// envPrefix prefixes the environment variables that set flags of serve and
// sessions: --data-dir is MCPRELAY_DATA_DIR.
const envPrefix = "MCPRELAY"

// configFlag names the flag that reads flags from a file.
const configFlag = "config"

// fromEnvAndConfig makes parseFlags also read fs's flags from MCPRELAY_*
// variables and from the file named by --config (one "name value" a line,
// # comments), in this precedence: command line, environment, file. A
// file may name flags fs does not have only if ignoreUndefined (sessions
// reads the file written for serve).
func fromEnvAndConfig(fs *flag.FlagSet, ignoreUndefined bool) []ff.Option {
	fs.String(configFlag, "", "read flags from this file: one `name value` per line (e.g. data-dir /var/lib/mcprelay), # comments; the command line and MCPRELAY_* variables win over it")
	return []ff.Option{
		ff.WithEnvVarPrefix(envPrefix),
		ff.WithConfigFileFlag(configFlag),
		ff.WithConfigFileParser(ff.PlainParser),
		ff.WithIgnoreUndefined(ignoreUndefined),
	}
}

// parseFlags parses args into fs (with opts, see fromEnvAndConfig). It
// prints nothing but the usage asked for by -h (and then returns
// flag.ErrHelp): a bad flag is returned, for main to print once.
func parseFlags(fs *flag.FlagSet, args []string, opts ...ff.Option) error {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := ff.Parse(fs, args, opts...)
	fs.SetOutput(out)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return flag.ErrHelp
	}
	// ff says where a bad value came from, except for the command line.
	if inner := errors.Unwrap(err); inner != nil && strings.HasPrefix(err.Error(), "error parsing commandline arguments: ") {
		err = inner
	}
	return fmt.Errorf("%s: %w (see mcprelay %s -h)", fs.Name(), err, fs.Name())
}
