package ratelimit

import "time"

// slots is a concurrency limit's own state: slots this replica holds in
// Redis (held) and how many of them requests use (inUse).
type slots struct {
	inUse, held int64
	registered  bool
	lastBeat    time.Time
}

func (l *Limiter) concBeatDue(r *resource, now time.Time) bool {
	target := r.inUse + l.leaseTarget(r)
	if r.held > target || r.inUse > r.held {
		return true
	}
	return (r.held > 0 || r.registered) && now.Sub(r.lastBeat) >= l.opts.SlotTTL/3
}

// concOp adds r's op to c: the slots this replica holds (its heartbeat),
// the admission's slot and spare slots to hold.
func (l *Limiter) concOp(c *call, r *resource, d demand, now time.Time) {
	// Shrink locally first, so slots we give up cannot be taken while the
	// call is in flight; the floor is what Redis must keep.
	want := r.inUse + l.leaseTarget(r)
	if r.held > want {
		r.held = want
	}
	r.held = max(r.held, r.inUse)
	o := &op{K: opConc, Lim: r.limit, InUse: r.held, Busy: r.inUse, TTL: l.opts.SlotTTL.Milliseconds(), res: r}
	o.reqN = d.n
	if d.needed {
		o.Adm = d.n
	}
	if d.needed && r.held-r.inUse < d.n {
		o.Need = d.n - (r.held - r.inUse)
	}
	o.Ask = max(0, want-r.held)
	if !d.needed && !l.concBeatDue(r, now) && !(r.registered && l.closing.Load()) {
		return
	}
	o.Key = c.key(l, "conc", r.scope)
	o.DKey = c.key(l, "concdl", r.scope)
	o.UKey = c.key(l, "concuse", r.scope)
	c.ops = append(c.ops, o)
}
