package ratelimit

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// tenantState is one replica's view of one tenant's limits: its leases,
// in-use slots and pending refunds. mu guards the fields; fetchMu makes
// Redis calls for one tenant one at a time, so a burst of admissions that
// all miss the local lease shares one round trip.
type tenantState struct {
	id          string
	mu          sync.Mutex
	fetchMu     sync.Mutex
	prefetching atomic.Bool
	res         map[resKey]*resource
	lastUse     time.Time
	lastSync    time.Time
	evicted     bool // removed from Limiter.states; look it up again
}

type resKey struct {
	k     kind
	scope string
}

// resource is one limit (e.g. the tenant's TPM, or a model's RPM). The
// fields every kind shares are here; each kind's own state is in its
// embedded part: leases for rates and budgets (lease.go), window refunds
// and the outage limiter for rates (rates.go), the period and its
// refunds for budgets (budgets.go), slots for concurrency
// (concurrency.go). Only the part of r.k is used.
type resource struct {
	k     kind
	scope string
	limit int64

	used     int64 // all replicas, at the last sync
	reset    time.Duration
	syncedAt time.Time

	deniedUntil time.Time
	deniedNeed  int64
	retryAt     time.Time

	lease
	rates
	budget
	slots
}

// item pairs a resource with one request's need of it.
type item struct {
	r *resource
	n int64
}

func (st *tenantState) resolve(l *Limiter, needs []need, now time.Time) []item {
	st.lastUse = now
	out := make([]item, 0, len(needs))
	for _, nd := range needs {
		k := resKey{nd.k, nd.scope}
		r := st.res[k]
		if r == nil {
			r = &resource{k: nd.k, scope: nd.scope,
				lease: lease{rateAt: now}, rates: rates{pendRef: map[int64]int64{}}, budget: budget{pendBudget: map[string]int64{}, lastRemaining: -1}}
			st.res[k] = r
		}
		r.limit, r.period = nd.limit, nd.per
		out = append(out, item{r: r, n: nd.n})
	}
	return out
}

func (st *tenantState) cachedDenial(rs []item, now time.Time) (Decision, bool) {
	for _, it := range rs {
		r := it.r
		if now.Before(r.deniedUntil) && it.n >= r.deniedNeed {
			d := st.refusal(rs, r, now)
			d.RetryAfter = max(r.retryAt.Sub(now), 0)
			return d, true
		}
	}
	return Decision{}, false
}

// refusal is the decision refusing rs because of r: the headers' windows,
// and r's limit, what is left of it, what the request needed of it and
// when it resets. The caller sets RetryAfter.
func (st *tenantState) refusal(rs []item, r *resource, now time.Time) Decision {
	d := st.decision(rs, now)
	w := r.window(now)
	d.Allowed = false
	d.Reason, d.Model, d.Limit, d.Remaining, d.Reset = r.k.reason(), r.scope, r.limit, w.Remaining, w.Reset
	for _, it := range rs {
		if it.r == r {
			d.Need += it.n
		}
	}
	if r.k == kBudget {
		d.Period = r.period
	}
	return d
}

func (st *tenantState) fits(rs []item, now time.Time) bool {
	for _, it := range rs {
		r := it.r
		switch r.k {
		case kConc:
			if r.held-r.inUse < 1 {
				return false
			}
		default:
			if r.avail(now) < it.n {
				return false
			}
		}
	}
	return true
}

// short returns the first resource that cannot cover its need locally.
func (st *tenantState) short(rs []item, now time.Time) *resource {
	for _, it := range rs {
		if !st.fits([]item{it}, now) {
			return it.r
		}
	}
	return nil
}

// consume takes every need from the local leases; fits must have said yes.
func (st *tenantState) consume(l *Limiter, rs []item, now time.Time) (*Reservation, Decision) {
	res := &Reservation{l: l, st: st, parts: make([]part, 0, len(rs))}
	for _, it := range rs {
		r := it.r
		p := part{r: r, n: it.n}
		if r.k == kConc {
			r.inUse++
		} else {
			p.uses, _ = r.take(it.n)
		}
		r.consumed += it.n
		res.parts = append(res.parts, p)
	}
	st.lastUse = now
	d := st.decision(rs, now)
	d.Allowed = true
	return res, d
}

