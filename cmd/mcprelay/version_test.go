package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFormatVersion(t *testing.T) {
	for _, c := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"go install @version", debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "v1.2.3"}},
			"mcprelay v1.2.3 revision unknown go1.27.3"},
		{"built in a clean checkout", debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "v0.0.0-20261130131653-11ae49ca33c8"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "11ae49ca33c8d39069e4b54a2893dc7741b6795a"}, {Key: "vcs.modified", Value: "false"}}},
			"mcprelay v0.0.0-20261130131653-11ae49ca33c8 revision 11ae49ca33c8d39069e4b54a2893dc7741b6795a go1.27.3"},
		{"local changes", debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}}},
			"mcprelay (devel) revision abc (modified) go1.27.3"},
		{"no version", debug.BuildInfo{GoVersion: "go1.27.3"}, "mcprelay (devel) revision unknown go1.27.3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := formatVersion(&c.bi); got != c.want {
				t.Errorf("got  %q\nwant %q", got, c.want)
			}
		})
	}
}

// TestVersionCommand: "mcprelay version" and "mcprelay --version" print
// this binary's build information.
func TestVersionCommand(t *testing.T) {
	for _, arg := range []string{"version", "--version", "-version"} {
		stdout, stderr, status := runMain(t, arg)
		if status != 0 || !strings.HasPrefix(stdout, "mcprelay ") || !strings.HasSuffix(stdout, " "+runtime.Version()+"\n") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", arg, status, stdout, stderr)
		}
	}
}
