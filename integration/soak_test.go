package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Soak settings: INFERGATE_SOAK is how long the fixed-rate load runs
// (`make soak` sets 10m; default soakDefault, so `go test` stays short),
// INFERGATE_SOAK_RATE its requests per second.
const (
	soakDefault     = 20 * time.Second
	soakDefaultRate = 20
)

func soakSettings(t *testing.T) (time.Duration, float64) {
	t.Helper()
	d, rate := soakDefault, float64(soakDefaultRate)
	if v := os.Getenv("INFERGATE_SOAK"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("INFERGATE_SOAK=%q: want a positive duration such as 10m", v)
		}
	}
	if v := os.Getenv("INFERGATE_SOAK_RATE"); v != "" {
		var err error
		if rate, err = strconv.ParseFloat(v, 64); err != nil || rate <= 0 {
			t.Fatalf("INFERGATE_SOAK_RATE=%q: want a positive number of requests per second", v)
		}
	}
	return d, rate
}

// soaked is one watched process.
type soaked struct {
	name       string
	p          *proc
	metricsURL string

	mu      sync.Mutex
	samples []soakSample
}

type soakSample struct {
	at time.Duration
	procStats
}

func (w *soaked) sample(ctx context.Context, t *testing.T, at time.Duration) procStats {
	t.Helper()
	st, err := sampleProc(ctx, w.p, w.metricsURL)
	if err != nil {
		t.Errorf("sampling %s: %v", w.name, err)
		return procStats{}
	}
	w.mu.Lock()
	w.samples = append(w.samples, soakSample{at, st})
	w.mu.Unlock()
	return st
}

// median is the median RSS and goroutine count sampled in [from, to):
// under load both follow the requests in flight, so a single sample
// says more about a scheduling hiccup than about a leak.
func (w *soaked) median(from, to time.Duration) procStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	var rss []int64
	var g []int
	for _, s := range w.samples {
		if s.at >= from && s.at < to {
			rss, g = append(rss, s.rssBytes), append(g, s.goroutines)
		}
	}
	if len(rss) == 0 {
		return procStats{}
	}
	slices.Sort(rss)
	slices.Sort(g)
	return procStats{rssBytes: rss[len(rss)/2], goroutines: g[len(g)/2]}
}

