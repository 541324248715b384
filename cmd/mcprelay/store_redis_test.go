package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
)

// TestOpenStoreRedis: --store with a redis:// URL opens the Redis store
// with the password from the URL or from $MCPRELAY_REDIS_PASSWORD, and
// loads one relay secret shared by every relay on that Redis.
func TestOpenStoreRedis(t *testing.T) {
	srv := redistest.Start(t)
	adm, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if err := adm.Do(t.Context(), adm.B().ConfigSet().ParameterValue().ParameterValue("requirepass", "pw1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	host := srv.Addr()
	cases := []struct {
		name    string
		store   string
		env     string
		wantErr string
	}{
		{"password in URL", "redis://:pw1@" + host + "/0", "", ""},
		{"password from env", "redis://" + host + "/0", "pw1", ""},
		{"URL password wins over env", "redis://:pw1@" + host + "/0", "wrong", ""},
		{"user and password in URL", "redis://default:pw1@" + host + "/0", "", ""},
		{"no password", "redis://" + host + "/0", "", "NOAUTH"},
		{"wrong password in env", "redis://" + host + "/0", "wrong", "WRONGPASS"},
		{"TLS to a plain server", "rediss://:pw1@" + host + "/0", "", "--store"},
		{"unknown kind", "postgres://" + host, "", "--store must be disk, memory or a redis://"},
	}
	var secret []byte
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(redisPasswordEnv, tc.env)
			st, sec, err := openStore(tc.store, t.TempDir(), "always", eventlog.Retention{}, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("openStore = %v, want an error containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "pw1") {
					t.Errorf("the error shows the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("openStore: %v", err)
			}
			defer st.Close()
			if _, ok := st.(*redisstore.Store); !ok {
				t.Fatalf("openStore returned a %T", st)
			}
			if len(sec) != 32 {
				t.Fatalf("secret of %d bytes", len(sec))
			}
			if secret == nil {
				secret = sec
			} else if !bytes.Equal(sec, secret) {
				t.Errorf("secret %x, the first relay got %x: replicas must share it", sec, secret)
			}
			if err := st.CreateSession(t.Context(), &eventlog.Session{ID: tc.name, Incarnation: 1}); err != nil {
				t.Fatalf("CreateSession: %v", err)
			}
		})
	}
}

func TestRedisURLHasPassword(t *testing.T) {
	cases := map[string]bool{
		"redis://h:1/0":       false,
		"redis://:p@h:1/0":    true,
		"redis://u:p@h:1/0":   true,
		"redis://u@h:1/0":     false,
		"redis://u:@h:1/0":    false,
		"rediss://:p@h:1":     true,
		"redis://h:1/0?x=a@b": false,
		"redis://:p@ss@h:1/0": true,
	}
	for u, want := range cases {
		if got := redisURLHasPassword(u); got != want {
			t.Errorf("redisURLHasPassword(%q) = %v, want %v", u, got, want)
		}
	}
}
