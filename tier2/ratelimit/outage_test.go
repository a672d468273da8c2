package ratelimit

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier2/tenant"
)

func newClient(t testing.TB, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// TestSlowCallStaysOnRedis: one Redis call held past Timeout (CLIENT PAUSE
// on a real server) answers its own admission locally but does not switch
// the limiter to local limits; the next admission is decided by Redis.
func TestSlowCallStaysOnRedis(t *testing.T) {
	rs := testservice.StartRedis(t)
	// The calls before and after the stall must answer within timeout on
	// a loaded machine under the race detector (50 ms leaves little room),
	// and the stall must outlast it. The pause stays under timeout plus
	// FlushInterval, so the stalled tenant's flush (due a FlushInterval
	// after its failed call) comes after it: two failed calls at most,
	// fewer than FailAfter.
	const timeout, pause = 250 * time.Millisecond, time.Second
	// Backoff an hour: once marked down, the limiter would stay down.
	l := New(Options{Redis: newClient(t, rs.Addr()), Timeout: timeout, Backoff: time.Hour, MaxBackoff: time.Hour})
	t.Cleanup(func() { l.Close() })
	ctx := context.Background()
	lim := tenant.Limits{RPM: 1000}
	if _, d, err := l.Admit(ctx, &tenant.Tenant{ID: "warm", Limits: lim}, "m", 0); err != nil || !d.Allowed || d.Degraded {
		t.Fatalf("warm-up: %+v %v", d, err)
	}
	admin := newClient(t, rs.Addr())
	if err := admin.Do(ctx, "CLIENT", "PAUSE", strconv.FormatInt(pause.Milliseconds(), 10), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	res, d, err := l.Admit(ctx, &tenant.Tenant{ID: "stalled", Limits: lim}, "m", 0)
	if err != nil || !d.Allowed {
		t.Fatalf("admission during the stall: %+v %v", d, err)
	}
	res.Finish(ctx, 0)
	if st := l.Stats(); st.RedisErrors == 0 {
		t.Fatalf("the paused call did not fail (stats %+v); the test injected nothing", st)
	}
	if l.Stats().RedisDown {
		t.Fatal("one slow call marked Redis down")
	}
	// The pause ends: a command from any client waits for it.
	if err := admin.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	_, d, err = l.Admit(ctx, &tenant.Tenant{ID: "after", Limits: lim}, "m", 0)
	if err != nil || !d.Allowed || d.Degraded {
		t.Fatalf("after the stall: %+v %v, want decided by Redis", d, err)
	}
	t.Logf("stats: %+v", l.Stats())
}

// TestOutageReconciled: requests admitted by the local limits while Redis
// is down are charged to the tenant's windows in Redis once it is back, so
// other replicas see them.
func TestOutageReconciled(t *testing.T) {
	rs := testservice.StartRedis(t)
	l := New(Options{Redis: newClient(t, rs.Addr()), SyncInterval: 50 * time.Millisecond, Backoff: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	closed := false
	t.Cleanup(func() {
		if !closed {
			l.Close()
		}
	})
	other := New(Options{Redis: newClient(t, rs.Addr())}) // reads Redis only
	t.Cleanup(func() { other.Close() })
	ctx := context.Background()
	tn := &tenant.Tenant{ID: "outage", Limits: tenant.Limits{RPM: 100, TPM: 100_000}}

	rs.Stop()
	const n, est, actual = 10, 50, 30
	for i := 0; i < n; i++ {
		res, d, err := l.Admit(ctx, tn, "m", est)
		if err != nil || !d.Allowed || !d.Degraded {
			t.Fatalf("admission %d during the outage: %+v %v", i, d, err)
		}
		res.Finish(ctx, actual)
	}
	if !l.Stats().RedisDown {
		t.Fatal("limiter did not notice the outage")
	}
	rs.Start()

	usage := func() (rpm, tpm int64) {
		u, err := other.Usage(ctx, tn)
		if err != nil || len(u.Scopes) == 0 || u.Scopes[0].RPM == nil || u.Scopes[0].TPM == nil {
			return -1, -1
		}
		return u.Scopes[0].RPM.Used, u.Scopes[0].TPM.Used
	}
	deadline := time.Now().Add(15 * time.Second)
	start := time.Now()
	for {
		if rpm, _ := usage(); rpm >= n {
			break
		}
		if time.Now().After(deadline) {
			rpm, tpm := usage()
			t.Fatalf("Redis counts rpm %d tpm %d 15s after the restart; want the %d requests admitted locally", rpm, tpm, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("locally admitted requests counted in Redis %v after the restart", time.Since(start).Round(time.Millisecond))
	// Closing returns any lease taken since, leaving exactly what was used.
	l.Close()
	closed = true
	if rpm, tpm := usage(); rpm != n || tpm != n*actual {
		t.Fatalf("Redis counts rpm %d tpm %d; want %d and %d", rpm, tpm, n, n*actual)
	}
}

// TestClusterFailoverBackOnRedis kills the master serving a tenant's slot
// in a 3+3 Redis Cluster; once its replica is promoted the limiter must be
// back on Redis within seconds, not at go-redis's 60 s slot-map reload. The
// client is a plain redis.NewUniversalClient (default reload interval), so
// this checks the limiter's own handling.
func TestClusterFailoverBackOnRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 6-node Redis Cluster")
	}
	hc := testservice.StartRedisHACluster(t)
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: hc.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	l := New(Options{Redis: rdb, Timeout: 100 * time.Millisecond, SyncInterval: 100 * time.Millisecond})
	t.Cleanup(func() { l.Close() })
	tn := &tenant.Tenant{ID: "failover", Limits: tenant.Limits{RPM: 100_000, Concurrent: 1000}}
	slot, err := hc.KeySlot(l.key(tn.ID, "rpm", ""))
	if err != nil {
		t.Fatal(err)
	}
	master, proc, err := hc.MasterOf(slot)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // steady traffic: 20 req/s
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if res, d, err := l.Admit(ctx, tn, "m", 1); err == nil && d.Allowed {
				res.Finish(ctx, 1)
			}
		}
	}()
	time.Sleep(time.Second)
	if st := l.Stats(); st.RedisDown || st.RedisErrors != 0 {
		t.Fatalf("before the failover: %+v", st)
	}
	killed := time.Now()
	proc.Stop()
	if _, err := hc.WaitMasterChange(slot, master.Addr, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	// Back on Redis = up, and no failed call for a full 3 s while the
	// tenant keeps syncing (leases every ~LeaseTTL/2, slots every SlotTTL/3).
	const stable = 3 * time.Second
	lastErrs, lastChange := l.Stats().RedisErrors, time.Now()
	deadline := promoted.Add(30 * time.Second)
	for {
		st := l.Stats()
		if st.RedisErrors != lastErrs || st.RedisDown {
			lastErrs, lastChange = st.RedisErrors, time.Now()
		}
		if time.Since(lastChange) >= stable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("limiter not back on Redis 30s after the promotion: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	back := lastChange.Sub(promoted)
	t.Logf("master killed; replica promoted after %v; limiter back on Redis %v after the promotion (errors %d, degraded admissions %d)",
		promoted.Sub(killed).Round(100*time.Millisecond), back.Round(100*time.Millisecond), lastErrs, l.Stats().Degraded)
	if back > 10*time.Second {
		t.Fatalf("limiter back on Redis only %v after the promotion; want within 10s", back)
	}
	if st := l.Stats(); st.RedisDown {
		t.Fatalf("down again: %+v", st)
	}
}

// TestLocalUseAges: what the local limits admitted is charged only while
// it is still inside the window; returns come off the newest entries.
func TestLocalUseAges(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	win := time.Minute
	for _, tc := range []struct {
		name string
		adds []struct {
			after time.Duration
			n     int64
		}
		at   time.Duration
		want int64
	}{
		{"all recent", []struct {
			after time.Duration
			n     int64
		}{{0, 3}, {500 * time.Millisecond, 2}, {10 * time.Second, 4}}, 20 * time.Second, 9},
		{"older than the window dropped", []struct {
			after time.Duration
			n     int64
		}{{0, 5}, {30 * time.Second, 2}}, 70 * time.Second, 2},
		{"return comes off the newest", []struct {
			after time.Duration
			n     int64
		}{{0, 5}, {30 * time.Second, 2}, {31 * time.Second, -3}}, 61 * time.Second, 0},
		{"return larger than recorded", []struct {
			after time.Duration
			n     int64
		}{{0, 1}, {time.Second, -4}}, 2 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &resource{}
			for _, a := range tc.adds {
				r.addLocal(a.n, t0.Add(a.after), win)
			}
			now := t0.Add(tc.at)
			if got := r.pendingLocal(now, win); got != tc.want {
				t.Fatalf("pending %d, want %d (entries %+v)", got, tc.want, r.localUse)
			}
			if got := r.takeLocal(now, win); got != tc.want || len(r.localUse) != 0 {
				t.Fatalf("take %d, want %d, left %+v", got, tc.want, r.localUse)
			}
		})
	}
}
