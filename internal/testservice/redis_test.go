package testservice

import (
	"strings"
	"testing"
)

func TestStartRedisRestart(t *testing.T) {
	r := StartRedis(t)
	if _, err := rawCommand(r.Addr(), "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	if err := r.ping(); err == nil {
		t.Fatal("PING succeeded after Stop")
	}
	r.Start()
	if err := r.ping(); err != nil {
		t.Fatalf("PING after restart: %v", err)
	}
}

func TestStartRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster start is slow")
	}
	c := StartRedisCluster(t)
	info, err := rawCommand(c.Nodes[1].Addr(), "CLUSTER", "INFO")
	if err != nil || !strings.Contains(info, "cluster_slots_assigned:16384") {
		t.Fatalf("cluster info: %v %q", err, info)
	}
}

func TestStartRedisAuthTLS(t *testing.T) {
	r := StartRedisOpts(t, RedisOpts{Password: "s3cret", TLS: true})
	if err := r.ping(); err != nil {
		t.Fatalf("TLS+AUTH ping: %v", err)
	}
	plain := &Redis{port: r.port, password: "s3cret"}
	if err := plain.ping(); err == nil {
		t.Fatal("plaintext PING answered by a TLS-only server")
	}
	wrong := &Redis{port: r.port, tls: r.ClientTLS(), password: "nope"}
	if err := wrong.ping(); err == nil {
		t.Fatal("wrong password accepted")
	}
}
