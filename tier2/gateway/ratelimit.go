package gateway

import (
	"context"

	"github.com/infergate/infergate/tier2/ratelimit"
	"github.com/infergate/infergate/tier2/tenant"
)

// RateLimiter adapts a *ratelimit.Limiter to Limiter.
func RateLimiter(l *ratelimit.Limiter) Limiter {
	return LimiterFunc(func(ctx context.Context, t *tenant.Tenant, model string, est int) (Admission, error) {
		res, d, err := l.Admit(ctx, t, model, est)
		adm := Admission{Allowed: d.Allowed, Reason: d.Reason, RetryAfter: d.RetryAfter, SetHeaders: d.SetHeaders}
		if !d.Allowed && d.Reason != ratelimit.ReasonUnavailable {
			adm.Code, adm.Message = d.Code(), d.Message()
		}
		if res != nil {
			adm.Finish = res.Finish
		}
		return adm, err
	})
}
