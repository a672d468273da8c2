package ratelimit

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier2/tenant"
)

// backends runs a test against the in-memory limiter and a real Redis.
func backends(t *testing.T, f func(t *testing.T, newLimiter func(Options) *Limiter)) {
	t.Run("memory", func(t *testing.T) {
		f(t, func(o Options) *Limiter {
			l := New(o)
			t.Cleanup(func() { l.Close() })
			return l
		})
	})
	t.Run("redis", func(t *testing.T) {
		rs := testservice.StartRedis(t)
		f(t, func(o Options) *Limiter {
			rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
			t.Cleanup(func() { rdb.Close() })
			o.Redis = rdb
			// Generous: these tests are about the limits, and a 50ms
			// timeout on a loaded CI machine would fall back to local ones.
			o.Timeout = 2 * time.Second
			l := New(o)
			t.Cleanup(func() { l.Close() })
			return l
		})
	})
}

func admit(t *testing.T, l *Limiter, tn *tenant.Tenant, model string, est int) (*Reservation, Decision) {
	t.Helper()
	res, d, err := l.Admit(context.Background(), tn, model, est)
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	if d.Allowed != (res != nil) {
		t.Fatalf("Allowed=%v but reservation %v", d.Allowed, res)
	}
	return res, d
}

func TestLimits(t *testing.T) {
	backends(t, func(t *testing.T, newLimiter func(Options) *Limiter) {
		t.Run("rpm", func(t *testing.T) {
			l := newLimiter(Options{})
			tn := &tenant.Tenant{ID: "rpm", Limits: tenant.Limits{RPM: 5}}
			for i := 0; i < 5; i++ {
				res, d := admit(t, l, tn, "m", 0)
				if !d.Allowed {
					t.Fatalf("request %d rejected: %+v", i, d)
				}
				res.Finish(context.Background(), 0)
			}
			_, d := admit(t, l, tn, "m", 0)
			if d.Allowed || d.Reason != ReasonRPM || d.RetryAfter <= 0 || d.RetryAfter > 70*time.Second {
				t.Fatalf("6th request: %+v", d)
			}
			h := http.Header{}
			d.SetHeaders(h)
			if h.Get("Retry-After") == "" || h.Get("x-ratelimit-limit-requests") != "5" || h.Get("x-ratelimit-remaining-requests") != "0" {
				t.Fatalf("headers: %v", h)
			}
		})
		t.Run("concurrency", func(t *testing.T) {
			l := newLimiter(Options{})
			tn := &tenant.Tenant{ID: "conc", Limits: tenant.Limits{Concurrent: 2}}
			a, d1 := admit(t, l, tn, "m", 0)
			_, d2 := admit(t, l, tn, "m", 0)
			_, d3 := admit(t, l, tn, "m", 0)
			if !d1.Allowed || !d2.Allowed || d3.Allowed || d3.Reason != ReasonConcurrency || d3.RetryAfter <= 0 {
				t.Fatalf("decisions: %+v %+v %+v", d1, d2, d3)
			}
			a.Finish(context.Background(), 0)
			a.Finish(context.Background(), 0) // idempotent: must not free a second slot
			if !waitAllowed(t, l, tn) {
				t.Fatal("slot not released after Finish")
			}
			_, d5 := admit(t, l, tn, "m", 0)
			if d5.Allowed {
				t.Fatalf("double Finish freed two slots: %+v", d5)
			}
		})
		t.Run("tpm reconcile", func(t *testing.T) {
			l := newLimiter(Options{})
			tn := &tenant.Tenant{ID: "tpm", Limits: tenant.Limits{TPM: 1000}}
			a, d := admit(t, l, tn, "m", 600)
			if !d.Allowed {
				t.Fatalf("first: %+v", d)
			}
			if _, d := admit(t, l, tn, "m", 600); d.Allowed || d.Reason != ReasonTPM {
				t.Fatalf("second should exceed TPM: %+v", d)
			}
			a.Finish(context.Background(), 100) // refund 500
			if !waitAllowedN(t, l, tn, 600) {
				t.Fatal("refund not applied")
			}
			// 100 + 600 used; a charge above the estimate uses the rest.
			b, _ := admit(t, l, tn, "m", 200)
			if b == nil {
				t.Fatal("200 more should fit (700 used)")
			}
			b.Finish(context.Background(), 500) // charge 300 more: 100+600+500 = 1200 > 1000
			time.Sleep(2 * l.opts.SyncInterval)
			if _, d := admit(t, l, tn, "m", 1); d.Allowed {
				t.Fatalf("charge beyond estimate not applied: %+v", d)
			}
		})
		t.Run("budget", func(t *testing.T) {
			l := newLimiter(Options{})
			tn := &tenant.Tenant{ID: "bud", Limits: tenant.Limits{TokenBudget: 1000, BudgetPeriod: "day"}}
			a, d := admit(t, l, tn, "m", 900)
			if !d.Allowed {
				t.Fatalf("first: %+v", d)
			}
			a.Finish(context.Background(), 950)
			time.Sleep(2 * l.opts.SyncInterval)
			if _, d := admit(t, l, tn, "m", 100); d.Allowed || d.Reason != ReasonBudget {
				t.Fatalf("budget exceeded but allowed: %+v", d)
			}
			if _, d := admit(t, l, tn, "m", 50); !d.Allowed {
				t.Fatalf("50 left in budget: %+v", d)
			}
		})
		t.Run("model limits", func(t *testing.T) {
			l := newLimiter(Options{})
			tn := &tenant.Tenant{ID: "model", Limits: tenant.Limits{RPM: 100}, ModelLimits: map[string]tenant.Limits{"big": {RPM: 1}}}
			if _, d := admit(t, l, tn, "big", 0); !d.Allowed {
				t.Fatalf("first big: %+v", d)
			}
			if _, d := admit(t, l, tn, "big", 0); d.Allowed || d.Model != "big" {
				t.Fatalf("second big: %+v", d)
			}
			if _, d := admit(t, l, tn, "small", 0); !d.Allowed {
				t.Fatalf("small: %+v", d)
			}
		})
	})
}

