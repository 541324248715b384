package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeFlagSources: every serve flag can come from the command line,
// MCPRELAY_<FLAG> or the --config file, in that precedence; the Redis
// password variable, which names no flag, is left alone.
func TestServeFlagSources(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "mcprelay.conf")
	os.WriteFile(cfg, []byte("# relay\naddr 127.0.0.1:9100\ndata-dir /from/file\nlog-level warn\nallowed-origins http://a.example # trailing comment\nenv A=1\n"), 0o600)
	t.Setenv("MCPRELAY_DATA_DIR", "/from/env")
	t.Setenv("MCPRELAY_LOG_LEVEL", "error")
	t.Setenv("MCPRELAY_SESSION_IDLE_TIMEOUT", "90s")
	t.Setenv("MCPRELAY_REDIS_PASSWORD", "secret")
	fs, f := newServeFlags()
	if err := parseFlags(fs, []string{"--config", cfg, "--log-level", "debug", "--", "cmd", "arg"}, fromEnvAndConfig(fs, false)...); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ flag, got, want string }{
		{"addr (file)", *f.addr, "127.0.0.1:9100"},
		{"data-dir (env over file)", *f.dataDir, "/from/env"},
		{"log-level (command line over env and file)", *f.logLevel, "debug"},
		{"allowed-origins (file)", *f.origins, "http://a.example"},
		{"session-idle-timeout (env)", f.idle.String(), "1m30s"},
		{"env (file)", strings.Join(f.envs, " "), "A=1"},
		{"store (default)", *f.storeKind, "disk"},
		{"command after --", strings.Join(fs.Args(), " "), "cmd arg"},
	} {
		if c.got != c.want {
			t.Errorf("%s: %q, want %q", c.flag, c.got, c.want)
		}
	}

	t.Run("config from env", func(t *testing.T) {
		t.Setenv("MCPRELAY_CONFIG", cfg)
		fs, f := newServeFlags()
		if err := parseFlags(fs, nil, fromEnvAndConfig(fs, false)...); err != nil {
			t.Fatal(err)
		}
		if *f.addr != "127.0.0.1:9100" {
			t.Errorf("addr %q, want the file's", *f.addr)
		}
	})
	for name, c := range map[string]struct {
		args    []string
		env     [2]string
		file    string
		wantErr string
	}{
		"unknown flag in the file": {file: "adr 1.2.3.4:1\n", wantErr: `config file flag "adr" not defined`},
		"bad value in the env":     {env: [2]string{"MCPRELAY_RETAIN_EVENTS", "many"}, wantErr: `MCPRELAY_RETAIN_EVENTS`},
		"missing config file":      {args: []string{"--config", "/nonexistent/mcprelay.conf"}, wantErr: "/nonexistent/mcprelay.conf"},
		"unknown flag":             {args: []string{"--adr", "x"}, wantErr: "serve: flag provided but not defined: -adr (see mcprelay serve -h)"},
	} {
		t.Run(name, func(t *testing.T) {
			args := c.args
			if c.file != "" {
				p := filepath.Join(t.TempDir(), "bad.conf")
				os.WriteFile(p, []byte(c.file), 0o600)
				args = []string{"--config", p}
			}
			if c.env[0] != "" {
				t.Setenv(c.env[0], c.env[1])
			}
			fs, _ := newServeFlags()
			err := parseFlags(fs, args, fromEnvAndConfig(fs, false)...)
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, c.wantErr)
			}
		})
	}
}

const mainChildEnv = "MCPRELAY_CMD_TEST_MAIN_ARGS"

// TestMainChild is not a test: re-executed by runMain, it is mcprelay
// with the arguments in $MCPRELAY_CMD_TEST_MAIN_ARGS (a JSON array).
func TestMainChild(t *testing.T) {
	args := os.Getenv(mainChildEnv)
	if args == "" {
		t.Skip("run by runMain")
	}
	os.Args = []string{"mcprelay"}
	if err := json.Unmarshal([]byte(args), &os.Args); err != nil {
		panic(err)
	}
	os.Args = append([]string{"mcprelay"}, os.Args...)
	main()
	os.Exit(0)
}

// runMain runs mcprelay with args in a child process and returns its
// stdout, stderr and exit status.
func runMain(t *testing.T, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(args)
	cmd := exec.Command(exe, "-test.run=^TestMainChild$")
	cmd.Env = append(os.Environ(), mainChildEnv+"="+string(a))
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		status = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), status
}

// TestBadFlagPrintedOnce: a bad flag is reported once, with a pointer to
// -h, not followed by the whole usage; -h prints the usage and exits 0.
func TestBadFlagPrintedOnce(t *testing.T) {
	for _, cmd := range []string{"serve", "probe", "example-server"} {
		t.Run(cmd, func(t *testing.T) {
			_, stderr, status := runMain(t, cmd, "--bogus")
			want := "mcprelay: " + cmd + ": flag provided but not defined: -bogus (see mcprelay " + cmd + " -h)\n"
			if status != 1 || stderr != want {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and exactly:\n%s", status, stderr, want)
			}
			_, stderr, status = runMain(t, cmd, "-h")
			if status != 0 || !strings.Contains(stderr, "-log-level") && !strings.Contains(stderr, "-timeout") {
				t.Fatalf("-h: exit %d, stderr:\n%s", status, stderr)
			}
		})
	}
}
