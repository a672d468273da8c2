package ratelimit

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier2/tenant"
	"github.com/redis/go-redis/v9"
)

// TestRedisConfigTLSAuth: the limiter works through a client built from
// RedisConfig against a TLS-only, password-protected Redis, and a wrong
// password makes it fail open instead of admitting through Redis.
func TestRedisConfigTLSAuth(t *testing.T) {
	rs := testservice.StartRedisOpts(t, testservice.RedisOpts{Password: "s3cret", TLS: true})
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tn := &tenant.Tenant{ID: "tls", Limits: tenant.Limits{RPM: 2}}
	for _, tc := range []struct {
		name     string
		cfg      RedisConfig
		degraded bool
	}{
		{"right password", RedisConfig{Addrs: []string{rs.Addr()}, PasswordFile: pwFile, TLS: RedisTLSConfig{Enabled: true, CAFile: rs.CAFile()}}, false},
		{"wrong password", RedisConfig{Addrs: []string{rs.Addr()}, Password: "nope", TLS: RedisTLSConfig{Enabled: true, CAFile: rs.CAFile()}}, true},
		{"no tls", RedisConfig{Addrs: []string{rs.Addr()}, PasswordFile: pwFile}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, err := tc.cfg.Client()
			if err != nil {
				t.Fatal(err)
			}
			defer rdb.Close()
			l := New(Options{Redis: rdb, Timeout: 2 * time.Second, Backoff: time.Hour, MaxBackoff: time.Hour})
			defer l.Close()
			_, d, err := l.Admit(context.Background(), tn, "m", 0)
			if err != nil || !d.Allowed || d.Degraded != tc.degraded {
				t.Fatalf("decision %+v err %v, want degraded=%v", d, err, tc.degraded)
			}
		})
	}
	if _, err := (RedisConfig{}).Client(); err == nil {
		t.Fatal("empty addrs accepted")
	}
	if _, err := (RedisConfig{Addrs: []string{"x:1"}, TLS: RedisTLSConfig{Enabled: true, CertFile: "a"}}).Client(); err == nil {
		t.Fatal("cert without key accepted")
	}
}

// TestRedisConfigClusterReload: a cluster client re-reads its slot map
// every ClusterStateReload instead of go-redis's 60 s, so calls stop going
// to a failed master soon after its replica takes over.
func TestRedisConfigClusterReload(t *testing.T) {
	rdb, err := RedisConfig{Addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}}.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("client is %T, want *redis.ClusterClient", rdb)
	}
	if o := cc.Options(); o.ClusterStateReloadInterval != ClusterStateReload || !o.ContextTimeoutEnabled || o.DialTimeout != time.Second {
		t.Fatalf("cluster options: reload %v, context timeouts %v, dial %v", o.ClusterStateReloadInterval, o.ContextTimeoutEnabled, o.DialTimeout)
	}
}