// window is what this replica knows of r: what the last sync left of the
// limit plus its own unspent lease (other replicas' unspent leases count
// as used), and the time until the limit is whole again.
func (r *resource) window(now time.Time) Window {
	rem := r.limit - r.used
	if r.k != kConc {
		rem += r.avail(now)
	} else {
		rem += r.held - r.inUse
	}
	rem = min(max(rem, 0), r.limit)
	reset := r.reset - now.Sub(r.syncedAt)
	return Window{Limit: r.limit, Remaining: rem, Reset: max(reset, 0)}
}

// decision fills the header windows from the last sync plus local leases.
func (st *tenantState) decision(rs []item, now time.Time) Decision {
	var d Decision
	var tight *Window
	tightFrac := math.Inf(1)
	for _, it := range rs {
		w := it.r.window(now)
		switch it.r.k {
		case kRPM:
			if d.Requests.Limit == 0 || w.Remaining < d.Requests.Remaining {
				d.Requests = w
			}
		case kTPM:
			if d.Tokens.Limit == 0 || w.Remaining < d.Tokens.Remaining {
				d.Tokens = w
			}
		case kBudget:
			if d.Budget.Limit == 0 || w.Remaining < d.Budget.Remaining {
				d.Budget = w
			}
		}
		if f := float64(w.Remaining) / float64(w.Limit); f < tightFrac {
			tightFrac = f
			ww := w
			tight = &ww
		}
	}
	if tight != nil {
		d.Limit, d.Remaining, d.Reset = tight.Limit, tight.Remaining, tight.Reset
	}
	return d
}

func (st *tenantState) wantsRefill(l *Limiter, now time.Time) bool {
	for _, r := range st.res {
		if r.k != kConc && l.wantsLease(r, now) {
			return true
		}
	}
	return false
}

// backgroundDue reports whether the loop should sync this tenant now.
func (st *tenantState) backgroundDue(l *Limiter, now time.Time) bool {
	st.updateRates(now)
	// Refunds and charges ride along with every call; on their own they
	// wait FlushInterval, which bounds their cost to one call per tenant
	// per FlushInterval however many requests finish.
	flush := now.Sub(st.lastSync) >= l.opts.FlushInterval
	for _, r := range st.res {
		r.expire(now)
		if flush && (len(r.pendRef) > 0 || r.pendDebt > 0 || len(r.localUse) > 0) {
			return true
		}
		for _, v := range r.pendBudget {
			if flush && v != 0 {
				return true
			}
		}
		if r.k == kConc {
			if l.concBeatDue(r, now) {
				return true
			}
			continue
		}
		if l.wantsLease(r, now) {
			return true
		}
	}
	return false
}

func (st *tenantState) idle(now time.Time, after time.Duration) bool {
	if now.Sub(st.lastUse) < after {
		return false
	}
	for _, r := range st.res {
		if len(r.chunks) > 0 || len(r.pendRef) > 0 || r.pendDebt > 0 || len(r.localUse) > 0 || r.inUse > 0 || r.held > 0 || r.registered {
			return false
		}
		for _, v := range r.pendBudget {
			if v != 0 {
				return false
			}
		}
	}
	return true
}

func (l *Limiter) key(tenantID, name, scope string) string {
	return l.opts.KeyPrefix + "{" + tenantID + "}:" + name + ":" + scope
}

// call is one script call being built: its KEYS (1-based in ops) and ops.
type call struct {
	tenant string
	keys   []string
	idx    map[string]int
	ops    []*op
}

// key returns the 1-based index of the tenant's key name:scope in KEYS.
func (c *call) key(l *Limiter, name, scope string) int {
	k := l.key(c.tenant, name, scope)
	if i, ok := c.idx[k]; ok {
		return i
	}
	c.keys = append(c.keys, k)
	c.idx[k] = len(c.keys)
	return len(c.keys)
}

// demand is what one call asks of one resource: n units when an admission
// needs it (needed), and whether to top up a lease running low (refill).
type demand struct {
	n              int64
	needed, refill bool
}

