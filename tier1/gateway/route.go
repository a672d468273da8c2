package gateway

import (
	"context"
	"errors"
	"net"
	"syscall"
	"time"

	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/scrape"
)

// route is the routing step of the request lifecycle, the same for both
// front ends: parse and resolve (schedreq.go), build the scheduling input
// (admission.Prompt), then admission: schedule, wait or shed
// (admission.Arrive, Decide, Expired). ctx bounds the wait. On success
// c.req and c.pool are set and c.cb.res.Ranked holds the pods to try, best
// first; a refused request returns a *refusal and counts nothing (the
// front end answers and counts it).
func (c *call) route(ctx context.Context) *refusal {
	c.cb = cycleBufs.Get().(*cycleBuf)
	body, rf := c.parse()
	if rf != nil {
		return rf
	}
	req, pool := c.req, c.pool
	req.Session = sessionKey(c.sessionHdr, body)
	req.BlockHashes = c.cb.hashes
	admission.Prompt(req, body.CacheSalt, body.promptBytes(c.ep))
	c.cb.hashes = req.BlockHashes
	c.exactPrompt(body) // exact token hashes, with kv_events on (kvroute.go)

	actx, sp := c.g.startAdmission(ctx, req, pool)
	d := c.admit(actx)
	endAdmission(sp, d)
	c.recordDecision(d)
	switch d.Action {
	case admission.Dispatch:
		c.recordScores()
		return nil
	case admission.Shed:
		c.g.m.shed.WithLabelValues(req.Model, pool.cfg.Name).Inc()
	}
	return &refusal{model: req.Model, pool: pool.cfg.Name, status: d.Status, code: d.Code,
		reason: c.refusalReason(d), retryAfter: d.RetryAfter}
}

// ranked is the pods to try, best first, at most retry.max_attempts.
func (c *call) ranked() []*picker.Pod {
	r := c.cb.res.Ranked
	return r[:min(c.st.cfg.Retry.MaxAttempts, len(r))]
}

// admit takes the admission decision: on arrival, after scheduling, and
// after waiting if it must wait. It returns Dispatch (c.cb.res holds the
// ranking), Shed or Fail.
func (c *call) admit(ctx context.Context) admission.Decision {
	d := c.arrival(ctx)
	if d.Action == admission.Wait {
		d = c.waitForCapacity(ctx)
	}
	return d
}

// arrival is the decision for a request that just arrived: queue behind
// waiters of equal or higher priority, or schedule now and decide.
func (c *call) arrival(ctx context.Context) admission.Decision {
	key, keyed := c.g.sched.HoldKey(c.req)
	d := admission.Arrive(c.req, c.pool.queue.blocked(c.req, key, keyed))
	if d.Action == admission.Schedule {
		d = admission.Decide(c.req, c.schedule(ctx))
		if d.Action == admission.Wait {
			c.pool.queue.held(key, keyed)
		}
	}
	return d
}

// schedule runs one scheduling cycle on a fresh snapshot of the pool.
func (c *call) schedule(ctx context.Context) error {
	sp := c.g.startSchedule(ctx)
	c.cycles++
	c.snapshot()
	err := c.g.sched.ScheduleInto(&c.cb.res, c.req, c.cb.ptrs)
	endSchedule(sp, &c.cb.res, err)
	return err
}

// waitForCapacity queues the request until a pod of its pool leaves
// saturation, the wait bound for its priority passes (then the scheduler's
// best pick stands: the server queues it) or ctx ends.
func (c *call) waitForCapacity(ctx context.Context) admission.Decision {
	g, cfg, req := c.g, c.st.cfg, c.req
	maxWait := admission.MaxWait(req, cfg.Queue.MaxWait, cfg.Queue.CriticalMaxWait)
	q := c.pool.queue
	key, keyed := g.sched.HoldKey(req)
	w, ok := q.enter(req.Priority, key, keyed, cfg.Queue.MaxLen)
	if !ok {
		// Queue full: the best pod now, as if the wait had run out.
		c.wait.how |= howQueueFull
		return admission.Expired(req, c.schedule(ctx))
	}
	c.wait.since, c.wait.how = w.since, c.wait.how|howQueued
	start := time.Now()
	pool := c.pool.cfg.Name
	g.m.queueLen.WithLabelValues(pool).Set(float64(q.len()))
	defer func() {
		q.leave(w)
		g.m.queueLen.WithLabelValues(pool).Set(float64(q.len()))
		g.m.queueWait.WithLabelValues(pool).Observe(time.Since(start).Seconds())
		traceQueued(ctx, start)
	}()
	deadline := time.NewTimer(maxWait)
	defer deadline.Stop()
	// Scrapes wake the queue too, but poll in case a pod stops reporting.
	tick := time.NewTicker(max(cfg.Scrape.Interval, 10*time.Millisecond))
	defer tick.Stop()
	for {
		if q.myTurn(w) {
			if d := admission.Decide(req, c.schedule(ctx)); d.Action != admission.Wait {
				return d
			}
			q.heldAgain(w)
		}
		select {
		case <-w.turn:
		case <-tick.C:
			q.poll()
		case <-deadline.C:
			c.wait.how |= howExpired
			return admission.Expired(req, c.schedule(ctx))
		case <-ctx.Done():
			return admission.Decide(req, ctx.Err())
		}
	}
}

