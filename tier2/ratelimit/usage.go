package ratelimit

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/infergate/infergate/tier2/tenant"
)

// Value is one limit's current use across all replicas. Used counts units
// leased to replicas but not yet spent, so it can read a little high.
type Value struct {
	Used  int64 `json:"used"`
	Limit int64 `json:"limit"`
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
				if i == 0 {
					o.Key = len(keys)
				} else {
					o.DKey = len(keys)
				}
			}
			o.RO = true
			ops = append(ops, o)
			kinds = append(kinds, k)
		}
		var period string
		if lim.RPM > 0 {
			add(kRPM, &op{K: opWindow, Lim: int64(lim.RPM), W: w, N: nb}, "rpm")
		}
		if lim.TPM > 0 {
			add(kTPM, &op{K: opWindow, Lim: int64(lim.TPM), W: w, N: nb}, "tpm")
		}
		if lim.Concurrent > 0 {
			add(kConc, &op{K: opConc, Lim: int64(lim.Concurrent)}, "conc", "concdl")
		}
		if lim.TokenBudget > 0 {
			period = lim.BudgetPeriod
			if period == "" {
				period = tenant.PeriodMonth
			}
			cur, _ := periodID(period, now)
			o := &op{K: opBudget, Lim: lim.TokenBudget}
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
				v := &Value{Used: res[i].Used, Limit: ops[i].Lim}
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
