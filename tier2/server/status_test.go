package server

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier2/admin"
)

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestAdminStatus: /admin/v1/status of a Tier 2 on a real Redis, with a
// Consul agent that refuses connections (its static seeds keep serving):
// Redis reachable with a latency, then, once stopped, unreachable with a
// cause that names no address; Consul unreachable with its cause; the
// replica's ID, version and region. /admin/v1/clusters lists the seed.
func TestAdminStatus(t *testing.T) {
	rs := testservice.StartRedis(t)
	tier1 := startTier1(t)
	cfg := staticConfig(tier1.URL)
	cfg.Redis = &RedisConfig{Addresses: []string{rs.Addr()}}
	consulAddr := closedPort(t)
	cfg.Consul = &ConsulConfig{Address: consulAddr}
	cfg.Limits.Replicas = 2
	r := serve(t, cfg)

	get := func() admin.Status {
		t.Helper()
		code, body := r.adminGet(t, "/admin/v1/status", "admintoken")
		var st admin.Status
		if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil {
			t.Fatalf("status: %d %s", code, body)
		}
		return st
	}
	st := get()
	host, _ := os.Hostname()
	if st.Region != "east" || !strings.HasPrefix(st.ReplicaID, host+"-") || st.Version == "" || st.UptimeSeconds <= 0 || st.StartedAt.IsZero() {
		t.Errorf("replica = %+v", st)
	}
	if st.Redis.Mode != "standalone" || st.Redis.Reachable == nil || !*st.Redis.Reachable || st.Redis.LatencyMS == nil || st.Redis.Error != "" {
		t.Errorf("redis = %+v", st.Redis)
	}
	if st.Limiter.Replicas != 2 || st.Limiter.RedisDown || st.Limiter.FailClosed {
		t.Errorf("limiter = %+v", st.Limiter)
	}
	// Consul refuses: the first query has failed by the time Tier 2 is
	// ready, or soon after.
	deadline := time.Now().Add(5 * time.Second)
	for st.Consul.LastError == "" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		st = get()
	}
	c := st.Consul
	if c.Mode != "consul" || c.Address != consulAddr || c.Reachable == nil || *c.Reachable || c.LastSuccessAt != nil ||
		c.LastError != "connection refused" || c.LastErrorAt == nil || c.ClustersFound != 1 {
		t.Errorf("consul = %+v", c)
	}

	rs.Stop()
	st = get()
	if st.Redis.Reachable == nil || *st.Redis.Reachable || st.Redis.LatencyMS != nil || st.Redis.Error != "connection refused" {
		t.Errorf("redis stopped = %+v", st.Redis)
	}
	if strings.Contains(st.Redis.Error, "127.0.0.1") {
		t.Errorf("redis error names an address: %q", st.Redis.Error)
	}

	code, body := r.adminGet(t, "/admin/v1/clusters", "admintoken")
	var cl admin.ClusterList
	if code != http.StatusOK || json.Unmarshal([]byte(body), &cl) != nil || len(cl.Regions) != 1 || cl.Regions[0].Clusters[0].Name != "a" {
		t.Errorf("clusters: %d %s", code, body)
	}
}

// TestAdminStatusMemory: without Redis or Consul, the modes say so and
// nothing is reported reachable or not.
func TestAdminStatusMemory(t *testing.T) {
	r := serve(t, staticConfig(startTier1(t).URL))
	code, body := r.adminGet(t, "/admin/v1/status", "admintoken")
	var st admin.Status
	if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil {
		t.Fatalf("status: %d %s", code, body)
	}
	if st.Redis.Mode != "memory" || st.Redis.Reachable != nil || st.Consul.Mode != "static" || st.Consul.Reachable != nil || st.Consul.ClustersFound != 1 {
		t.Errorf("status = %s", body)
	}
	if !strings.Contains(body, `"reachable":null`) {
		t.Errorf("reachable should be null, not absent: %s", body)
	}
}
