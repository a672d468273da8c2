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

// QueueBoundP99 returns, in milliseconds, a lower bound on the P99 TTFT
// (linear interpolation, as report and p99) that holds for every
// placement and every order of service: unlike Floors and CausalFloors it
// counts queueing, from the fleet's prefill capacity alone.
//
// The argument: a request with TTFT below x arriving in [s, e] has all of
// its prefill done inside [s, e+x]. The fleet computes at most R·(e−s+x)
// of prefill work in that interval (R: its aggregate peak prefill rate),
// so if the requests arriving in [s, e] bring more work than that, the
// ones that do not make it (at least the fewest, largest, whose work
// covers the excess) have TTFT ≥ x. Requests whose causal floor is ≥ x
// have it regardless. Counts from disjoint sets of requests add, so the
// bound is the largest x for which the best set of disjoint arrival
// windows gives at least as many requests with TTFT ≥ x as the P99 needs
// (the 1% and one).
//
// Work is counted low: a request computes only the tokens not found in
// the prompt of any other request arriving before its deadline (Floors'
// never-evicting cache, and no earlier than that request's arrival), at
// least one token; its time is the step cost model's compute term for
// them (linear and attention FLOPs at the pod's MFU) plus tensor-parallel
// communication and one step overhead per full token budget, and nothing
// for the memory term, decode, per-sequence costs, adapters or
// preemption. Pod speed factors are the run's (seed, DefaultVariation);
// step jitter is taken at its mean of one.
func QueueBoundP99(ctx context.Context, f scenario.Fleet, stream workload.Stream, causal []float64, seed uint64) (float64, error) {
	b, err := newFleetBound(ctx, "queue bound", f, stream, causal, seed)
	if err != nil {
		return 0, err
	}
	return b.p99(), nil
}

// newFleetBound is what every queue bound starts from: the floors checked
// against the stream, the fleet's prefill capacity at this run's pod
// speeds, and the stream indexed by block (newBoundInput). what names the
// bound in errors.
func newFleetBound(ctx context.Context, what string, f scenario.Fleet, stream workload.Stream, causal []float64, seed uint64) (*boundInput, error) {
	if len(causal) != len(stream.Requests) {
		return nil, fmt.Errorf("%s: %d floors for %d requests", what, len(causal), len(stream.Requests))
	}
	fc, err := fleetPrefillCapacity(f, seed, engine.DefaultVariation().PodSpread)
	if err != nil {
		return nil, err
	}
	b := newBoundInput(stream, causal, fc)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return b, nil
}

// prefillCost is one pod type's cost of prefill work: seconds per model
// FLOP and per token, at nominal speed.
type prefillCost struct {
	perFlop, perToken float64
}

func (c prefillCost) seconds(flops, tokens float64) float64 {
	return c.perFlop*flops + c.perToken*tokens
}

// fleetCapacity holds the model's FLOP coefficients, the reference pod
// type's cost (the first group's) and the fleet's rate in reference
// seconds of work per second.
type fleetCapacity struct {
	linear, attn float64 // FLOPs per token and per (query, key) pair, whole model
	ref          prefillCost
	rate         float64
	// types is the fleet per pod type (typebound.go).
	types []typeCapacity
}

// flops is the model FLOPs of computing u tokens after c cached ones.
func (fc fleetCapacity) flops(u, c float64) float64 {
	return fc.linear*u + fc.attn*(u*c+u*(u+1)/2)
}

func fleetPrefillCapacity(f scenario.Fleet, seed uint64, spread float64) (fleetCapacity, error) {
	f.SetDefaults()
	var fc fleetCapacity
	pod := 0
	for gi, g := range f.Pods {
		e, err := podEngine(f, g)
		if err != nil {
			return fc, fmt.Errorf("queue bound: %w", err)
		}
		cfg := e.Config()
		m := cfg.Model
		c := podPrefillCost(cfg)
		if gi == 0 {
			fc.linear = 2 * m.ActiveParams
			fc.attn = 4 * float64(m.Layers) * float64(m.Heads) * float64(m.HeadDim)
			fc.ref = c
		}
		// Reference seconds this type does per own second, at most.
		ratio := math.Max(fc.ref.perFlop/c.perFlop, fc.ref.perToken/c.perToken)
		tc := fc.typeOf(g, cfg)
		for range g.Count {
			sp := engine.PodSpeedFactor(seed, pod, spread)
			fc.rate += ratio / sp
			tc.rate += ratio / sp
			tc.speed = math.Min(tc.speed, sp)
			pod++
		}
	}
	if fc.rate <= 0 {
		return fc, fmt.Errorf("queue bound: empty fleet")
	}
	return fc, nil
}

