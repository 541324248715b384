package main

import (
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/mcprelay/mcprelay/relay"
)

// limitFlags are serve's flags for relay.Limits.
type limitFlags struct {
	maxSessions, perPrincipal, burst *int
	rate, storeBytes                 *string
}

func addLimitFlags(fs *flag.FlagSet) *limitFlags {
	return &limitFlags{
		maxSessions:  fs.Int("max-sessions", 0, "most sessions this process serves; past it, initialize gets 503 with Retry-After (0: no bound)"),
		perPrincipal: fs.Int("max-sessions-per-principal", 0, "most sessions of one principal (without one: one remote IP address) in this process; past it, 429 with Retry-After (0: no bound)"),
		rate:         fs.String("session-rate", "", "sessions one principal (without one: one remote IP address) may create, as N/s, N/m or N/h; past it, 429 with Retry-After (default: no bound)"),
		burst:        fs.Int("session-burst", 0, "with --session-rate: sessions a principal may create at once (0: the per-second rate rounded up, at least 1)"),
		storeBytes:   fs.String("max-store-bytes", "", "refuse new sessions (503) while the store holds this much: bytes, or with KiB, MiB, GiB, TiB (disk: the store's disk usage; redis: Redis's used_memory; memory: retained event bytes) (default: no bound)"),
	}
}

// limits checks the flags and returns the relay's limits.
func (f *limitFlags) limits() (relay.Limits, error) {
	lim := relay.Limits{MaxSessions: *f.maxSessions, MaxSessionsPerPrincipal: *f.perPrincipal, SessionBurst: *f.burst}
	for name, v := range map[string]int{"max-sessions": *f.maxSessions, "max-sessions-per-principal": *f.perPrincipal, "session-burst": *f.burst} {
		if v < 0 {
			return lim, fmt.Errorf("serve: --%s must not be negative, got %d", name, v)
		}
	}
	if *f.rate != "" {
		r, err := parseRate(*f.rate)
		if err != nil {
			return lim, fmt.Errorf("serve: --session-rate: %w", err)
		}
		lim.SessionRate = r
	} else if *f.burst != 0 {
		return lim, fmt.Errorf("serve: --session-burst goes with --session-rate")
	}
	if *f.storeBytes != "" {
		n, err := parseBytes(*f.storeBytes)
		if err != nil {
			return lim, fmt.Errorf("serve: --max-store-bytes: %w", err)
		}
		lim.MaxStoreBytes = n
	}
	return lim, nil
}

// parseRate reads N/s, N/m or N/h (N > 0, decimals allowed) as a rate per
// second.
func parseRate(s string) (float64, error) {
	num, unit, ok := strings.Cut(strings.TrimSpace(s), "/")
	per := map[string]float64{"s": 1, "m": 60, "h": 3600}[unit]
	n, err := strconv.ParseFloat(num, 64)
	if !ok || per == 0 || err != nil || !(n > 0) || math.IsInf(n, 0) {
		return 0, fmt.Errorf("want N/s, N/m or N/h with N > 0, got %q", s)
	}
	return n / per, nil
}

// parseBytes reads a positive byte count, with an optional KiB, MiB, GiB
// or TiB suffix.
func parseBytes(s string) (int64, error) {
	num := strings.TrimSpace(s)
	mult := int64(1)
	for i, suffix := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if v, ok := strings.CutSuffix(num, suffix); ok {
			num, mult = strings.TrimSpace(v), 1<<(10*(i+1))
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("want a positive number of bytes, optionally with KiB, MiB, GiB or TiB, got %q", s)
	}
	return n * mult, nil
}
