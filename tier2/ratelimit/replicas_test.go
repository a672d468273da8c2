package ratelimit

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier2/tenant"
)

// cmdCounter counts commands sent to Redis (a pipeline counts once: one
// round trip).
type cmdCounter struct{ n atomic.Int64 }

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}
func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

type cluster struct {
	redis    *testservice.Redis
	limiters []*Limiter
	cmds     *cmdCounter
}

// replicas starts n limiters, each with its own client, on one Redis.
func replicas(t testing.TB, rs *testservice.Redis, n int, o Options) *cluster {
	c := &cluster{redis: rs, cmds: &cmdCounter{}}
	for i := 0; i < n; i++ {
		rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
		rdb.AddHook(c.cmds)
		oo := o
		oo.Redis, oo.Replicas = rdb, n
		l := New(oo)
		t.Cleanup(func() { l.Close(); rdb.Close() })
		c.limiters = append(c.limiters, l)
	}
	return c
}

type admission struct {
	at     time.Time
	tokens int64
}

// hammer has every replica admit concurrently until stop, recording
// admitted requests.
func hammer(c *cluster, tn *tenant.Tenant, workers int, dur time.Duration, est func() int, finish bool) (adm []admission, tries int64) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var n atomic.Int64
	stop := time.Now().Add(dur)
	for _, l := range c.limiters {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					e := est()
					n.Add(1)
					res, d, err := l.Admit(context.Background(), tn, "m", e)
					at := time.Now()
					if err != nil || !d.Allowed {
						time.Sleep(time.Millisecond)
						continue
					}
					mu.Lock()
					adm = append(adm, admission{at: at, tokens: int64(e)})
					mu.Unlock()
					if finish {
						res.Finish(context.Background(), e)
					}
				}
			}()
		}
	}
	wg.Wait()
	sort.Slice(adm, func(i, j int) bool { return adm[i].at.Before(adm[j].at) })
	return adm, n.Load()
}

// maxInWindow is the largest sum admitted in any window of length w.
func maxInWindow(adm []admission, w time.Duration, weight func(admission) int64) int64 {
	var best, sum int64
	j := 0
	for i := range adm {
		sum += weight(adm[i])
		for adm[i].at.Sub(adm[j].at) >= w {
			sum -= weight(adm[j])
			j++
		}
		best = max(best, sum)
	}
	return best
}

// noFallback fails the test if any replica fell back to local limits: the
// exactness claims are about the Redis path.
func noFallback(t *testing.T, c *cluster) {
	t.Helper()
	for i, l := range c.limiters {
		if st := l.Stats(); st.Degraded != 0 || st.RedisErrors != 0 {
			t.Fatalf("replica %d fell back to local limits: %+v", i, st)
		}
	}
}

// boundWindow is the window over which admissions stay within the limit
// (window - bucket - LeaseTTL), less 100ms of timestamp slack.
func boundWindow(o Options) time.Duration {
	return o.window - o.bucket - o.LeaseTTL - 100*time.Millisecond
}

func one(admission) int64           { return 1 }
func tokens(a admission) int64      { return a.tokens }
func est(n int) func() int          { return func() int { return n } }
func randEst(lo, hi int) func() int { return func() int { return lo + rand.IntN(hi-lo+1) } }

// TestReplicasShareRPM: three replicas hammering one tenant admit no more
// than the limit in any window, even though each could lease locally.
func TestReplicasShareRPM(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	rs := testservice.StartRedis(t)
	// A 3s window (60x shorter than production) lets the test cross
	// several windows; the algorithm does not depend on the length.
	o := Options{window: 3 * time.Second, bucket: 100 * time.Millisecond, LeaseTTL: 300 * time.Millisecond, SyncInterval: 50 * time.Millisecond, Timeout: 2 * time.Second}
	c := replicas(t, rs, 3, o)
	limit := 600
	tn := &tenant.Tenant{ID: "acme", Limits: tenant.Limits{RPM: limit}}
	adm, tries := hammer(c, tn, 4, 7*time.Second, est(0), true)
	// The bound holds over window - bucket - LeaseTTL (docs/tier2-limits.md,
	// "The bound"); 100ms of slack covers the gap between a lease being
	// used inside Admit and the timestamp taken after it returns.
	worst := maxInWindow(adm, boundWindow(o), one)
	t.Logf("tries=%d admitted=%d worst window=%d limit=%d redis cmds=%d (%.3f/try, %.3f/admit)",
		tries, len(adm), worst, limit, c.cmds.n.Load(), float64(c.cmds.n.Load())/float64(tries), float64(c.cmds.n.Load())/float64(len(adm)))
	noFallback(t, c)
	if worst > int64(limit) {
		t.Errorf("%d admitted in one window, limit %d", worst, limit)
	}
	// Sustained throughput: a window counts grants for at most 3s, so over
	// 7s at least 7/3 windows' worth (7/3.4 asked here, for a loaded
	// machine), minus leases still held at the end (at most 3 × limit/2/3).
	if min := int64(float64(limit)*7/3.4) - int64(limit/2); int64(len(adm)) < min {
		t.Errorf("admitted %d, want at least %d (under-admission)", len(adm), min)
	}
}

