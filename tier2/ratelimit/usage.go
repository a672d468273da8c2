package ratelimit

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/infergate/infergate/tier2/tenant"
)

// Value is one limit's current use across all replicas.
//
// Used is what requests consumed (RPM, TPM, budget) or hold right now
// (concurrency). Leased is what is counted against the limit on top of
// that without being used: concurrency slots replicas hold as spare, and
// for rates and budgets this replica's unspent leases and refunds on their
// way back to Redis. Other replicas' unspent rate and budget leases (each
// at most its rate × LeaseTTL, returned within LeaseTTL + FlushInterval)
// are still in Used. Another replica's slots in use are as of its last
// sync, at most SlotTTL/3 ago.
//
// Remaining is limit - used - leased (at least 0). ResetSeconds and
// ResetAt say when the limit is whole again: for RPM and TPM when all it
// counts has left the window (at most a minute), for a budget the end of
// its period; absent for concurrency.
type Value struct {
	Used         int64      `json:"used"`
	Limit        int64      `json:"limit"`
	Leased       int64      `json:"leased"`
	Remaining    int64      `json:"remaining"`
	ResetSeconds *float64   `json:"reset_seconds,omitempty"`
	ResetAt      *time.Time `json:"reset_at,omitempty"`
}

// ScopeUsage is the use of the tenant-wide limits (Model "") or of one
// model's limits.
type ScopeUsage struct {
	Model        string `json:"model,omitempty"`
	RPM          *Value `json:"rpm,omitempty"`
	TPM          *Value `json:"tpm,omitempty"`
	Concurrent   *Value `json:"concurrent,omitempty"`
	Budget       *Value `json:"budget,omitempty"`
	BudgetPeriod string `json:"budget_period,omitempty"`
}

// Usage is a tenant's current use of its limits.
type Usage struct {
	TenantID string       `json:"tenant_id"`
	Scopes   []ScopeUsage `json:"scopes"`
}

// Usage reads a tenant's current use from Redis (or memory) without
// changing it. It is for the admin API, not the request path.
func (l *Limiter) Usage(ctx context.Context, t *tenant.Tenant) (Usage, error) {
	u := Usage{TenantID: t.ID, Scopes: []ScopeUsage{}}
	scopes := []string{""}
	models := make([]string, 0, len(t.ModelLimits))
	for m := range t.ModelLimits {
		models = append(models, m)
	}
	sort.Strings(models)
	scopes = append(scopes, models...)
	now := time.Now()
	w, nb := l.geometry()
	for _, scope := range scopes {
		lim := t.Limits
		if scope != "" {
			lim = t.ModelLimits[scope]
		}
		var keys []string
		var ops []*op
		var kinds []kind
		add := func(k kind, o *op, names ...string) {
			for i, n := range names {
				keys = append(keys, l.key(t.ID, n, scope))
				switch i {
				case 0:
					o.Key = len(keys)
				case 1:
					o.DKey = len(keys)
				default:
					o.UKey = len(keys)
				}
			}
			o.RO = true
			ops = append(ops, o)
			kinds = append(kinds, k)
		}
		var period, cur string
		if lim.RPM > 0 {
			add(kRPM, &op{K: opWindow, Lim: int64(lim.RPM), W: w, N: nb}, "rpm")
		}
		if lim.TPM > 0 {
			add(kTPM, &op{K: opWindow, Lim: int64(lim.TPM), W: w, N: nb}, "tpm")
		}
		if lim.Concurrent > 0 {
			add(kConc, &op{K: opConc, Lim: int64(lim.Concurrent)}, "conc", "concdl", "concuse")
		}
		if lim.TokenBudget > 0 {
			period = lim.BudgetPeriod
			if period == "" {
				period = tenant.PeriodMonth
			}
			var end time.Time
			cur, end = periodID(period, now)
			o := &op{K: opBudget, Lim: lim.TokenBudget, ResetM: end.Sub(now).Milliseconds()}
			keys = append(keys, l.key(t.ID, "budget", scope+":"+cur))
			o.Key, o.RO = len(keys), true
			ops = append(ops, o)
			kinds = append(kinds, kBudget)
		}
		su := ScopeUsage{Model: scope, BudgetPeriod: period}
		if len(ops) > 0 {
			cctx, cancel := context.WithTimeout(ctx, max(l.opts.Timeout, time.Second))
			res, err := l.be.run(cctx, keys, ops, l.opts.ReplicaID)
			cancel()
			if err != nil {
				return Usage{}, fmt.Errorf("ratelimit: usage of %s: %w", t.ID, err)
			}
			for i, k := range kinds {
				v := l.value(t.ID, k, scope, cur, nb, res[i], now)
				v.Limit = ops[i].Lim
				v.Remaining = max(v.Limit-v.Used-v.Leased, 0)
				if k != kConc {
					secs := res[i].Reset.Seconds()
					at := now.Add(res[i].Reset).UTC().Truncate(time.Millisecond)
					v.ResetSeconds, v.ResetAt = &secs, &at
				}
				switch k {
				case kRPM:
					su.RPM = v
				case kTPM:
					su.TPM = v
				case kConc:
					su.Concurrent = v
				case kBudget:
					su.Budget = v
				}
			}
		}
		u.Scopes = append(u.Scopes, su)
	}
	return u, nil
}

// value splits what Redis counts for one limit into used and leased. For
// concurrency Redis knows both (each replica reports its slots in use);
// for rates and budgets it only knows grants, so this replica takes out
// what it knows is not consumed: its unspent leases and pending refunds,
// less charges not yet sent. This replica's own figures are live rather
// than as of its last sync.
func (l *Limiter) value(tenantID string, k kind, scope, period string, nb int64, res result, now time.Time) *Value {
	total := res.Used
	var notUsed int64
	l.mu.Lock()
	st := l.states[tenantID]
	l.mu.Unlock()
	var r *resource
	if st != nil {
		st.mu.Lock()
		defer st.mu.Unlock()
		r = st.res[resKey{k, scope}]
	}
	switch k {
	case kConc:
		busy := res.Busy + res.Mine
		if r != nil {
			busy = res.Busy + r.inUse
		}
		return &Value{Used: busy, Leased: max(total-busy, 0)}
	case kRPM, kTPM:
		if r != nil {
			notUsed = r.avail(now) - r.pendDebt - r.pendingLocal(now, l.win())
			first := res.Bucket - nb + 1
			for b, v := range r.pendRef {
				if b >= first {
					notUsed += v
				}
			}
		}
	case kBudget:
		if r != nil && r.period != "" {
			if cur, _ := r.periodAt(now); cur == period {
				notUsed = r.avail(now) - r.pendBudget[cur]
			}
		}
	}
	// Charges not yet sent (notUsed < 0) make used exceed what Redis has.
	used := max(total-notUsed, 0)
	return &Value{Used: used, Leased: max(total-used, 0)}
}
