package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/mcprelay/mcprelay/relay"
)

// TestLimitFlags: what serve's limit flags make of their values, and which
// values are refused.
func TestLimitFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want relay.Limits
		err  string
	}{
		{args: nil},
		{args: []string{"--max-sessions", "1000", "--max-sessions-per-principal", "20"}, want: relay.Limits{MaxSessions: 1000, MaxSessionsPerPrincipal: 20}},
		{args: []string{"--session-rate", "10/s", "--session-burst", "20"}, want: relay.Limits{SessionRate: 10, SessionBurst: 20}},
		{args: []string{"--session-rate", "30/m"}, want: relay.Limits{SessionRate: 0.5}},
		{args: []string{"--session-rate", "36/h"}, want: relay.Limits{SessionRate: 0.01}},
		{args: []string{"--max-store-bytes", "2GiB"}, want: relay.Limits{MaxStoreBytes: 2 << 30}},
		{args: []string{"--max-store-bytes", "1000"}, want: relay.Limits{MaxStoreBytes: 1000}},
		{args: []string{"--max-store-bytes", "512 MiB"}, want: relay.Limits{MaxStoreBytes: 512 << 20}},
		{args: []string{"--max-sessions", "-1"}, err: "must not be negative"},
		{args: []string{"--session-rate", "10"}, err: "want N/s"},
		{args: []string{"--session-rate", "10/d"}, err: "want N/s"},
		{args: []string{"--session-rate", "0/s"}, err: "want N/s"},
		{args: []string{"--session-rate", "-1/s"}, err: "want N/s"},
		{args: []string{"--session-rate", "NaN/s"}, err: "want N/s"},
		{args: []string{"--session-burst", "5"}, err: "goes with --session-rate"},
		{args: []string{"--max-store-bytes", "2GB"}, err: "positive number of bytes"},
		{args: []string{"--max-store-bytes", "0"}, err: "positive number of bytes"},
		{args: []string{"--max-store-bytes", "9999999TiB"}, err: "positive number of bytes"},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		f := addLimitFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		got, err := f.limits()
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want one containing %q", tc.args, err, tc.err)
		case tc.err == "" && got != tc.want:
			t.Errorf("%q: %+v, want %+v", tc.args, got, tc.want)
		}
	}
}