// buildOps collects one call's work. rs are the needs of an admission (nil
// for background syncs); refill asks for more lease when running low.
func (st *tenantState) buildOps(l *Limiter, rs []item, now time.Time, refill bool) ([]string, []*op) {
	needs := map[*resource]int64{}
	for _, it := range rs {
		needs[it.r] += it.n
	}
	c := &call{tenant: st.id, idx: map[string]int{}}
	for _, r := range st.res {
		n, needed := needs[r]
		d := demand{n: n, needed: needed, refill: refill}
		switch r.k {
		case kRPM, kTPM:
			l.windowOp(c, r, d, now)
		case kBudget:
			l.budgetOps(c, r, d, now)
		case kConc:
			l.concOp(c, r, d, now)
		}
	}
	return c.keys, c.ops
}

// leaseAsk sets o's Need (what an admission lacks beyond the local lease,
// all or nothing) and Ask (a lease on top, best effort).
func (l *Limiter) leaseAsk(o *op, r *resource, d demand, now time.Time) {
	av, target := r.avail(now), l.leaseTarget(r)
	o.Rsv = l.reserve(r)
	switch {
	case d.needed:
		o.reqN = d.n
		o.Need = max(0, d.n-av)
		o.Ask = max(0, l.slowStart(r, target, d.n, now)+d.n-av-o.Need)
	case d.refill && l.wantsLease(r, now):
		o.Ask = target - av
	}
}

// restore puts back what buildOps took when the call failed. A timed-out
// call may still have run in Redis, so only charges are put back (a double
// charge under-admits); refunds are dropped (a double refund would let the
// tenant over the limit).
func (st *tenantState) restore(ops []*op) {
	for _, o := range ops {
		r := o.res
		switch o.K {
		case opWindow:
			r.pendDebt += o.Debt
		case opBudget:
			for _, b := range o.refBud {
				if b.n > 0 {
					r.pendBudget[b.period] += b.n
				}
			}
		}
	}
}

// apply records a call's results. It returns the first denied resource.
func (st *tenantState) apply(l *Limiter, ops []*op, results []result, sent, now time.Time) *resource {
	var denied *resource
	for i, o := range ops {
		r, res := o.res, results[i]
		switch o.K {
		case opWindow:
			if res.Granted > 0 {
				r.chunks = append(r.chunks, chunk{bucket: res.Bucket, n: res.Granted, exp: sent.Add(l.leaseTTL())})
			}
		case opBudget:
			if o.other {
				continue // a refund to an earlier period
			}
			if res.Granted > 0 {
				cur, _ := r.periodAt(sent)
				r.chunks = append(r.chunks, chunk{period: cur, n: res.Granted, exp: sent.Add(l.leaseTTL())})
			}
			r.lastRemaining = max(r.limit-res.Used, 0)
			r.outageSpent = 0
		case opConc:
			r.held = o.InUse + res.Granted
			r.registered = r.held > 0
			r.lastBeat = now
		}
		r.used, r.reset, r.syncedAt = res.Used, res.Reset, now
		if res.Denied {
			if denied == nil {
				denied = r
			}
			var wait time.Duration
			switch {
			case o.K == opConc:
				// Nobody knows when a slot frees; a second is a polite guess.
				wait = time.Second
			case res.Retry >= 0:
				wait = res.Retry
			default:
				wait = res.Reset
			}
			r.retryAt = now.Add(wait)
			// Answer the same question locally for a moment instead of
			// asking Redis again for every request of an over-limit tenant.
			// (Slots freed on other replicas come back only at their next
			// sync anyway, so this costs concurrency nothing.)
			r.deniedUntil = now.Add(min(wait, l.opts.SyncInterval))
			r.deniedNeed = o.reqN
		}
	}
	return denied
}

func (l *Limiter) leaseTTL() time.Duration { return l.opts.LeaseTTL }

// finishPart settles one part of a finished request with its real token
// count: a slot is freed; tokens estimated but unused go back, tokens used
// beyond the estimate are charged.
func (st *tenantState) finishPart(p part, actual int64, local bool, now time.Time, win time.Duration) {
	r := p.r
	switch r.k {
	case kConc:
		r.inUse = max(r.inUse-1, 0)
	case kTPM:
		if !local {
			r.settleTokens(p, actual, now)
			break
		}
		// Admitted locally: the estimate waits to be charged (fallback);
		// charge the actual count instead. If it has gone out already, an
		// overestimate stays charged (under-admits, never over).
		r.addLocal(actual-p.n, now, win)
	case kBudget:
		r.settleBudget(p, actual, local, now)
	}
}
