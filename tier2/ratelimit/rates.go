package ratelimit

import (
	"time"

	"golang.org/x/time/rate"
)

// rates is a requests- or tokens-per-minute limit's own state: refunds by
// bucket and charges on their way back to Redis, and the token bucket that
// stands in for the window while Redis is down.
type rates struct {
	pendRef  map[int64]int64 // bucket -> units to give back
	pendDebt int64           // units to add to the current bucket

	local      *rate.Limiter
	localShare int64
}

func (r *resource) localLimiter(share int64, win time.Duration) *rate.Limiter {
	burst := int(max(1, share/4))
	perSec := rate.Limit(float64(share) / win.Seconds())
	if r.local == nil {
		r.local = rate.NewLimiter(perSec, burst)
	} else if r.localShare != share {
		r.local.SetLimit(perSec)
		r.local.SetBurst(burst)
	}
	r.localShare = share
	return r.local
}

// windowOp adds r's op to c: the admission's need and a lease, plus the
// refunds and charges waiting to go back.
func (l *Limiter) windowOp(c *call, r *resource, d demand, now time.Time) {
	w, nb := l.geometry()
	o := &op{K: opWindow, Lim: r.limit, W: w, N: nb, res: r}
	l.leaseAsk(o, r, d, now)
	for b, v := range r.pendRef {
		o.Ref = append(o.Ref, [2]int64{b, v})
	}
	clear(r.pendRef)
	o.Debt, r.pendDebt = r.pendDebt, 0
	if o.Need == 0 && o.Ask == 0 && len(o.Ref) == 0 && o.Debt == 0 && !d.needed {
		return
	}
	name := "rpm"
	if r.k == kTPM {
		name = "tpm"
	}
	o.Key = c.key(l, name, r.scope)
	c.ops = append(c.ops, o)
}

// settleTokens refunds the unused part of an estimate to the buckets it
// was taken from, newest first, or charges the excess.
func (r *resource) settleTokens(p part, actual int64, now time.Time) {
	delta := actual - p.n
	if delta < 0 {
		refund := -delta
		for i := len(p.uses) - 1; i >= 0 && refund > 0; i-- {
			x := min(refund, p.uses[i].n)
			r.pendRef[p.uses[i].bucket] += x
			refund -= x
		}
	} else if delta > 0 {
		// Spend what is leased locally first: those units are already
		// counted in Redis, so only the rest becomes new debt.
		r.expire(now)
		r.pendDebt += delta - r.takeUpTo(delta)
	}
}
