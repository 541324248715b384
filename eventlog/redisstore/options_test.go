package redisstore_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/mcprelay/mcprelay/eventlog"
	"github.com/mcprelay/mcprelay/eventlog/redisstore"
	"github.com/mcprelay/mcprelay/eventlog/redisstore/redistest"
)

func TestSecretShared(t *testing.T) {
	srv := redistest.Start(t)
	a, b := pair(t, srv)
	sa, err := a.LoadOrCreateSecret(t.Context())
	if err != nil || len(sa) != 32 {
		t.Fatalf("LoadOrCreateSecret = %x, %v; want 32 bytes", sa, err)
	}
	sb, err := b.LoadOrCreateSecret(t.Context())
	if err != nil || !bytes.Equal(sa, sb) {
		t.Errorf("second replica's secret = %x, %v; want the first's %x", sb, err, sa)
	}
	again, err := a.LoadOrCreateSecret(t.Context())
	if err != nil || !bytes.Equal(sa, again) {
		t.Errorf("secret changed on the second call: %x, %v", again, err)
	}
	other := open(t, srv, redisstore.Options{})
	so, err := other.LoadOrCreateSecret(t.Context())
	if err != nil || bytes.Equal(so, sa) {
		t.Errorf("another prefix's secret = %x, %v; want its own", so, err)
	}
}

// TestOpenURL: password from the URL or from Options.Password (which
// wins), the database number from the URL path, and clear errors.
func TestOpenURL(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	if err := adm.Do(t.Context(), adm.B().ConfigSet().ParameterValue().ParameterValue("requirepass", "s3cret").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	host := srv.Addr()
	cases := []struct {
		name    string
		opts    redisstore.Options
		wantErr string
	}{
		{"password in URL", redisstore.Options{URL: "redis://:s3cret@" + host + "/0"}, ""},
		{"password in options", redisstore.Options{URL: "redis://" + host + "/0", Password: "s3cret"}, ""},
		{"options override URL", redisstore.Options{URL: "redis://:wrong@" + host + "/0", Password: "s3cret"}, ""},
		{"database 5", redisstore.Options{URL: "redis://:s3cret@" + host + "/5"}, ""},
		{"no password", redisstore.Options{URL: "redis://" + host + "/0"}, "NOAUTH"},
		{"wrong password", redisstore.Options{URL: "redis://:wrong@" + host + "/0"}, "WRONGPASS"},
		{"not a redis URL", redisstore.Options{URL: "http://" + host}, "redisstore: bad URL"},
		{"unparsable URL", redisstore.Options{URL: "redis://:s3cret@" + host + ":x/0"}, "redisstore: bad URL"},
		{"brace in prefix", redisstore.Options{URL: "redis://:s3cret@" + host + "/0", Prefix: "a{b"}, "brace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, err := redisstore.Open(t.Context(), tc.opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Open = %v, want an error containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "wrong@") {
					t.Errorf("the error shows the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer st.Close()
			if err := st.CreateSession(t.Context(), &eventlog.Session{ID: tc.name, Incarnation: 1}); err != nil {
				t.Fatalf("CreateSession: %v", err)
			}
		})
	}
	if err := adm.Do(t.Context(), adm.B().Auth().Password("s3cret").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	n, err := adm.Do(t.Context(), adm.B().Eval().Script("redis.call('SELECT', 5) return redis.call('DBSIZE')").Numkeys(0).Build()).AsInt64()
	if err != nil || n != 1 {
		t.Errorf("database 5 holds %d keys, %v; want the one session of the \"database 5\" case", n, err)
	}
}
