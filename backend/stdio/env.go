package stdio

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrEnvFile: a line of an environment file is not K=V.
var ErrEnvFile = errors.New("stdio: bad environment file")

// ReadEnvFile reads K=V entries, one a line, for Options.Env. Blank lines
// and lines whose first non-blank character is # are skipped; white space
// around K is trimmed; V is everything after the first =, kept as is
// (no quotes are removed, no variables expanded). An "export " prefix is
// allowed. A line without =, or with an empty or blank-containing K, is an
// error naming the file and the line number.
func ReadEnvFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var env []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		t = strings.TrimPrefix(strings.TrimLeft(line, " \t"), "export ")
		k, v, ok := strings.Cut(t, "=")
		k = strings.TrimSpace(k)
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: %s:%d: no '=' in %q", ErrEnvFile, path, n, clipS(line))
		case k == "":
			return nil, fmt.Errorf("%w: %s:%d: empty name in %q", ErrEnvFile, path, n, clipS(line))
		case strings.ContainsAny(k, " \t"):
			return nil, fmt.Errorf("%w: %s:%d: blank in name %q", ErrEnvFile, path, n, k)
		}
		env = append(env, k+"="+v)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrEnvFile, path, err)
	}
	return env, nil
}

func clipS(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
