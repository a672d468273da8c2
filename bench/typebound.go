package bench

import (
	"context"
	"fmt"
	"math"
	"sort"

	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/workload"
	"github.com/infergate/infergate/sim/engine"
)

// TypedQueueBoundP99 is QueueBoundP99 for a fleet of several pod types:
// a lower bound in ms on the P99 TTFT that holds for every placement and
// every order of service, never below QueueBoundP99's and equal to it on
// a fleet of one pod type.
//
// The argument adds one fact to the capacity bound's: a request can have
// TTFT below x only on a pod type whose solo time for it is below x. The
// solo time on type t is a lower bound on its prefill there, alone, with
// the cache QueueBoundP99's work measure grants it (every block some other
// request arriving before its deadline holds): with u tokens to compute
// after c cached, at least ⌈u/B⌉ steps of at most B tokens each, so at
// least perFlop·FLOPs(u, c) + comm·u + ⌈u/B⌉·over of the type's nominal
// seconds (costModel.step without its memory term and per-sequence cost),
// times the fastest speed factor among the type's pods, jitter at its mean
// of one as QueueBoundP99 takes it. Let F(i) be the types where that is
// below x. If request i is fast, it is served by a pod of F(i), so for
// every set T of pod types, the fast requests arriving in [s, e] with
// F(i) ⊆ T have all their prefill done by T's pods inside [s, e+x]: their
// work fits in rate(T)·(e−s+x), rate(T) counting T's pods as
// fleetPrefillCapacity counts the whole fleet. The fewest largest of them
// covering the excess are slow. Each window takes the best T (with T the
// whole fleet this is QueueBoundP99's count); disjoint windows add, and
// the P99 follows as in p99Bound. A request with no type fast enough
// (F(i) empty) is given every type: whether it is slow at all is left to
// its floor, so a fleet of one type gets exactly QueueBoundP99. Context
// limits, adapters and decode are not counted (all on the safe side).
func TypedQueueBoundP99(ctx context.Context, f scenario.Fleet, stream workload.Stream, causal []float64, seed uint64) (float64, error) {
	b, err := newFleetBound(ctx, "typed queue bound", f, stream, causal, seed)
	if err != nil {
		return 0, err
	}
	return p99Bound(b.floor, b.slowTyped), nil
}

// typeCapacity is one pod type of the fleet: its step terms and token
// budget, the speed factor of its fastest pod (a time multiplier) and its
// pods' rate in reference seconds of work per second.
type typeCapacity struct {
	key    string
	terms  podTerms
	budget int
	speed  float64
	rate   float64
}

// typeOf returns g's pod type in fc.types (as podTypes keys it), added
// if new. The pointer is valid until the next call.
func (fc *fleetCapacity) typeOf(g scenario.PodGroup, cfg engine.Config) *typeCapacity {
	key := fmt.Sprintf("%s/%d/%d", g.GPU, g.TensorParallel, g.MaxNumSeqs)
	for k := range fc.types {
		if fc.types[k].key == key {
			return &fc.types[k]
		}
	}
	fc.types = append(fc.types, typeCapacity{key: key, terms: stepTerms(cfg), budget: max(cfg.MaxBatchedTokens, 1), speed: math.Inf(1)})
	return &fc.types[len(fc.types)-1]
}

// solo is the least time, in seconds, a pod of the type takes to compute
// u tokens of FLOPs model FLOPs alone.
func (t typeCapacity) solo(flops, u float64) float64 {
	steps := math.Ceil(u / float64(t.budget))
	return t.speed * (t.terms.perFlop*flops + t.terms.comm*u + steps*t.terms.over)
}

// uncached is request i's tokens to compute and tokens cached if it must
// have its first token within x seconds, as work counts them.
func (b *boundInput) uncached(i int, x float64) (u, c float64) {
	deadline := b.arrival[i] + x
	cached := 0
	for _, h := range b.hashes[i] {
		v := b.first[h]
		o := v[0]
		if o.req == i {
			o = v[1]
		}
		if !(o.at < deadline) {
			break
		}
		cached++
	}
	n := b.tokens[i]
	k := min(cached*workload.BlockSize, n-1)
	return float64(n - k), float64(k)
}

// fastTypes is the set of pod types (bit k: b.cap.types[k]) on which
// request i can have TTFT below x, every type if none, and its work.
func (b *boundInput) fastTypes(i int, x float64) (mask int, work float64) {
	u, c := b.uncached(i, x)
	fl := b.cap.flops(u, c)
	for k, t := range b.cap.types {
		if t.solo(fl, u) < x {
			mask |= 1 << k
		}
	}
	if mask == 0 {
		mask = 1<<len(b.cap.types) - 1
	}
	return mask, b.cap.ref.seconds(fl, u)
}

// slowTyped is slow (without decode) with each window's excess taken
// over the best set of pod types.
func (b *boundInput) slowTyped(x float64) int {
	types := b.cap.types
	all := 1<<len(types) - 1
	if len(types) == 0 {
		all = 1
	}
	certain := 0
	var idx, mask []int
	var w []float64
	for i := range b.arrival {
		switch {
		case math.IsNaN(b.floor[i]):
		case b.floor[i] >= x:
			certain++
		default:
			m, v := b.fastTypes(i, x)
			idx, mask, w = append(idx, i), append(mask, m), append(w, v)
		}
	}
	// rate[T] for every non-empty set T of types.
	rate := make([]float64, all+1)
	for T := 1; T <= all; T++ {
		if len(types) == 0 {
			rate[T] = b.cap.rate
			continue
		}
		for k, t := range types {
			if T&(1<<k) != 0 {
				rate[T] += t.rate
			}
		}
	}
	m := len(idx)
	best := make([]int, m+1)
	cand := make([]int, m+1)
	sorted := make([][]float64, all+1)
	sum := make([]float64, all+1)
	for s := range m {
		if s > 0 {
			best[s] = max(best[s-1], cand[s])
		}
		for T := range sorted {
			sorted[T], sum[T] = sorted[T][:0], 0
		}
		start := b.arrival[idx[s]]
		for e := s; e < m && e-s < maxWindow; e++ {
			v := w[e]
			span := b.arrival[idx[e]] - start + x
			cnt := 0
			for T := 1; T <= all; T++ {
				if mask[e]&^T != 0 {
					continue // e may be fast outside T: not T's work
				}
				st := sorted[T]
				p := sort.SearchFloat64s(st, v)
				st = append(st, 0)
				copy(st[p+1:], st[p:])
				st[p] = v
				sorted[T] = st
				sum[T] += v
				c := 0
				for r := sum[T]; r > rate[T]*span && c < len(st); c++ {
					r -= st[len(st)-1-c]
				}
				cnt = max(cnt, c)
			}
			// A set T that e does not join is counted where it was
			// last extended: the same requests over a shorter span, and
			// an earlier end serves the disjoint-window sum no worse.
			if cnt > 0 {
				cand[e+1] = max(cand[e+1], best[s]+cnt)
			}
		}
	}
	if m > 0 {
		best[m] = max(best[m-1], cand[m])
	}
	return certain + best[m]
}
