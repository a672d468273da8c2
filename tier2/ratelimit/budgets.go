package ratelimit

import (
	"time"

	"github.com/infergate/infergate/tier2/tenant"
)

// budget is a day or month token budget's own state: its period and the
// refunds and charges on their way back to Redis, by period.
type budget struct {
	period     string           // "day" or "month"
	pendBudget map[string]int64 // period id -> delta to apply

	perID, perKind   string // periodAt cache
	perStart, perEnd time.Time

	lastRemaining int64 // -1 unknown
	outageSpent   int64 // spent locally while Redis is down
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

// budgetOps adds r's ops to c: refunds to earlier periods, each its own op
// (its own key), then the current period's need, lease and refunds.
func (l *Limiter) budgetOps(c *call, r *resource, d demand, now time.Time) {
	cur, end := r.periodAt(now)
	o := &op{K: opBudget, Lim: r.limit, Exp: end.Add(24 * time.Hour).Unix(), ResetM: end.Sub(now).Milliseconds(), res: r}
	l.leaseAsk(o, r, d, now)
	for p, v := range r.pendBudget {
		if p == cur || v == 0 {
			continue
		}
		_, pend := periodEnd(p)
		c.ops = append(c.ops, &op{K: opBudget, Key: c.key(l, "budget", r.scope+":"+p), Lim: r.limit, Delta: v,
			Exp: pend.Add(24 * time.Hour).Unix(), res: r, refBud: []budgetRef{{p, v}}, other: true})
		delete(r.pendBudget, p)
	}
	o.Delta = r.pendBudget[cur]
	delete(r.pendBudget, cur)
	if o.Delta != 0 {
		o.refBud = []budgetRef{{cur, o.Delta}}
	}
	if o.Need == 0 && o.Ask == 0 && o.Delta == 0 && !d.needed && r.lastRemaining >= 0 {
		return
	}
	o.Key = c.key(l, "budget", r.scope+":"+cur)
	c.ops = append(c.ops, o)
}

// settleBudget refunds the unused part of an estimate to the periods it
// was taken from, or charges the excess to the current one. A request
// admitted during an outage (local) charges all it used.
func (r *resource) settleBudget(p part, actual int64, local bool, now time.Time) {
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