// TestReplicasShareTPM: token-weighted admissions with estimates
// reconciled to different actual counts stay within the limit.
func TestReplicasShareTPM(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	rs := testservice.StartRedis(t)
	o := Options{window: 3 * time.Second, bucket: 100 * time.Millisecond, LeaseTTL: 300 * time.Millisecond, SyncInterval: 50 * time.Millisecond, Timeout: 2 * time.Second}
	c := replicas(t, rs, 3, o)
	limit := 200_000
	tn := &tenant.Tenant{ID: "tok", Limits: tenant.Limits{TPM: limit}}
	adm, tries := hammer(c, tn, 4, 7*time.Second, randEst(50, 2000), true)
	worst := maxInWindow(adm, boundWindow(o), tokens)
	var total int64
	for _, a := range adm {
		total += a.tokens
	}
	t.Logf("tries=%d admitted=%d tokens=%d worst window=%d limit=%d redis cmds=%d (%.3f/try)",
		tries, len(adm), total, worst, limit, c.cmds.n.Load(), float64(c.cmds.n.Load())/float64(tries))
	noFallback(t, c)
	if worst > int64(limit) {
		t.Errorf("%d tokens admitted in one window, limit %d", worst, limit)
	}
	if min := int64(float64(limit)*7/3.4) - int64(limit/2); total < min {
		t.Errorf("admitted %d tokens, want at least %d", total, min)
	}
}

// TestReplicasShareConcurrency: no more than the limit in flight at once
// across replicas.
func TestReplicasShareConcurrency(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	rs := testservice.StartRedis(t)
	// A generous timeout: this test is about exactness, and a timed-out
	// call on a loaded machine would (correctly) fall back to local limits.
	c := replicas(t, rs, 3, Options{SyncInterval: 50 * time.Millisecond, Timeout: 2 * time.Second})
	const limit = 8
	tn := &tenant.Tenant{ID: "conc", Limits: tenant.Limits{Concurrent: limit}}
	var inflight, peak, admitted atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(2 * time.Second)
	for _, l := range c.limiters {
		for w := 0; w < 6; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					res, d, err := l.Admit(context.Background(), tn, "m", 0)
					if err != nil || !d.Allowed {
						time.Sleep(time.Millisecond)
						continue
					}
					admitted.Add(1)
					n := inflight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
					inflight.Add(-1)
					res.Finish(context.Background(), 0)
				}
			}()
		}
	}
	wg.Wait()
	t.Logf("admitted=%d peak in flight=%d limit=%d redis cmds=%d", admitted.Load(), peak.Load(), limit, c.cmds.n.Load())
	for i, l := range c.limiters {
		t.Logf("replica %d: %+v", i, l.Stats())
	}
	noFallback(t, c)
	if peak.Load() > limit {
		t.Errorf("peak %d in flight, limit %d", peak.Load(), limit)
	}
	if admitted.Load() < 100 {
		t.Errorf("only %d admitted in 2s", admitted.Load())
	}
}

