package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier2/tenant"
)

func usageOf(t *testing.T, l *Limiter, tn *tenant.Tenant) ScopeUsage {
	t.Helper()
	u, err := l.Usage(context.Background(), tn)
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Scopes) == 0 {
		t.Fatalf("no scopes: %+v", u)
	}
	return u.Scopes[0]
}

// TestUsageExcludesLeases: used is what requests consumed or hold, not
// what the limiter leased for the next ones. A tenant with 128 concurrent
// slots gets 32 spare slots held on the replica with its first request; the
// admin API once reported them as 33 in use after that request finished.
func TestUsageExcludesLeases(t *testing.T) {
	backends(t, func(t *testing.T, newLimiter func(Options) *Limiter) {
		l := newLimiter(Options{})
		tn := &tenant.Tenant{ID: "use", Limits: tenant.Limits{RPM: 1200, TPM: 2_000_000, Concurrent: 128, TokenBudget: 1_000_000}}
		res, d := admit(t, l, tn, "m", 15)
		if !d.Allowed {
			t.Fatalf("admit: %+v", d)
		}
		u := usageOf(t, l, tn)
		if u.Concurrent.Used != 1 || u.Concurrent.Leased != 32 || u.Concurrent.Limit != 128 {
			t.Errorf("in flight: concurrency %+v, want used 1 leased 32", *u.Concurrent)
		}
		res.Finish(context.Background(), 3)
		u = usageOf(t, l, tn)
		if u.Concurrent.Used != 0 || u.Concurrent.Leased == 0 {
			t.Errorf("finished: concurrency %+v, want used 0 (the spare slots as leased)", *u.Concurrent)
		}
		// Estimated 15, used 3: the refund is still on its way to the
		// store, but it is not consumption.
		if u.RPM.Used != 1 || u.TPM.Used != 3 || u.Budget.Used != 3 {
			t.Errorf("finished: rpm %+v tpm %+v budget %+v, want 1, 3, 3 used", *u.RPM, *u.TPM, *u.Budget)
		}
		if u.TPM.Used+u.TPM.Leased != 15 {
			t.Errorf("tpm %+v: used + leased should be the 15 counted", *u.TPM)
		}
		// What remains, and when each limit is whole again: rates within
		// the minute, the budget at the end of its (monthly) period.
		if u.RPM.Remaining != 1200-u.RPM.Used-u.RPM.Leased || u.Budget.Remaining != 1_000_000-u.Budget.Used-u.Budget.Leased {
			t.Errorf("remaining: rpm %+v budget %+v", *u.RPM, *u.Budget)
		}
		for name, v := range map[string]*Value{"rpm": u.RPM, "tpm": u.TPM} {
			if v.ResetSeconds == nil || *v.ResetSeconds <= 0 || *v.ResetSeconds > 60 || v.ResetAt == nil {
				t.Errorf("%s reset = %v, want in (0, 60]", name, v.ResetSeconds)
			}
		}
		if _, end := periodID(tenant.PeriodMonth, time.Now()); u.Budget.ResetAt == nil || u.Budget.ResetAt.Sub(end).Abs() > time.Second {
			t.Errorf("budget reset at %v, want %v", u.Budget.ResetAt, end)
		}
		if u.Concurrent.ResetSeconds != nil || u.Concurrent.Remaining != 128-u.Concurrent.Used-u.Concurrent.Leased {
			t.Errorf("concurrency %+v", *u.Concurrent)
		}
	})
}

// TestUsageAcrossReplicas: one replica's request in flight shows as used
// through another replica's Usage, and its spare slots do not; once it
// finishes, the other replica sees it gone after the first one's next
// sync.
func TestUsageAcrossReplicas(t *testing.T) {
	rs := testservice.StartRedis(t)
	var lims []*Limiter
	for range 2 {
		rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
		t.Cleanup(func() { rdb.Close() })
		l := New(Options{Redis: rdb, Replicas: 2, Timeout: 2 * time.Second, SyncInterval: 20 * time.Millisecond})
		t.Cleanup(func() { l.Close() })
		lims = append(lims, l)
	}
	tn := &tenant.Tenant{ID: "multi", Limits: tenant.Limits{Concurrent: 40}}
	var held []*Reservation
	for range 3 {
		res, d := admit(t, lims[0], tn, "m", 0)
		if !d.Allowed {
			t.Fatalf("admit: %+v", d)
		}
		held = append(held, res)
	}
	// Replica 0 holds 3 in use plus 40 × 0.5 ÷ 2 ÷ 2 = 5 spare. The first
	// admission reported 1 in use; the next heartbeat reports 3.
	waitUsage(t, lims[1], tn, func(v Value) bool { return v.Used == 3 && v.Leased == 5 })
	for _, r := range held {
		r.Finish(context.Background(), 0)
	}
	waitUsage(t, lims[1], tn, func(v Value) bool { return v.Used == 0 && v.Leased == 5 })
}

func waitUsage(t *testing.T, l *Limiter, tn *tenant.Tenant, ok func(Value) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := *usageOf(t, l, tn).Concurrent
		if ok(v) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("concurrency usage %+v", v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
