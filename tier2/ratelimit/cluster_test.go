package ratelimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier2/tenant"
)

// TestRedisCluster runs the limiter on a three-master Redis Cluster: every
// script call names only one tenant's {hash-tagged} keys, so it runs in
// one slot whichever node owns it.
func TestRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	rc := testservice.StartRedisCluster(t)
	var lims []*Limiter
	for i := 0; i < 2; i++ {
		rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: rc.Addrs()})
		if _, ok := rdb.(*redis.ClusterClient); !ok {
			t.Fatalf("universal client is %T, want a cluster client", rdb)
		}
		t.Cleanup(func() { rdb.Close() })
		l := New(Options{Redis: rdb, Replicas: 2, Timeout: 2 * time.Second})
		t.Cleanup(func() { l.Close() })
		lims = append(lims, l)
	}
	ctx := context.Background()
	slots := map[int64]bool{}
	for i := 0; i < 8; i++ {
		tn := &tenant.Tenant{ID: fmt.Sprintf("t%d", i), Limits: tenant.Limits{RPM: 7, TPM: 700, Concurrent: 100, TokenBudget: 10_000}, ModelLimits: map[string]tenant.Limits{"m": {RPM: 50}}}
		slot, err := lims[0].opts.Redis.(*redis.ClusterClient).ClusterKeySlot(ctx, lims[0].key(tn.ID, "rpm", "")).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot/5462] = true
		admitted := 0
		for j := 0; j < 20; j++ {
			res, d, err := lims[j%2].Admit(ctx, tn, "m", 10)
			if err != nil {
				t.Fatalf("tenant %s: %v", tn.ID, err)
			}
			if d.Allowed {
				admitted++
				res.Finish(ctx, 10)
			}
		}
		if admitted != 7 {
			t.Fatalf("tenant %s: admitted %d, limit 7", tn.ID, admitted)
		}
		u, err := lims[1].Usage(ctx, tn)
		if err != nil {
			t.Fatal(err)
		}
		if u.Scopes[0].RPM.Used < 7 || u.Scopes[1].Model != "m" {
			t.Fatalf("usage: %+v", u)
		}
	}
	if len(slots) < 2 {
		t.Fatalf("tenants landed on %d node(s); the test wants several", len(slots))
	}
}