// podTerms is one pod type's step cost model as the bounds read it, in
// nominal seconds: perFlop per whole-model FLOP, comm per token of
// tensor-parallel all-reduce, over per step (overhead and all-reduce
// latency).
type podTerms struct {
	perFlop, comm, over float64
}

func stepTerms(cfg engine.Config) podTerms {
	m, gpu, tp := cfg.Model, cfg.GPU, float64(max(cfg.TensorParallel, 1))
	t := podTerms{perFlop: 1 / (tp * gpu.BF16FLOPS * cfg.MFU), over: cfg.StepOverhead.Seconds()}
	if tp > 1 && gpu.LinkBandwidth > 0 {
		perLayer := 2 * (tp - 1) / tp * float64(m.Hidden) * 2 / gpu.LinkBandwidth
		t.comm = 2 * float64(m.Layers) * perLayer
		t.over += 2 * float64(m.Layers) * gpu.LinkLatencySeconds
	}
	return t
}

// podPrefillCost is a resolved config's prefill cost. A step computes at
// most MaxBatchedTokens tokens and pays the overhead once, so a token
// costs at least its share of it.
func podPrefillCost(cfg engine.Config) prefillCost {
	t := stepTerms(cfg)
	return prefillCost{perFlop: t.perFlop, perToken: t.comm + t.over/float64(cfg.MaxBatchedTokens)}
}

// boundInput is the stream reduced to what the bound needs, arrivals and
// times in seconds.
type boundInput struct {
	arrival []float64
	floor   []float64 // causal floor; NaN: not served, left out
	tokens  []int
	hashes  [][]uint64
	// first[h]: the two earliest (arrival, request) holding block h.
	first map[uint64][2]holder
	cap   fleetCapacity
	// out is each request's output tokens and dec what a decoding request
	// costs the fleet (zero: nothing, the capacity bound alone).
	out []int
	dec decodeCharge
}

type holder struct {
	at  float64
	req int
}

func newBoundInput(stream workload.Stream, causal []float64, fc fleetCapacity) *boundInput {
	b := &boundInput{first: map[uint64][2]holder{}, cap: fc}
	none := holder{at: math.Inf(1), req: -1}
	for i := range stream.Requests {
		w := &stream.Requests[i]
		a := w.Arrival.Seconds()
		b.arrival = append(b.arrival, a)
		b.floor = append(b.floor, causal[i]/1000)
		b.tokens = append(b.tokens, w.PromptTokens)
		b.out = append(b.out, w.OutputTokens)
		b.hashes = append(b.hashes, w.BlockHashes)
		for _, h := range w.BlockHashes {
			v, ok := b.first[h]
			if !ok {
				v = [2]holder{none, none}
			}
			switch {
			case v[0].req == i || v[1].req == i:
			case a < v[0].at:
				v = [2]holder{{a, i}, v[0]}
			case a < v[1].at:
				v[1] = holder{a, i}
			}
			b.first[h] = v
		}
	}
	return b
}

// work is request i's prefill work in reference seconds if it must have
// its first token within x seconds: its prompt after the longest prefix
// some other request arriving before arrival+x holds.
func (b *boundInput) work(i int, x float64) float64 {
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
	c := min(cached*workload.BlockSize, n-1)
	u := float64(n - c)
	return b.cap.ref.seconds(b.cap.flops(u, float64(c)), u)
}

// p99 bounds the interpolated P99 s[lo] + f·(s[lo+1] − s[lo]) (s sorted,
// lo + f = 0.99(n−1)) by bounding each order statistic: s[lo] ≥ x as soon
// as n−lo requests have TTFT ≥ x, s[lo+1] as soon as n−lo−1 do.
func (b *boundInput) p99() float64 { return p99Bound(b.floor, b.slow) }

// p99Bound is that bound in ms given per-request floors in seconds (NaN:
// left out) and slow(x), a count of requests with TTFT ≥ x in every
// schedule.
func p99Bound(floor []float64, slow func(x float64) int) float64 {
	var fl []float64
	for _, v := range floor {
		if !math.IsNaN(v) {
			fl = append(fl, v)
		}
	}
	n := len(fl)
	if n == 0 {
		return math.NaN()
	}
	sort.Float64s(fl)
	r := 0.99 * float64(n-1)
	lo := int(r)
	v := order(n-lo, fl[lo], slow)
	if lo+1 < n {
		v += (r - float64(lo)) * (order(n-lo-1, fl[lo+1], slow) - v)
	}
	return v * 1000
}