// TestSoak runs the whole stack at a fixed request rate (mixed plain and
// streaming, plus a tenant kept over its limit) for INFERGATE_SOAK, and
// checks that Tier 2's and a Tier 1's resident memory and goroutines stay
// flat: idle after the load as idle before it (after a warm-up), and under
// load late in the run as early in it (medians of samples). The bounds are
// loose on purpose — they catch leaks (a goroutine or a buffer per
// request), not noise. Every request must succeed.
func TestSoak(t *testing.T) {
	needBinary(t)
	d, rate := soakSettings(t)
	warm := min(max(d/10, 5*time.Second), time.Minute)
	if dl, ok := t.Deadline(); ok && time.Until(dl) < warm+d+3*time.Minute {
		t.Fatalf("INFERGATE_SOAK=%v needs a go test -timeout above %v (make soak sets one)", d, warm+d+3*time.Minute)
	}
	const soakRPM = 30
	limitedTenant := seedTenant{id: "soak-limited", key: "sk-it-soak-limited", rpm: soakRPM}
	s := startStackOpts(t, stackOptions{timeScale: 0.25, tenants: []seedTenant{limitedTenant}})
	ctx, cancel := context.WithTimeout(context.Background(), warm+d+4*time.Minute)
	defer cancel()
	watched := []*soaked{
		{name: "tier2", p: s.tier2, metricsURL: s.tier2Metrics},
		{name: "tier1 cluster-a", p: s.tier1["cluster-a"], metricsURL: s.tier1Metrics["cluster-a"]},
	}
	loads := func(name string, d time.Duration) (*loadRun, *loadRun) {
		a := s.acmeLoad(name, rate, d)
		a.maxTokens = 16
		l := loadSpec{name: name + "-limited", url: s.tier2URL, key: limitedTenant.key, model: a.model,
			rate: 2, duration: d, maxTokens: 8, streamEvery: 2, limited: true}
		return startLoad(ctx, a), startLoad(ctx, l)
	}
	// idle samples every watched process with no request in flight and
	// no client connection open.
	idle := func(at time.Duration) []procStats {
		time.Sleep(time.Second)
		loadTransport.CloseIdleConnections()
		time.Sleep(2 * time.Second)
		var out []procStats
		for _, w := range watched {
			out = append(out, w.sample(ctx, t, at))
		}
		return out
	}

	a, l := loads("soak-warmup", warm)
	a.wait()
	l.wait()
	before := idle(0)

	begin := time.Now()
	watch := watchLimiter(ctx, s.tier2Metrics, begin)
	a, l = loads("soak", d)
	every := max(d/60, time.Second)
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				for _, w := range watched {
					w.sample(ctx, t, time.Since(begin))
				}
			}
		}
	}()
	arecs, lrecs := a.wait(), l.wait()
	close(stop)
	sampler.Wait()
	ps := watch.periods()
	wall := time.Since(begin)
	// Connections pooled at the load's peaks stay open, each with its
	// goroutines, until the transports' IdleConnTimeout (90 s in Tier 1 and
	// Tier 2): wait up to that long for the idle count to come back.
	settled := time.Now()
	leaked := func(after []procStats) bool {
		for i := range watched {
			if after[i].goroutines > before[i].goroutines+max(20, before[i].goroutines/5) {
				return true
			}
		}
		return false
	}
	after := idle(wall + time.Hour)
	for leaked(after) && time.Since(settled) < 100*time.Second {
		time.Sleep(5 * time.Second)
		after = idle(wall + time.Hour)
	}
	settle := time.Since(settled)

	f := sum(arecs, lrecs)
	f.overAdmitted = max(0, admittedInWindow(lrecs, time.Minute)-soakRPM)
	mib := func(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
	extra := fmt.Sprintf("duration=%v rate=%v/s+2/s_limited idle_settled_in=%v %s", d, rate, settle.Round(time.Second), failOpenFigures(ps, 0))
	for i, w := range watched {
		early, late := w.median(d/10, d*4/10), w.median(d*3/4, wall+time.Second)
		extra += fmt.Sprintf(" [%s rss_mib idle %s->%s load %s->%s; goroutines idle %d->%d load %d->%d]", w.name,
			mib(before[i].rssBytes), mib(after[i].rssBytes), mib(early.rssBytes), mib(late.rssBytes),
			before[i].goroutines, after[i].goroutines, early.goroutines, late.goroutines)
		if after[i].goroutines > before[i].goroutines+max(20, before[i].goroutines/5) {
			t.Errorf("%s: %d goroutines idle %v after the soak, %d before: a leak", w.name, after[i].goroutines, settle.Round(time.Second), before[i].goroutines)
		}
		if late.goroutines > early.goroutines*3/2+20 {
			t.Errorf("%s: %d goroutines late in the soak, %d early: growing", w.name, late.goroutines, early.goroutines)
		}
		if late.rssBytes > early.rssBytes*3/2+32<<20 {
			t.Errorf("%s: RSS %s MiB late in the soak, %s MiB early: growing", w.name, mib(late.rssBytes), mib(early.rssBytes))
		}
		if after[i].rssBytes > before[i].rssBytes*2+32<<20 {
			t.Errorf("%s: RSS %s MiB idle after the soak, %s MiB before", w.name, mib(after[i].rssBytes), mib(before[i].rssBytes))
		}
	}
	f.report(t, "soak", wall, extra)
	if f.failedBefore != 0 || f.cut != 0 || f.answered == 0 {
		t.Errorf("%d failed before streaming and %d cut of %d with no fault injected, want 0", f.failedBefore, f.cut, f.sent)
	}
	// With no Redis fault the only overshoot is what fail-open periods
	// (Redis calls over the limiter's timeout) allow.
	if bound := failOpenAllowance(soakRPM, ps, 0, wall+time.Minute) + 1; f.overAdmitted > bound {
		t.Errorf("limited tenant admitted %d beyond its limit, bound %d", f.overAdmitted, bound)
	}
}
