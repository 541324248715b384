package main

import (
	"flag"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestReadmeListsEveryServeFlag: the README's list of serve flags names
// every flag of the FlagSet, and no other.
func TestReadmeListsEveryServeFlag(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, list, ok := strings.Cut(string(b), "<!-- serve flags:")
	if list, _, ok = strings.Cut(list, "<!-- end of serve flags -->"); !ok {
		t.Fatal("README.md has no serve flags list")
	}
	// A bullet starts with the flags it documents: "- `--a X`, `--b` text".
	lead := regexp.MustCompile("^(?:`--([a-z-]+)[^`]*`(?:, |$| ))")
	var documented []string
	for _, line := range strings.Split(list, "\n") {
		rest, ok := strings.CutPrefix(line, "- ")
		if !ok {
			continue
		}
		for {
			m := lead.FindStringSubmatch(rest)
			if m == nil {
				break
			}
			documented = append(documented, m[1])
			rest = rest[len(m[0]):]
		}
	}
	fs, _ := newServeFlags()
	fromEnvAndConfig(fs, false)
	var defined []string
	fs.VisitAll(func(f *flag.Flag) { defined = append(defined, f.Name) })
	slices.Sort(documented)
	slices.Sort(defined)
	if !slices.Equal(documented, defined) {
		t.Errorf("README lists the serve flags\n%v\nthe FlagSet has\n%v", documented, defined)
	}
}
