package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version describes this binary from the build information the Go
// toolchain embeds: the module version ("(devel)" when built without
// version control information), the VCS revision and whether the tree had
// local changes, and the Go version.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "mcprelay (no build information) " + runtime.Version()
	}
	return formatVersion(bi)
}

// formatVersion is version's text for bi, one line:
//
//	mcprelay v1.2.3 revision 0123abcd (modified) go1.27.3
func formatVersion(bi *debug.BuildInfo) string {
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = " (modified)"
			}
		}
	}
	if rev == "" {
		rev = "unknown"
	}
	return fmt.Sprintf("mcprelay %s revision %s%s %s", v, rev, modified, bi.GoVersion)
}
