package gateway

import (
	"context"
	"time"

	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
)

// routeInput is what the routing step needs from a request, whichever
// data plane (HTTP listener or ext_proc) it came in on.
type routeInput struct {
	ep              endpoint
	data            []byte
	id              string // X-Request-Id
	prioHdr, sloHdr string // internal headers, read before they are stripped
	sessionHdr      string // x-session-id, a soft affinity hint
	trusted         bool   // the client authenticated with a configured token
}

// route is the routing step shared by the HTTP proxy and Pick: parse and
// resolve (schedRequest), build the scheduling input (admission.Prompt),
// then admission: schedule, wait or shed (admission.Arrive, Decide,
// Expired). ctx bounds the wait. On success cb.res.Ranked holds the pods
// to try, best first; a refused request returns a *refusal and counts
// nothing (the caller answers and counts it).
func (g *Gateway) route(ctx context.Context, st *state, in routeInput, cb *cycleBuf) (*picker.Request, *poolState, *refusal) {
	req, body, rt, rf := g.schedRequest(st, in.ep, in.data, in.id, in.prioHdr, in.sloHdr, in.trusted)
	if rf != nil {
		return nil, nil, rf
	}
	pool := rt.pool
	req.Session = sessionKey(in.sessionHdr, body)
	req.BlockHashes = cb.hashes
	admission.Prompt(req, body.CacheSalt, body.promptBytes(in.ep))
	cb.hashes = req.BlockHashes

	actx, sp := g.startAdmission(ctx, req, pool)
	d := g.admit(actx, st, pool, req, cb)
	endAdmission(sp, d)
	switch d.Action {
	case admission.Dispatch:
		g.recordScores(st, &cb.res)
		return req, pool, nil
	case admission.Shed:
		g.m.shed.WithLabelValues(req.Model, pool.cfg.Name).Inc()
	}
	return nil, nil, &refusal{model: req.Model, pool: pool.cfg.Name, status: d.Status, code: d.Code,
		reason: d.Message, retryAfter: d.RetryAfter}
}

// admit takes the admission decision for req: on arrival, after
// scheduling, and after waiting if it must wait. It returns Dispatch
// (cb.res holds the ranking), Shed or Fail.
func (g *Gateway) admit(ctx context.Context, st *state, pool *poolState, req *picker.Request, cb *cycleBuf) admission.Decision {
	d := g.arrival(ctx, st, pool, req, cb)
	if d.Action == admission.Wait {
		d = g.waitForCapacity(ctx, st, pool, req, cb)
	}
	return d
}

// arrival is the decision for a request that just arrived: queue behind
// waiters of equal or higher priority, or schedule now and decide.
func (g *Gateway) arrival(ctx context.Context, st *state, pool *poolState, req *picker.Request, cb *cycleBuf) admission.Decision {
	key, keyed := g.sched.HoldKey(req)
	d := admission.Arrive(req, pool.queue.blocked(req, key, keyed))
	if d.Action == admission.Schedule {
		d = admission.Decide(req, g.schedule(ctx, st, pool, req, cb))
		if d.Action == admission.Wait {
			pool.queue.held(key, keyed)
		}
	}
	return d
}

// schedule runs one scheduling cycle on a fresh snapshot of the pool.
func (g *Gateway) schedule(ctx context.Context, st *state, pool *poolState, req *picker.Request, cb *cycleBuf) error {
	sp := g.startSchedule(ctx)
	g.snapshot(st, pool, req, cb)
	err := g.sched.ScheduleInto(&cb.res, req, cb.ptrs)
	endSchedule(sp, &cb.res, err)
	return err
}

// waitForCapacity queues req until a pod of its pool leaves saturation,
// the wait bound for its priority passes (then the scheduler's best pick
// stands: the server queues it) or ctx ends.
func (g *Gateway) waitForCapacity(ctx context.Context, st *state, pool *poolState, req *picker.Request, cb *cycleBuf) admission.Decision {
	maxWait := admission.MaxWait(req, st.cfg.Queue.MaxWait, st.cfg.Queue.CriticalMaxWait)
	q := pool.queue
	order := admission.OrderOf(g.sched.WaitOrder())
	var prefill time.Duration
	if order.Ranked() {
		g.snapshot(st, pool, req, cb)
		prefill = g.sched.PrefillTime(req, cb.ptrs)
	}
	key, keyed := g.sched.HoldKey(req)
	w, ok := q.enter(req.Priority, key, keyed, order, prefill, st.cfg.Queue.MaxLen)
	if !ok {
		// Queue full: the best pod now, as if the wait had run out.
		return admission.Expired(req, g.schedule(ctx, st, pool, req, cb))
	}
	start := time.Now()
	g.m.queueLen.WithLabelValues(pool.cfg.Name).Set(float64(q.len()))
	defer func() {
		q.leave(w)
		g.m.queueLen.WithLabelValues(pool.cfg.Name).Set(float64(q.len()))
		g.m.queueWait.WithLabelValues(pool.cfg.Name).Observe(time.Since(start).Seconds())
		traceQueued(ctx, start)
	}()
	deadline := time.NewTimer(maxWait)
	defer deadline.Stop()
	// Scrapes wake the queue too, but poll in case a pod stops reporting.
	tick := time.NewTicker(max(st.cfg.Scrape.Interval, 10*time.Millisecond))
	defer tick.Stop()
	for {
		if q.myTurn(w) {
			if d := admission.Decide(req, g.schedule(ctx, st, pool, req, cb)); d.Action != admission.Wait {
				return d
			}
			q.heldAgain(w)
		}
		select {
		case <-w.turn:
		case <-tick.C:
			q.poll()
		case <-deadline.C:
			return admission.Expired(req, g.schedule(ctx, st, pool, req, cb))
		case <-ctx.Done():
			return admission.Decide(req, ctx.Err())
		}
	}
}
