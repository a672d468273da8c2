package ratelimit

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/infergate/infergate/tier2/tenant"
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

// resource is one limit (e.g. the tenant's TPM, or a model's RPM).
type resource struct {
	k      kind
	scope  string
	limit  int64
	period string // budget: "day" or "month"

	chunks     []chunk // leased, unused units (windows, budget)
	pendRef    map[int64]int64
	pendDebt   int64
	pendBudget map[string]int64 // budget period id -> delta to apply

	inUse, held int64 // concurrency
	registered  bool
	lastBeat    time.Time

	used     int64 // all replicas, at the last sync
	reset    time.Duration
	syncedAt time.Time

	deniedUntil time.Time
	deniedNeed  int64
	retryAt     time.Time

	consumed int64
	rate     float64 // units per second, local
	rateAt   time.Time

	lastAsk   int64 // slow start
	lastFetch time.Time

	perID, perKind   string // periodAt cache
	perStart, perEnd time.Time

	local         *rate.Limiter
	localShare    int64
	lastRemaining int64 // budget, -1 unknown
	outageSpent   int64
}

type chunk struct {
	bucket int64
	period string
	n      int64
	exp    time.Time
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
			r = &resource{k: nd.k, scope: nd.scope, pendRef: map[int64]int64{}, pendBudget: map[string]int64{}, rateAt: now, lastRemaining: -1}
			st.res[k] = r
		}
		r.limit, r.period = nd.limit, nd.per
		out = append(out, item{r: r, n: nd.n})
	}
	return out
}

func periodID(period string, now time.Time) (id string, end time.Time) {
	now = now.UTC()
	if period == tenant.PeriodDay {
		start := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
		return "d" + start.Format("20060102"), start.AddDate(0, 0, 1)
	}
	start := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	return "m" + start.Format("200601"), start.AddDate(0, 1, 0)
}

