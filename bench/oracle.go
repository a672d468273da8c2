package bench

import (
	"math"
	"time"

	"github.com/infergate/infergate/sim/engine"
)

// PolicyOracleGreedy is a reference, not a router: it sends each request
// at once to the pod where it gets its first token soonest, knowing what
// no router can: every pod's exact queue, cache, LoRA slots and step
// jitter (it clones each pod's engine and runs the copy until the
// request's first token). It does not know future arrivals, and it does
// not hold requests. It measures how far perfect knowledge of the present
// takes a greedy per-request choice; what it leaves over the floors needs
// knowledge of the future, a different order of service, or both.
const PolicyOracleGreedy = "oracle-greedy"

// oraclePick is the pod where request i, sent at now, gets its first token
// soonest (ties to the lowest index; with step jitter they are rare).
func (s *sim) oraclePick(now time.Duration, i int) int {
	r := engineRequest(s.states[i].w)
	best, bestAt := 0, time.Duration(math.MaxInt64)
	for k, p := range s.pods {
		if at, ok := firstTokenIf(p.eng, now, r); ok && at < bestAt {
			best, bestAt = k, at
		}
	}
	return best
}

// firstTokenIf is when r's first token would come if r were submitted to
// e at now and nothing else arrived: e is cloned, not changed, and r may
// be asked again of another engine (its OnFirstToken is replaced). ok is
// false if e would reject r or never serve it.
func firstTokenIf(e *engine.Engine, now time.Duration, r *engine.Request) (at time.Duration, ok bool) {
	c := e.Clone()
	c.Advance(now)
	r.OnFirstToken = func(t time.Duration) { at, ok = t, true }
	if c.Submit(now, r) != nil {
		return 0, false
	}
	for !ok {
		next, more := c.NextEventTime()
		if !more {
			break
		}
		c.Advance(next)
	}
	return at, ok
}