// TestCrashedReplicaSlotsExpire: slots held by a replica that stops
// renewing them come back after SlotTTL.
func TestCrashedReplicaSlotsExpire(t *testing.T) {
	rs := testservice.StartRedis(t)
	// Timeout 2 s, not the default 50 ms: an admission whose Redis call
	// timed out on a loaded machine would be decided by the local share
	// (1 slot each) instead of the shared limit this test is about.
	c := replicas(t, rs, 2, Options{SyncInterval: 50 * time.Millisecond, SlotTTL: 500 * time.Millisecond, Timeout: 2 * time.Second})
	tn := &tenant.Tenant{ID: "crash", Limits: tenant.Limits{Concurrent: 2}}
	a, b := c.limiters[0], c.limiters[1]
	for i := 0; i < 2; i++ {
		if _, d, _ := a.Admit(context.Background(), tn, "m", 0); !d.Allowed {
			t.Fatalf("replica A slot %d: %+v", i, d)
		}
	}
	if _, d, _ := b.Admit(context.Background(), tn, "m", 0); d.Allowed {
		t.Fatal("replica B admitted beyond the shared limit")
	}
	// "Crash" A: stop its loop so it never renews or releases.
	a.cancel()
	<-a.done
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, d, _ := b.Admit(context.Background(), tn, "m", 0); d.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("crashed replica's slots never expired")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRedisDown covers fail-open local limits, fail-closed, backoff
// without per-request waits, and recovery.
func TestRedisDown(t *testing.T) {
	rs := testservice.StartRedis(t)
	// Timeout 500 ms, not the default 50 ms: the admissions before the
	// outage and after the recovery must be decided by Redis, which a
	// stall of 50 ms on a loaded machine would turn into local ones.
	// (While Redis is stopped each call fails within the timeout, so the
	// outage part takes a little longer, nothing else.)
	open := replicas(t, rs, 3, Options{SyncInterval: 50 * time.Millisecond, Backoff: 100 * time.Millisecond, Timeout: 500 * time.Millisecond})
	closed := replicas(t, rs, 1, Options{FailClosed: true, SyncInterval: 50 * time.Millisecond, Backoff: 100 * time.Millisecond, Timeout: 500 * time.Millisecond})
	l := open.limiters[0]
	tn := &tenant.Tenant{ID: "down", Limits: tenant.Limits{RPM: 120, Concurrent: 3}}
	if _, d, err := l.Admit(context.Background(), tn, "m", 0); err != nil || !d.Allowed || d.Degraded {
		t.Fatalf("before outage: %+v %v", d, err)
	}
	rs.Stop()

	fresh := &tenant.Tenant{ID: "fresh", Limits: tenant.Limits{RPM: 120, Concurrent: 3}}
	// Local share: 120/3 = 40 per minute, burst 40/4 = 10; concurrency 1.
	var allowed int
	var held []*Reservation
	for i := 0; i < 50; i++ {
		res, d, err := l.Admit(context.Background(), fresh, "m", 0)
		if err != nil {
			t.Fatalf("fail-open returned error: %v", err)
		}
		if d.Allowed {
			if !d.Degraded {
				t.Fatalf("admitted without Redis but not marked degraded: %+v", d)
			}
			allowed++
			held = append(held, res)
		}
	}
	if allowed != 1 {
		t.Fatalf("fail-open admitted %d concurrent requests, want the local share 1 (3 ÷ 3)", allowed)
	}
	held[0].Finish(context.Background(), 0)
	allowed = 0
	for i := 0; i < 50; i++ {
		res, d, _ := l.Admit(context.Background(), fresh, "m", 0)
		if d.Allowed {
			allowed++
			res.Finish(context.Background(), 0)
		}
	}
	t.Logf("fail-open: %d of 50 immediate requests admitted (local share 40 RPM, burst 10)", allowed)
	if allowed < 5 || allowed > 11 {
		t.Fatalf("fail-open admitted %d of 50 at once, want about the local burst 10 (40 RPM share)", allowed)
	}
	if !l.Stats().RedisDown {
		t.Fatal("limiter did not notice Redis is down")
	}
	// While down, requests must not touch Redis (no waiting for timeouts).
	before := l.Stats().RedisCalls
	for i := 0; i < 20; i++ {
		_, _, _ = l.Admit(context.Background(), &tenant.Tenant{ID: "other", Limits: tenant.Limits{RPM: 1000}}, "m", 0)
	}
	if got := l.Stats().RedisCalls - before; got != 0 {
		t.Fatalf("%d Redis calls while known down", got)
	}

	_, d, err := closed.limiters[0].Admit(context.Background(), tn, "m", 0)
	if !errors.Is(err, ErrUnavailable) || d.Allowed || d.Reason != ReasonUnavailable {
		t.Fatalf("fail-closed: %+v %v", d, err)
	}

	rs.Start()
	restarted := time.Now()
	deadline := time.Now().Add(10 * time.Second)
	for l.Stats().RedisDown {
		if time.Now().After(deadline) {
			t.Fatal("limiter never noticed Redis came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("Redis back in use %v after restart", time.Since(restarted))
	if _, d, err := l.Admit(context.Background(), &tenant.Tenant{ID: "after", Limits: tenant.Limits{RPM: 10}}, "m", 0); err != nil || !d.Allowed || d.Degraded {
		t.Fatalf("after recovery: %+v %v", d, err)
	}
}

// TestHungRedisTimeout: a Redis that accepts connections but never
// answers costs FailAfter requests at most Timeout each, then none.
func TestHungRedisTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // hold it open, say nothing
		}
	}()
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	l := New(Options{Redis: rdb, Replicas: 2, Timeout: 50 * time.Millisecond, FailAfter: 3, Backoff: time.Hour, MaxBackoff: time.Hour})
	defer l.Close()
	tn := &tenant.Tenant{ID: "hung", Limits: tenant.Limits{RPM: 100}}
	var slowest time.Duration
	for i := 0; i < 20; i++ {
		start := time.Now()
		_, d, err := l.Admit(context.Background(), tn, "m", 0)
		slowest = max(slowest, time.Since(start))
		if err != nil || (i == 0 && !d.Allowed) {
			t.Fatalf("admit %d: %+v %v", i, d, err)
		}
	}
	if got := l.Stats().RedisCalls; got != 3 {
		t.Fatalf("%d Redis calls; want FailAfter = 3 (then back off)", got)
	}
	// Generous bound: only the first calls may wait, for about Timeout.
	if slowest > time.Second {
		t.Fatalf("an admission took %v with a 50ms timeout", slowest)
	}
	t.Logf("slowest admission with hung Redis: %v", slowest)
}
