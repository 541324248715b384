package stdio_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mcprelay/mcprelay/backend/stdio"
)

func TestReadEnvFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.env", "# a comment\n\nA=1\n  B = two words \nexport C=x=y\r\nD=\n   # indented comment\nE=\"quoted\"\n")
	env, err := stdio.ReadEnvFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"A=1", "B= two words ", "C=x=y", "D=", `E="quoted"`}; !slices.Equal(env, want) {
		t.Fatalf("ReadEnvFile = %q, want %q", env, want)
	}
	for _, c := range []struct{ body, want string }{
		{"A=1\nB\n", ":2: no '='"},
		{"A=1\n\n# c\n=3\n", ":4: empty name"},
		{"A B=1\n", ":1: blank in name"},
	} {
		p := write("bad.env", c.body)
		_, err := stdio.ReadEnvFile(p)
		if !errors.Is(err, stdio.ErrEnvFile) || !strings.Contains(err.Error(), p+c.want) {
			t.Errorf("ReadEnvFile(%q) = %v, want ErrEnvFile and %q", c.body, err, p+c.want)
		}
	}
	if _, err := stdio.ReadEnvFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestNewChecksOptions(t *testing.T) {
	if _, err := stdio.New(stdio.Options{}); !errors.Is(err, stdio.ErrNoCommand) {
		t.Errorf("no command: %v", err)
	}
	if _, err := stdio.New(stdio.Options{Command: []string{"x"}, Env: []string{"NOEQUALS"}}); err == nil {
		t.Error("Env entry without '=' accepted")
	}
}