// waitAllowed admits until allowed (refunds travel with the next sync).
func waitAllowed(t *testing.T, l *Limiter, tn *tenant.Tenant) bool { return waitAllowedN(t, l, tn, 0) }

func waitAllowedN(t *testing.T, l *Limiter, tn *tenant.Tenant, n int) bool {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, d := admit(t, l, tn, "m", n); d.Allowed {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// TestIdleStateEviction: a tenant's local state is dropped once idle, and
// the shared accounting (and the limit) survive it.
func TestIdleStateEviction(t *testing.T) {
	backends(t, func(t *testing.T, newLimiter func(Options) *Limiter) {
		l := newLimiter(Options{SyncInterval: 20 * time.Millisecond, idleAfter: 100 * time.Millisecond, LeaseTTL: 50 * time.Millisecond})
		tn := &tenant.Tenant{ID: "idle", Limits: tenant.Limits{RPM: 2}}
		for i := 0; i < 2; i++ {
			res, d := admit(t, l, tn, "m", 0)
			if !d.Allowed {
				t.Fatalf("admit %d: %+v", i, d)
			}
			res.Finish(context.Background(), 0)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			l.mu.Lock()
			n := len(l.states)
			l.mu.Unlock()
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("idle tenant state never evicted")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if _, d := admit(t, l, tn, "m", 0); d.Allowed || d.Reason != ReasonRPM {
			t.Fatalf("limit forgotten with the local state: %+v", d)
		}
	})
}

// A per-model limit on a base model covers its LoRA adapters (they run on
// the same pods): requests for the base and for an adapter count together.
func TestAdapterSharesBaseLimit(t *testing.T) {
	backends(t, func(t *testing.T, newLimiter func(Options) *Limiter) {
		bases := map[string]string{"llama-sql": "llama", "llama-chat": "llama"}
		l := newLimiter(Options{BaseModel: func(m string) string { return bases[m] }})
		tn := &tenant.Tenant{ID: "lora", ModelLimits: map[string]tenant.Limits{"llama": {RPM: 3}}}
		for i, m := range []string{"llama-sql", "llama", "llama-chat"} {
			if _, d := admit(t, l, tn, m, 0); !d.Allowed {
				t.Fatalf("request %d (%s) refused: %+v", i, m, d)
			}
		}
		for _, m := range []string{"llama-sql", "llama", "llama-chat"} {
			if _, d := admit(t, l, tn, m, 0); d.Allowed || d.Reason != ReasonRPM || d.Model != "llama" {
				t.Fatalf("%s over the base's limit: %+v", m, d)
			}
		}
		// Another model is not the base's business.
		if _, d := admit(t, l, tn, "other", 0); !d.Allowed {
			t.Fatalf("other model refused: %+v", d)
		}
	})
}