// periodAt is periodID cached until the period ends (it formats dates).
func (r *resource) periodAt(now time.Time) (string, time.Time) {
	if r.perID == "" || r.perKind != r.period || !now.Before(r.perEnd) || now.Before(r.perStart) {
		r.perID, r.perEnd = periodID(r.period, now)
		r.perStart, _ = periodEnd(r.perID)
		r.perKind = r.period
	}
	return r.perID, r.perEnd
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

func (st *tenantState) cachedDenial(rs []item, now time.Time) (Decision, bool) {
	for _, it := range rs {
		r := it.r
		if now.Before(r.deniedUntil) && it.n >= r.deniedNeed {
			d := st.decision(rs, now)
			d.Allowed = false
			d.Reason, d.Model, d.Limit, d.Remaining = r.k.reason(), r.scope, r.limit, 0
			d.RetryAfter = max(r.retryAt.Sub(now), 0)
			return d, true
		}
	}
	return Decision{}, false
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

// decision fills the header windows from the last sync plus local leases.
func (st *tenantState) decision(rs []item, now time.Time) Decision {
	var d Decision
	win := func(r *resource) Window {
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
	var tight *Window
	tightFrac := math.Inf(1)
	for _, it := range rs {
		w := win(it.r)
		switch it.r.k {
		case kRPM:
			if d.Requests.Limit == 0 || w.Remaining < d.Requests.Remaining {
				d.Requests = w
			}
		case kTPM:
			if d.Tokens.Limit == 0 || w.Remaining < d.Tokens.Remaining {
				d.Tokens = w
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
		capN := max(int64(float64(r.limit)*l.opts.MaxLeaseFraction/float64(l.opts.Replicas)), 1)
		ask = max(target, min(2*r.lastAsk, capN))
	}
	r.lastAsk, r.lastFetch = max(ask, n), now
	return ask
}

func (st *tenantState) wantsRefill(l *Limiter, now time.Time) bool {
	for _, r := range st.res {
		if r.k == kConc {
			continue
		}
		t := l.leaseTarget(r)
		if t > 0 && r.avail(now) < t/2 {
			return true
		}
	}
	return false
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

// backgroundDue reports whether the loop should sync this tenant now.
func (st *tenantState) backgroundDue(l *Limiter, now time.Time) bool {
	st.updateRates(now)
	// Refunds and charges ride along with every call; on their own they
	// wait FlushInterval, which bounds their cost to one call per tenant
	// per FlushInterval however many requests finish.
	flush := now.Sub(st.lastSync) >= l.opts.FlushInterval
	for _, r := range st.res {
		r.expire(now)
		if flush && (len(r.pendRef) > 0 || r.pendDebt > 0) {
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
		if t := l.leaseTarget(r); t > 0 && r.avail(now) < t/2 {
			return true
		}
	}
	return false
}

func (l *Limiter) concBeatDue(r *resource, now time.Time) bool {
	target := r.inUse + l.leaseTarget(r)
	if r.held > target || r.inUse > r.held {
		return true
	}
	return (r.held > 0 || r.registered) && now.Sub(r.lastBeat) >= l.opts.SlotTTL/3
}

func (st *tenantState) idle(now time.Time, after time.Duration) bool {
	if now.Sub(st.lastUse) < after {
		return false
	}
	for _, r := range st.res {
		if len(r.chunks) > 0 || len(r.pendRef) > 0 || r.pendDebt > 0 || r.inUse > 0 || r.held > 0 || r.registered {
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

// buildOps collects one call's work. rs are the needs of an admission (nil
// for background syncs); refill asks for more lease when running low.
func (st *tenantState) buildOps(l *Limiter, rs []item, now time.Time, refill bool) ([]string, []*op) {
	needs := map[*resource]int64{}
	for _, it := range rs {
		needs[it.r] += it.n
	}
	var keys []string
	idx := map[string]int{}
	keyIdx := func(k string) int {
		if i, ok := idx[k]; ok {
			return i
		}
		keys = append(keys, k)
		idx[k] = len(keys)
		return len(keys)
	}
	w, nb := l.geometry()
	var ops []*op
	for rk, r := range st.res {
		n, needed := needs[r]
		target := l.leaseTarget(r)
		switch r.k {
		case kRPM, kTPM:
			name := "rpm"
			if r.k == kTPM {
				name = "tpm"
			}
			av := r.avail(now)
			o := &op{K: opWindow, Lim: r.limit, W: w, N: nb, res: r}
			if needed {
				o.reqN = n
				o.Need = max(0, n-av)
				o.Ask = max(0, l.slowStart(r, target, n, now)+n-av-o.Need)
			} else if refill && target > 0 && av < target/2 {
				o.Ask = target - av
			}
			for b, v := range r.pendRef {
				o.Ref = append(o.Ref, [2]int64{b, v})
			}
			clear(r.pendRef)
			o.Debt, r.pendDebt = r.pendDebt, 0
			if o.Need == 0 && o.Ask == 0 && len(o.Ref) == 0 && o.Debt == 0 && !needed {
				continue
			}
			o.Key = keyIdx(l.key(st.id, name, rk.scope))
			ops = append(ops, o)
		case kBudget:
			cur, end := r.periodAt(now)
			av := r.avail(now)
			for p, v := range r.pendBudget {
				if p == cur || v == 0 {
					continue
				}
				_, pend := periodEnd(p)
				ops = append(ops, &op{K: opBudget, Key: keyIdx(l.key(st.id, "budget", rk.scope+":"+p)), Lim: r.limit, Delta: v, Exp: pend.Add(24 * time.Hour).Unix(), res: r, refBud: []budgetRef{{p, v}}, other: true})
				delete(r.pendBudget, p)
			}
			o := &op{K: opBudget, Lim: r.limit, Exp: end.Add(24 * time.Hour).Unix(), ResetM: end.Sub(now).Milliseconds(), res: r}
			if needed {
				o.reqN = n
				o.Need = max(0, n-av)
				o.Ask = max(0, l.slowStart(r, target, n, now)+n-av-o.Need)
			} else if refill && target > 0 && av < target/2 {
				o.Ask = target - av
			}
			o.Delta = r.pendBudget[cur]
			delete(r.pendBudget, cur)
			if o.Delta != 0 {
				o.refBud = []budgetRef{{cur, o.Delta}}
			}
			if o.Need == 0 && o.Ask == 0 && o.Delta == 0 && !needed && r.lastRemaining >= 0 {
				continue
			}
			o.Key = keyIdx(l.key(st.id, "budget", rk.scope+":"+cur))
			ops = append(ops, o)
		case kConc:
			// Shrink locally first, so slots we give up cannot be taken
			// while the call is in flight; floor is what Redis must keep.
			want := r.inUse + target
			if r.held > want {
				r.held = want
			}
			r.held = max(r.held, r.inUse)
			o := &op{K: opConc, Lim: r.limit, InUse: r.held, Busy: r.inUse, TTL: l.opts.SlotTTL.Milliseconds(), res: r}
			o.reqN = n
			if needed {
				o.Adm = n
			}
			if needed && r.held-r.inUse < n {
				o.Need = n - (r.held - r.inUse)
			}
			o.Ask = max(0, want-r.held)
			if !needed && !l.concBeatDue(r, now) && !(r.registered && l.closing.Load()) {
				continue
			}
			o.Key = keyIdx(l.key(st.id, "conc", rk.scope))
			o.DKey = keyIdx(l.key(st.id, "concdl", rk.scope))
			o.UKey = keyIdx(l.key(st.id, "concuse", rk.scope))
			ops = append(ops, o)
		}
	}
	return keys, ops
}

func periodEnd(id string) (time.Time, time.Time) {
	if len(id) > 1 && id[0] == 'd' {
		if t, err := time.Parse("20060102", id[1:]); err == nil {
			return t, t.AddDate(0, 0, 1)
		}
	}
	if len(id) > 1 && id[0] == 'm' {
		if t, err := time.Parse("200601", id[1:]); err == nil {
			return t, t.AddDate(0, 1, 0)
		}
	}
	now := time.Now()
	return now, now.AddDate(0, 1, 0)
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

func (st *tenantState) finishPart(l *Limiter, p part, actual int64, local bool, now time.Time) {
	r := p.r
	switch r.k {
	case kConc:
		if r.inUse > 0 {
			r.inUse--
		}
	case kRPM:
	case kTPM:
		if local {
			return
		}
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
	case kBudget:
		cur, _ := r.periodAt(now)
		if local {
			r.outageSpent += actual - p.n
			r.pendBudget[cur] += actual
			return
		}
		delta := actual - p.n
		if delta < 0 {
			refund := -delta
			for i := len(p.uses) - 1; i >= 0 && refund > 0; i-- {
				x := min(refund, p.uses[i].n)
				r.pendBudget[p.uses[i].period] -= x
				refund -= x
			}
		} else if delta > 0 {
			r.expire(now)
			r.pendBudget[cur] += delta - r.takeUpTo(delta)
		}
	}
}
