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
	// localUse is what the local limits admitted while Redis could not be
	// reached, by second, charged with the next call that succeeds. Only
	// the last window's worth is charged: older use has left the window.
	localUse []localUse

	local      *rate.Limiter
	localShare int64
}

// localUse is units admitted locally in the second starting at at.
type localUse struct {
	at time.Time
	n  int64
}

// addLocal records n units admitted (n < 0: returned, newest first) by
// the local limits at now, forgetting entries older than win.
func (r *resource) addLocal(n int64, now time.Time, win time.Duration) {
	i := 0
	for i < len(r.localUse) && now.Sub(r.localUse[i].at) >= win {
		i++
	}
	r.localUse = r.localUse[i:]
	if n < 0 {
		for j := len(r.localUse) - 1; j >= 0 && n < 0; j-- {
			x := min(-n, r.localUse[j].n)
			r.localUse[j].n -= x
			n += x
		}
		return
	}
	if k := len(r.localUse); k > 0 && now.Sub(r.localUse[k-1].at) < time.Second {
		r.localUse[k-1].n += n
		return
	}
	r.localUse = append(r.localUse, localUse{at: now, n: n})
}

// pendingLocal is what takeLocal would return, keeping it.
func (r *resource) pendingLocal(now time.Time, win time.Duration) int64 {
	var n int64
	for _, u := range r.localUse {
		if now.Sub(u.at) < win {
			n += u.n
		}
	}
	return n
}

// takeLocal returns the units admitted locally within win of now and
// forgets them.
func (r *resource) takeLocal(now time.Time, win time.Duration) int64 {
	n := r.pendingLocal(now, win)
	r.localUse = nil
	return n
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
	o.Debt, r.pendDebt = r.pendDebt+r.takeLocal(now, l.win()), 0
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