// connectFailed keeps the scheduler off a pod that could not be reached
// (refused, or no connection at all) until the scraper can tell: at
// least 250ms, or four scrape intervals.
func (c *call) connectFailed(pod string, err error) {
	var oe *net.OpError
	if !errors.Is(err, syscall.ECONNREFUSED) && (!errors.As(err, &oe) || oe.Op != "dial") {
		return
	}
	if rt := c.st.pods[pod]; rt != nil {
		rt.downUntil.Store(time.Now().Add(max(4*c.st.cfg.Scrape.Interval, 250*time.Millisecond)).UnixNano())
	}
}

// resolve maps a model name to its pool: a pool's base model, an adapter
// named in config, or an adapter a pod lists in /v1/models with the pool's
// model as parent.
func (c *call) resolve(model string) (route, bool) {
	if rt, ok := c.st.routes[model]; ok {
		return rt, true
	}
	if pool, ok := c.g.adapterIndex(c.st).byName[model]; ok {
		return route{pool: pool, adapter: model}, true
	}
	return route{}, false
}

// adapterIndex is the adapters discovered from pods' /v1/models.
type adapterIndex struct {
	at     time.Time
	st     *state
	byName map[string]*poolState
}

// adapterIndex returns the discovered adapters, rebuilt at most every
// 250ms (it scans every pod's model list).
func (g *Gateway) adapterIndex(st *state) *adapterIndex {
	idx := g.adapters.Load()
	if idx != nil && idx.st == st && time.Since(idx.at) < 250*time.Millisecond {
		return idx
	}
	g.adaptMu.Lock()
	defer g.adaptMu.Unlock()
	if idx = g.adapters.Load(); idx != nil && idx.st == st && time.Since(idx.at) < 250*time.Millisecond {
		return idx
	}
	idx = &adapterIndex{at: time.Now(), st: st, byName: map[string]*poolState{}}
	for _, ps := range st.poolList {
		for _, rt := range ps.pods {
			ps0, ok := g.scraper.Get(rt.cfg.Name)
			if !ok {
				continue
			}
			for _, m := range ps0.Models {
				if m.Parent == ps.cfg.Model && m.ID != ps.cfg.Model {
					if _, static := st.routes[m.ID]; !static {
						idx.byName[m.ID] = ps
					}
				}
			}
		}
	}
	g.adapters.Store(idx)
	return idx
}

// snapshot fills c.cb with the current state of the pool's pods.
func (c *call) snapshot() {
	g, pool, cb := c.g, c.pool, c.cb
	n := len(pool.pods)
	if cap(cb.pods) < n {
		cb.pods = make([]picker.Pod, n)
	}
	cb.pods = cb.pods[:n]
	cb.ptrs = cb.ptrs[:0]
	now := time.Now()
	// A pod listing its models but not this adapter cannot serve it; only
	// filter on that when some pod does list it (adapters may also be
	// loaded on demand).
	adapter := c.req.Adapter
	adapterListed := false
	if adapter != "" {
		for _, rt := range pool.pods {
			if ps, ok := g.scraper.Get(rt.cfg.Name); ok && ps.Serves(adapter) {
				adapterListed = true
				break
			}
		}
	}
	for i, rt := range pool.pods {
		p := &cb.pods[i]
		ps := g.fillPod(p, c.st, pool, rt, now)
		if ps == nil || (adapterListed && ps.Models != nil && !ps.Serves(adapter)) {
			continue
		}
		cb.ptrs = append(cb.ptrs, p)
	}
	g.tracker.Apply(cb.ptrs)
}

// fillPod sets p to the router's view of one pod and returns its scraped
// state (nil if the scraper does not know it yet).
func (g *Gateway) fillPod(p *picker.Pod, st *state, pool *poolState, rt *podRT, now time.Time) *scrape.PodState {
	*p = picker.Pod{
		Name:       rt.cfg.Name,
		Address:    rt.cfg.Address,
		Pool:       pool.cfg.Name,
		BaseModel:  pool.cfg.Model,
		Engine:     rt.cfg.Engine,
		GPU:        rt.cfg.GPU,
		GPUs:       rt.cfg.GPUs,
		Labels:     rt.cfg.Labels,
		MetricsAge: time.Hour, // never scraped
	}
	ps, ok := g.scraper.Get(rt.cfg.Name)
	if !ok {
		return nil
	}
	p.Engine = ps.Engine
	p.Metrics = ps.Metrics
	if !ps.LastSuccess.IsZero() {
		p.MetricsAge = ps.MetricsAge(now) // an idle pod scraped on its slower schedule is not stale
		p.Ready = ps.ConsecutiveFailures < st.cfg.Scrape.UnreadyAfter && now.UnixNano() >= rt.downUntil.Load()
	}
	return ps
}

// recordScores keeps each candidate's scores for /debug/pods and exports
// the chosen pod's.
func (c *call) recordScores() {
	res := &c.cb.res
	if len(res.Ranked) == 0 {
		return
	}
	now := time.Now()
	chosen := res.Ranked[0]
	for i, p := range res.Candidates {
		rt := c.st.pods[p.Name]
		if rt == nil {
			continue
		}
		rt.mu.Lock()
		ls := &rt.scores
		ls.At, ls.Picked, ls.Total, ls.Scorers = now, p == chosen, res.Total[i], res.Scorers
		ls.Scores = ls.Scores[:0]
		for s := range res.Scorers {
			ls.Scores = append(ls.Scores, res.Scores[s][i])
		}
		rt.mu.Unlock()
		if p == chosen {
			for s, name := range res.Scorers {
				c.g.m.scores.WithLabelValues(p.Pool, name).Observe(res.Scores[s][i])
			}
		}
	}
}