// order is the largest x (to 0.1 ms) with slow(x) ≥ k, found by
// bisection from start, which the floors alone already prove (slow does
// not grow with x).
func order(k int, start float64, slow func(x float64) int) float64 {
	lo, hi := start, start+1
	for slow(hi) >= k {
		lo, hi = hi, 2*hi+1
	}
	for hi-lo > 1e-4 {
		mid := (lo + hi) / 2
		if slow(mid) >= k {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// maxWindow caps the requests in one arrival window; longer windows are
// rarely needed (a busy period is a few hundred requests) and cost
// quadratic time.
const maxWindow = 1500

// slow is the number of requests that have TTFT ≥ x in every schedule,
// as far as the capacity argument shows: those whose floor is ≥ x plus,
// over the best disjoint arrival windows, the fewest requests whose work
// covers the window's excess.
func (b *boundInput) slow(x float64) int {
	n := len(b.arrival)
	certain := 0
	var idx []int // requests that might make it
	for i := range n {
		switch {
		case math.IsNaN(b.floor[i]):
		case b.floor[i] >= x:
			certain++
		default:
			idx = append(idx, i)
		}
	}
	w := make([]float64, len(idx))
	// run[k]: how long past a+x request idx[k] surely keeps decoding if it
	// is fast (decodebound.go).
	run := make([]float64, len(idx))
	for k, i := range idx {
		w[k] = b.work(i, x)
		run[k] = b.dec.running(b.floor[i], b.out[i], x)
	}
	// best[j]: most slow requests among idx[:j] from disjoint windows.
	m := len(idx)
	best := make([]int, m+1)
	cand := make([]int, m+1)
	sorted := make([]float64, 0, maxWindow)
	for s := range m {
		if s > 0 {
			best[s] = max(best[s-1], cand[s])
		}
		sorted = sorted[:0]
		sum := 0.0
		start := b.arrival[idx[s]]
		var dr decodeRun
		for e := s; e < m && e-s < maxWindow; e++ {
			v := w[e]
			p := sort.SearchFloat64s(sorted, v)
			sorted = append(sorted, 0)
			copy(sorted[p+1:], sorted[p:])
			sorted[p] = v
			sum += v
			// With decode counted (DecodeBoundP99), the fast requests'
			// work plus σ times the time they surely decode inside the
			// window fits in rate·span. dr.total is that time with every
			// request fast; c slow requests take back at most the c
			// largest works and the c largest decoding times.
			budget := b.cap.rate * (b.arrival[idx[e]] - start + x)
			cnt := 0
			if b.dec.sigma > 0 {
				dr.add(b.arrival[idx[e]], run[e])
				next, back := dr.top(), 0.0
				for r := sum; r > budget-b.dec.sigma*(dr.total-back) && cnt < len(sorted); cnt++ {
					r -= sorted[len(sorted)-1-cnt]
					back += next()
				}
			} else {
				for r := sum; r > budget && cnt < len(sorted); cnt++ {
					r -= sorted[len(sorted)-1-cnt]
				}
			}
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

// greedySlow counts the late requests (TTFT ≥ x) of one schedule on the
// pooled fleet the capacity bound reasons about: one machine doing rate
// seconds of work per second, serving requests first come, first served
// (their deadlines, arrival + x, come in the same order), and, whenever
// the newest request would be late, dropping the largest request of the
// current busy period (Moore and Hodgson's rule, with release times);
// requests whose causal floor is ≥ x are late anyway. The schedule is
// feasible, so the pooled optimum has at most this many late requests and
// slow(x), a lower bound on it, must never exceed it. Where the two are
// equal slow(x) is the pooled optimum itself: no argument that treats the
// fleet as one machine can raise the bound. Decode is not charged.
func (b *boundInput) greedySlow(x float64) int {
	late := 0
	type job struct {
		at, secs float64
		in       bool
	}
	var period []job // the current busy period's requests
	end := math.Inf(-1)
	for i := range b.arrival {
		switch {
		case math.IsNaN(b.floor[i]):
			continue
		case b.floor[i] >= x:
			late++
			continue
		}
		a := b.arrival[i]
		if a >= end {
			period, end = period[:0], a
		}
		w := b.work(i, x) / b.cap.rate
		period = append(period, job{a, w, true})
		end += w
		if end <= a+x {
			continue
		}
		k := -1
		for j := range period {
			if period[j].in && (k < 0 || period[j].secs > period[k].secs) {
				k = j
			}
		}
		period[k].in = false
		late++
		end = period[0].at
		for _, j := range period {
			if j.in {
				end = math.Max(end, j.at) + j.secs
			}
		}
	}
	return late
}
