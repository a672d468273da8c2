package integration

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/devstack"
	"github.com/infergate/infergate/internal/testservice"
)

// The fault matrix (docs/reliability.md): each test runs real processes on
// loopback under an open-loop load of mixed plain and streaming requests,
// injects one fault, and reports FIGURES: requests sent, failed before
// streaming (no 200 reached the client), cut mid-stream (a 200, then a
// broken answer), and, where a tenant has a limit, requests admitted beyond
// it. It asserts what the product promises for that fault.

// faultTimeScale runs the simulated GPUs at twice real speed, ten times
// slower than the other end-to-end tests, so a request of faultTokens
// tokens takes a few hundred milliseconds and a process killed under load
// has requests in flight.
const (
	faultTimeScale = 0.5
	faultTokens    = 24
)

// limiterRecovery is the longest the limiter keeps deciding locally after
// Redis is back: its probe backoff doubles from 500 ms to MaxBackoff (5 s),
// checked every SyncInterval (250 ms). See docs/tier2-limits.md.
const limiterRecovery = 5*time.Second + 250*time.Millisecond

func faultContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// acmeLoad is the unlimited tenant's load on Tier 2: half the requests
// stream.
func (s *stack) acmeLoad(name string, rate float64, d time.Duration) loadSpec {
	return loadSpec{name: name, url: s.tier2URL, key: s.apiKey, model: devstack.LlamaModel,
		rate: rate, duration: d, maxTokens: faultTokens, streamEvery: 2}
}

// failoverCount reads Tier 2's failover counter (0 if it has none yet).
func (s *stack) failoverCount(ctx context.Context) float64 {
	v, _ := metricValue(ctx, s.tier2Metrics, "infergate_tier2_failovers_total")
	return v
}

func requireNoFailedBefore(t *testing.T, f figures) {
	t.Helper()
	if f.failedBefore != 0 {
		t.Errorf("%d of %d requests failed before streaming, want 0", f.failedBefore, f.sent)
	}
	if f.answered == 0 {
		t.Errorf("no request answered")
	}
}

// podCluster is one Tier 1 in front of simulated pods, each its own
// `infergate-lab sim` process so that one can be killed alone.
type podCluster struct {
	url, token string
	metrics    string // Tier 1's /metrics URL (its own listener)
	tier1      *proc
	pods       []*proc
	names      []string
}

