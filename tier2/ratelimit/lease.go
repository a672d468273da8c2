package ratelimit

import "time"

// lease is what a replica holds of a rate or budget limit: slices granted
// by Redis (already counted there) that it spends locally until they
// lapse, and the local rate that sizes the next lease.
type lease struct {
	chunks    []chunk // leased, unused units
	consumed  int64
	rate      float64 // units per second, local
	rateAt    time.Time
	lastAsk   int64 // slow start
	lastFetch time.Time
}

type chunk struct {
	bucket int64
	period string
	n      int64
	exp    time.Time
}

// expire turns lapsed leases into pending refunds.
func (r *resource) expire(now time.Time) {
	cur := ""
	if r.k == kBudget {
		cur, _ = r.periodAt(now)
	}
	kept := r.chunks[:0]
	for _, c := range r.chunks {
		if c.n > 0 && now.Before(c.exp) && (r.k != kBudget || c.period == cur) {
			kept = append(kept, c)
			continue
		}
		r.refund(c.bucket, c.period, c.n)
	}
	r.chunks = kept
}

func (r *resource) expireAll() {
	for _, c := range r.chunks {
		r.refund(c.bucket, c.period, c.n)
	}
	r.chunks = nil
	if r.k == kConc {
		r.held = r.inUse
	}
}

func (r *resource) refund(bucket int64, period string, n int64) {
	if n <= 0 {
		return
	}
	switch r.k {
	case kBudget:
		r.pendBudget[period] -= n
	default:
		r.pendRef[bucket] += n
	}
}

func (r *resource) avail(now time.Time) int64 {
	r.expire(now)
	var n int64
	for _, c := range r.chunks {
		n += c.n
	}
	return n
}

// take consumes n leased units oldest first and reports where they came
// from; it returns false (consuming nothing) when the lease is short.
func (r *resource) take(n int64) ([]chunkUse, bool) {
	var have int64
	for _, c := range r.chunks {
		have += c.n
	}
	if have < n {
		return nil, false
	}
	var uses []chunkUse
	for i := range r.chunks {
		if n == 0 {
			break
		}
		c := &r.chunks[i]
		t := min(c.n, n)
		if t == 0 {
			continue
		}
		c.n -= t
		n -= t
		uses = append(uses, chunkUse{bucket: c.bucket, period: c.period, n: t})
	}
	return uses, true
}

// takeUpTo consumes up to n leased units and returns how many.
func (r *resource) takeUpTo(n int64) int64 {
	var got int64
	for i := range r.chunks {
		c := &r.chunks[i]
		t := min(c.n, n-got)
		c.n -= t
		got += t
	}
	return got
}

// leaseCap is the most one replica leases of r: limit × MaxLeaseFraction
// ÷ Replicas, at least 1.
func (l *Limiter) leaseCap(r *resource) int64 {
	return max(int64(float64(r.limit)*l.opts.MaxLeaseFraction/float64(l.opts.Replicas)), 1)
}

// reserve is how much of a rate or budget limit Redis keeps out of
// leases (op.Rsv): what all replicas' leases together may hold (counting
// at least two replicas, in case limits.replicas is left at 1), about
// limit × MaxLeaseFraction. In that last part of a window or budget
// every admission is decided by Redis, so replicas agree on what is left
// and, once earlier leases have been spent or lapsed (LeaseTTL), none
// refuses while another parks the last units in a lease. One replica in
// memory needs none.
func (l *Limiter) reserve(r *resource) int64 {
	if !l.shared {
		return 0
	}
	return l.leaseCap(r) * int64(max(l.opts.Replicas, 2))
}

// nearLimit reports whether, as of the last sync, what is left of r is
// within the reserve: Redis grants no lease then, so a refill would be a
// wasted call; one is tried again after FlushInterval, when the window
// may have moved on.
func (l *Limiter) nearLimit(r *resource, now time.Time) bool {
	return l.shared && !r.syncedAt.IsZero() && r.limit-r.used <= l.reserve(r) && now.Sub(r.syncedAt) < l.opts.FlushInterval
}

// wantsLease reports whether r's lease is low enough to refill.
func (l *Limiter) wantsLease(r *resource, now time.Time) bool {
	t := l.leaseTarget(r)
	return t > 0 && r.avail(now) < t/2 && !l.nearLimit(r, now)
}

// leaseTarget is how many units to hold locally: what this replica used
// in LeaseTTL at its recent rate, capped so one replica cannot hoard.
func (l *Limiter) leaseTarget(r *resource) int64 {
	capN := int64(float64(r.limit) * l.opts.MaxLeaseFraction / float64(l.opts.Replicas))
	if r.k == kConc {
		return max(capN/2, 0)
	}
	t := int64(r.rate * l.opts.LeaseTTL.Seconds())
	return min(max(t, 0), max(capN, 1))
}

// slowStart sizes a lease fetched because an admission ran out: when the
// previous lease went in under half its life, ask for twice as much (up to
// the cap), so a new or bursting tenant reaches its rate in a few round
// trips instead of one per request.
func (l *Limiter) slowStart(r *resource, target, n int64, now time.Time) int64 {
	ask := target
	if now.Sub(r.lastFetch) < l.opts.LeaseTTL/2 {
		ask = max(target, min(2*r.lastAsk, l.leaseCap(r)))
	}
	r.lastAsk, r.lastFetch = max(ask, n), now
	return ask
}

func (st *tenantState) updateRates(now time.Time) {
	for _, r := range st.res {
		el := now.Sub(r.rateAt).Seconds()
		if el < 0.5 {
			continue
		}
		inst := float64(r.consumed) / el
		if r.rate == 0 {
			r.rate = inst
		} else {
			r.rate = 0.5*r.rate + 0.5*inst
		}
		if r.rate < 0.01 {
			r.rate = 0
		}
		r.consumed, r.rateAt = 0, now
	}
}