func startPodCluster(t *testing.T, n int, scale float64) *podCluster {
	t.Helper()
	needBinary(t)
	dir := t.TempDir()
	c := &podCluster{token: "it-podkill-token"}
	var b strings.Builder
	addr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	metricsAddr := "127.0.0.1:" + strconv.Itoa(testservice.FreePort(t))
	fmt.Fprintf(&b, "listen: %s\nmetrics_listen: %s\ncluster: podkill\nregion: local\nauth: {tokens: [%s]}\nscrape: {interval: 100ms}\n", addr, metricsAddr, c.token)
	fmt.Fprintf(&b, "pools:\n  - {name: llama, model: %q}\npods:\n", devstack.LlamaModel)
	for i := range n {
		name, port := fmt.Sprintf("pod-%d", i), testservice.FreePort(t)
		p := startProc(t, name, "sim", "--port", strconv.Itoa(port), "--model", "llama-3.1-8b",
			"--served-model-name", devstack.LlamaModel, "--gpu", "a10g", "--max-num-seqs", "64",
			"--time-scale", strconv.FormatFloat(scale, 'f', -1, 64), "--log-level", "warn")
		waitOK(t, p, fmt.Sprintf("http://127.0.0.1:%d/health", port), 30*time.Second)
		fmt.Fprintf(&b, "  - {name: %s, address: \"127.0.0.1:%d\", pool: llama, engine: vllm, gpu: a10g}\n", name, port)
		c.pods, c.names = append(c.pods, p), append(c.names, name)
	}
	path := filepath.Join(dir, "tier1.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	c.tier1 = startProc(t, "tier1", "tier1", "--config", path, "--log-level", "warn")
	c.url = "http://" + addr
	c.metrics = "http://" + metricsAddr + "/metrics"
	waitOK(t, c.tier1, c.url+"/ready", 30*time.Second)
	return c
}

// TestFaultPodKill SIGKILLs one of three simulated pods behind a Tier 1
// under load sent straight to that Tier 1. Requests in flight on the pod
// that had not sent a byte, and new ones picked for it before the scraper
// notices, must be retried on another pod: none may fail before
// streaming. Streams the pod had started are cut; nothing can save them.
func TestFaultPodKill(t *testing.T) {
	c := startPodCluster(t, 3, faultTimeScale)
	ctx := faultContext(t)
	const rate, dur, killAt = 30, 20 * time.Second, 7 * time.Second
	begin := time.Now()
	run := startLoad(ctx, loadSpec{name: "pod-kill", url: c.url, key: c.token, model: devstack.LlamaModel,
		rate: rate, duration: dur, maxTokens: faultTokens, streamEvery: 2, servedHeader: "X-Infergate-Pod"})
	run.at(killAt)
	c.pods[0].kill(t)
	killed := run.since()
	recs := run.wait()

	f := sum(recs)
	retries, _ := metricValue(ctx, c.metrics, "infergate_tier1_retries_total")
	f.report(t, "pod-kill", time.Since(begin), fmt.Sprintf("tier1_retries=%v killed_at=%v", retries, killed.Round(time.Millisecond)))
	requireNoFailedBefore(t, f)
	before := 0
	for _, r := range recs {
		if r.end < killed && r.servedBy == c.names[0] {
			before++
		}
	}
	if before == 0 {
		t.Errorf("%s served nothing before it was killed: the kill hit no load", c.names[0])
	}
	if after := servedAfter(recs, killed); after[c.names[1]]+after[c.names[2]] == 0 {
		t.Errorf("nothing served after the kill: %v", after)
	}
}

// TestFaultTier1Kill SIGKILLs the Tier 1 of the cluster Tier 2 prefers
// (cluster-a, the cheapest) under load. Tier 2 must retry every request
// that cluster refused or dropped before its first byte on another
// cluster: none may fail before streaming.
func TestFaultTier1Kill(t *testing.T) {
	recs, killed, f := killTier1sUnderLoad(t, "tier1-kill", "cluster-a")
	if n := count(recs, answered, 0, killed); n == 0 || f.servedBy["cluster-a"] == 0 {
		t.Errorf("cluster-a served nothing before the kill (%d answered): the kill hit no load", n)
	}
	after := servedAfter(recs, killed+time.Second)
	if after["cluster-b"]+after["cluster-c"]+after["cluster-d"] == 0 || after["cluster-a"] != 0 {
		t.Errorf("served after the kill: %v, want other clusters only", after)
	}
}

// killTier1sUnderLoad sends acme's load (30 req/s for 20 s) through a
// fresh stack, SIGKILLs the named clusters' Tier 1s 7 s in, reports, and
// requires that no request failed before streaming. It returns the
// records, when the kill happened, and their figures.
func killTier1sUnderLoad(t *testing.T, name string, clusters ...string) ([]record, time.Duration, figures) {
	t.Helper()
	s := startStackOpts(t, stackOptions{timeScale: faultTimeScale})
	ctx := faultContext(t)
	const rate, dur, killAt = 30, 20 * time.Second, 7 * time.Second
	begin := time.Now()
	run := startLoad(ctx, s.acmeLoad(name, rate, dur))
	run.at(killAt)
	for _, c := range clusters {
		s.tier1[c].kill(t)
	}
	killed := run.since()
	recs := run.wait()

	f := sum(recs)
	f.report(t, name, time.Since(begin), fmt.Sprintf("tier2_failovers=%v killed_at=%v served_after=%v",
		s.failoverCount(ctx), killed.Round(time.Millisecond), servedAfter(recs, killed)))
	requireNoFailedBefore(t, f)
	return recs, killed, f
}

// TestFaultRegionDown SIGKILLs both Tier 1s of Tier 2's own region
// (us-east) under load: Tier 2 fails over to eu-west. None may fail before
// streaming: each request tries cluster-a, cluster-b, then an eu-west
// cluster, within max_attempts (4).
func TestFaultRegionDown(t *testing.T) {
	recs, killed, _ := killTier1sUnderLoad(t, "region-down", "cluster-a", "cluster-b")
	after := servedAfter(recs, killed+time.Second)
	if after[""] != 0 || after["cluster-a"]+after["cluster-b"] != 0 || after["cluster-c"]+after["cluster-d"] == 0 {
		t.Errorf("served after the region went down: %v, want eu-west clusters only", after)
	}
}

// TestFaultConsulDown stops the Consul agent under load and keeps it down:
// Tier 2 keeps routing on the last clusters Consul gave it, so nothing
// fails and the cheapest cluster keeps the traffic.
func TestFaultConsulDown(t *testing.T) {
	s := startStackOpts(t, stackOptions{timeScale: faultTimeScale})
	ctx := faultContext(t)
	const rate, dur, stopAt = 30, 20 * time.Second, 5 * time.Second
	begin := time.Now()
	run := startLoad(ctx, s.acmeLoad("consul-down", rate, dur))
	run.at(stopAt)
	s.consul.Stop()
	stopped := run.since()
	recs := run.wait()

	f := sum(recs)
	f.report(t, "consul-down", time.Since(begin), fmt.Sprintf("stopped_at=%v served_after=%v", stopped.Round(time.Millisecond), servedAfter(recs, stopped)))
	requireNoFailedBefore(t, f)
	if f.cut != 0 {
		t.Errorf("%d streams cut with only Consul down", f.cut)
	}
	if after := servedAfter(recs, stopped); after["cluster-a"] == 0 {
		t.Errorf("served after Consul stopped: %v, want cluster-a (the last known cheapest) still in use", after)
	}
}

// meteredRPM is the requests-per-minute limit of the metered tenant in the
// Redis scenarios; meteredRate (req/s) exceeds it in every phase.
const (
	meteredRPM  = 20
	meteredRate = 4
)

var metered = seedTenant{id: "metered", key: "sk-it-metered", rpm: meteredRPM}

func (s *stack) meteredLoad(d time.Duration) loadSpec {
	return loadSpec{name: "metered", url: s.tier2URL, key: metered.key, model: devstack.LlamaModel,
		rate: meteredRate, duration: d, maxTokens: 8, streamEvery: 3, limited: true}
}

// failOpenAllowance is what the limiter may admit for a tenant with limit
// rpm beyond it while deciding locally (fail open, one replica; see
// docs/tier2-limits.md): in each fail-open period a token bucket's burst of
// rpm/4, plus rpm per minute of fail-open time, counted over [from, to).
func failOpenAllowance(rpm int, ps []downPeriod, from, to time.Duration) int {
	d, n := total(ps, from, to)
	return n*(rpm/4) + int(math.Ceil(float64(rpm)*d.Minutes()))
}

// admittedEndedBefore counts a load's admitted requests that had ended
// before t, so were surely admitted before it.
func admittedEndedBefore(recs []record, t time.Duration) int {
	n := 0
	for _, r := range recs {
		if (r.outcome == answered || r.outcome == cutMidStream) && r.end < t {
			n++
		}
	}
	return n
}

// checkMetered asserts the metered tenant's limit around a Redis fault at
// faultAt: before it, on the Redis path, no overshoot beyond what fail-open
// periods the limiter went through (a Redis call slower than its 50 ms
// timeout starts one) allow; overall, at most those periods' allowance plus
// one window of counts Redis may lose (an empty restart, or writes a
// failed-over master had not replicated), plus one for rounding; and 429s
// again from limitsBack on. It returns the overall bound for the figures.
func checkMetered(t *testing.T, mrecs []record, ps []downPeriod, faultAt, limitsBack, end time.Duration) int {
	t.Helper()
	if n, allow := admittedEndedBefore(mrecs, faultAt), failOpenAllowance(meteredRPM, ps, 0, faultAt); n > meteredRPM+allow {
		t.Errorf("before the fault: %d admitted, limit %d plus fail-open allowance %d", n, meteredRPM, allow)
	}
	if count(mrecs, limited, 0, faultAt) == 0 {
		t.Errorf("metered was never limited before the fault: the test does not saturate its limit")
	}
	bound := failOpenAllowance(meteredRPM, ps, 0, end+time.Minute) + meteredRPM + 1
	over := max(0, admittedInWindow(mrecs, time.Minute)-meteredRPM)
	if over > bound {
		t.Errorf("metered admitted %d beyond its limit of %d; documented bound %d", over, meteredRPM, bound)
	}
	if count(mrecs, limited, limitsBack, end) == 0 {
		t.Errorf("metered never limited after %v: limits did not recover", limitsBack.Round(time.Millisecond))
	}
	return bound
}

// failOpenFigures describes the limiter's fail-open periods, split at the
// fault.
func failOpenFigures(ps []downPeriod, faultAt time.Duration) string {
	d, n := total(ps, 0, time.Hour)
	if faultAt == 0 {
		return fmt.Sprintf("limiter_fail_open=%v/%d_periods", d.Round(100*time.Millisecond), n)
	}
	sd, sn := total(ps, 0, faultAt)
	return fmt.Sprintf("limiter_fail_open=%v/%d_periods (before_fault=%v/%d)",
		d.Round(100*time.Millisecond), n, sd.Round(100*time.Millisecond), sn)
}

// TestFaultRedisRestartEmpty stops Redis for 20 s under load and starts it
// again empty (no persistence), with two tenants: acme (no effective
// limit) and metered (rpm 20, sent 4 req/s, so it is over its limit in
// every phase). Tier 2 must keep serving: auth from its cached tenants,
// limits failing open to the local share (the default), the configured
// tenants and keys re-seeded into the empty Redis. Nothing may fail before
// streaming; metered may be over-admitted only within the documented
// fail-open bound plus the window the empty Redis forgot; and limits must
// bite again once Redis is back.
func TestFaultRedisRestartEmpty(t *testing.T) {
	s := startStackOpts(t, stackOptions{timeScale: faultTimeScale, tenants: []seedTenant{metered}})
	ctx := faultContext(t)
	const dur, stopAt, startAt = 38 * time.Second, 6 * time.Second, 26 * time.Second
	begin := time.Now()
	watch := watchLimiter(ctx, s.tier2Metrics, begin)
	acme := startLoad(ctx, s.acmeLoad("redis-restart", 20, dur))
	met := startLoad(ctx, s.meteredLoad(dur))
	met.at(stopAt)
	s.redis.Stop()
	stopped := met.since()
	met.at(startAt)
	s.redis.Start() // empty: persistence is off
	started := met.since()
	arecs, mrecs := acme.wait(), met.wait()
	ps := watch.periods()

	f := sum(arecs, mrecs)
	f.overAdmitted = max(0, admittedInWindow(mrecs, time.Minute)-meteredRPM)
	phase := func(from, to time.Duration) string {
		return fmt.Sprintf("%d/%d", count(mrecs, answered, from, to)+count(mrecs, cutMidStream, from, to), count(mrecs, limited, from, to))
	}
	requireNoFailedBefore(t, f)
	// The window Redis forgot fills again within meteredRPM/meteredRate
	// seconds of the limiter using Redis again.
	bound := checkMetered(t, mrecs, ps, stopped, started+limiterRecovery+meteredRPM/meteredRate*time.Second, dur)
	f.report(t, "redis-restart-empty", time.Since(begin), fmt.Sprintf(
		"outage=%v over_admitted_bound=%d metered_admitted/429: before=%s down=%s after=%s %s",
		(started-stopped).Round(time.Millisecond), bound, phase(0, stopped), phase(stopped, started), phase(started, dur),
		failOpenFigures(ps, stopped)))
}

// TestFaultRedisClusterFailover runs Tier 2 on a real Redis Cluster (three
// masters, three replicas) and SIGKILLs the master holding the metered
// tenant's limiter keys under load; its replica takes over. Nothing may
// fail before streaming, the limit must hold within the documented bound,
// and it must bite again after the failover.
func TestFaultRedisClusterFailover(t *testing.T) {
	needBinary(t)
	rc := testservice.StartRedisHACluster(t)
	s := startStackOpts(t, stackOptions{timeScale: faultTimeScale, redisAddrs: rc.Addrs(), tenants: []seedTenant{metered}})
	ctx := faultContext(t)
	// The limiter's keys carry the tenant as hash tag; the tenant store's
	// carry {tenants}.
	slot, err := rc.KeySlot("{" + metered.id + "}")
	if err != nil {
		t.Fatal(err)
	}
	old, oldProc, err := rc.MasterOf(slot)
	if err != nil {
		t.Fatal(err)
	}
	tslot, _ := rc.KeySlot("{tenants}")
	tmaster, _, _ := rc.MasterOf(tslot)

	const dur, killAt = 30 * time.Second, 8 * time.Second
	begin := time.Now()
	watch := watchLimiter(ctx, s.tier2Metrics, begin)
	acme := startLoad(ctx, s.acmeLoad("redis-cluster-failover", 20, dur))
	met := startLoad(ctx, s.meteredLoad(dur))
	met.at(killAt)
	oldProc.Stop() // SIGKILL
	killed := met.since()
	nu, err := rc.WaitMasterChange(slot, old.Addr, 20*time.Second)
	promoted := met.since()
	arecs, mrecs := acme.wait(), met.wait()
	ps := watch.periods()
	if err != nil {
		t.Fatalf("replica of %s never took over slot %d: %v", old.Addr, slot, err)
	}

	f := sum(arecs, mrecs)
	f.overAdmitted = max(0, admittedInWindow(mrecs, time.Minute)-meteredRPM)
	requireNoFailedBefore(t, f)
	// The promoted replica has the window's counts: metered stays limited.
	bound := checkMetered(t, mrecs, ps, killed, promoted+limiterRecovery, dur)
	f.report(t, "redis-cluster-failover", time.Since(begin), fmt.Sprintf(
		"killed_master=%s promoted=%s failover=%v tenants_slot_master=%s over_admitted_bound=%d metered_admitted/429: before=%d/%d after=%d/%d %s",
		old.Addr, nu.Addr, (promoted-killed).Round(time.Millisecond), tmaster.Addr, bound,
		count(mrecs, answered, 0, killed), count(mrecs, limited, 0, killed),
		count(mrecs, answered, killed, dur), count(mrecs, limited, killed, dur), failOpenFigures(ps, killed)))
	// Once the replica has taken over, the limiter must be back on Redis
	// within its probe backoff: it reloads the cluster's slot map on
	// failures and probes the failed key's own slot (docs/reliability.md,
	// "Redis Cluster failover", fixed in tier2/ratelimit).
	t.Run("limiter back on redis", func(t *testing.T) {
		from := promoted + limiterRecovery
		d, n := total(ps, from, dur)
		if d > (dur-from)/4 {
			t.Errorf("limiter fail-open %v in %d periods of the %v after the failover plus recovery time",
				d.Round(100*time.Millisecond), n, (dur - from).Round(100*time.Millisecond))
		}
	})
}
